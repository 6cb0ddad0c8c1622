"""The lab's benchmark (``benchmarks/bench_lab_latency.py``) runs at its tiny size, on a lab this
session started: the benchmark drives the lab's own daemons, so it belongs under the ``labs``
session fixture, which starts a lab that a reboot left stopped. What it prints is checked for
shape, never for a timing (tests/unit/test_benchmarks_smoke.py holds the other benchmarks).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from labtools import REPO, Lab

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    from results import SMOKE_ARGS, run_smoke
finally:
    sys.path.remove(str(REPO / "benchmarks"))

SCRIPT = "bench_lab_latency.py"
PG_SCRIPT = REPO / "share" / "testlab" / "pg"
#: The lab the benchmark runs on by default (its ``--version``).
VERSION = "24.11"
#: Longest the tiny run may take, in seconds (two jobs, a ship and collect loop: about 30 s).
TIMEOUT_S = 300.0


def test_lab_latency_benchmark_runs_at_a_tiny_size(labs: dict[str, Lab]) -> None:
    assert VERSION in labs
    pg = subprocess.run(
        [str(PG_SCRIPT), "start", VERSION], capture_output=True, text=True, check=False
    )
    if pg.returncode != 0:
        pytest.fail(f"share/testlab/pg start failed:\n{pg.stdout}\n{pg.stderr}")
    proc = run_smoke(SCRIPT, TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr[-2000:]
    result = json.loads(lines[-1])
    assert isinstance(result, dict), proc.stdout[-2000:]
    # Each job's records went node -> PostgreSQL -> store within the benchmark's wait.
    assert result["jobs"] == int(SMOKE_ARGS[SCRIPT][1]), result
    assert result["stored"] == result["jobs"], result
    assert result["latency_max_s"] is not None, result
