"""The benchmarks that read the test cluster's accounting run at their tiny size, under the
cluster session fixture (which starts the cluster a reboot left stopped) and on a job of their
own (a fresh cluster has none yet). What they print is checked for shape, never for a timing;
tests/unit/test_benchmarks_smoke.py holds the benchmarks that need no cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import slurmtools

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))
try:
    from results import run_smoke
finally:
    sys.path.remove(str(BENCH))

#: The benchmarks of this module (tests/unit/test_benchmarks_smoke.py leaves them out).
ON_CLUSTER = ("bench_collect.py", "bench_gpueff.py")
#: Longest one tiny run may take, in seconds.
TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def completed_job() -> str:
    """A job of sgtest1's that completed, for ``{job}``."""
    job_id = slurmtools.submit(
        "#!/bin/sh\nsleep 1\n", args=["--time=2", "--output=/dev/null", "--chdir=/tmp"]
    )
    assert slurmtools.wait_done(job_id) == "COMPLETED"
    return job_id


@pytest.mark.parametrize("script", ON_CLUSTER)
def test_benchmark_runs_at_a_tiny_size_on_the_cluster(script: str, completed_job: str) -> None:
    proc = run_smoke(script, TIMEOUT_S, tc_root=str(slurmtools.tc_root()), job=completed_job)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # A Markdown table: its header rule line.
    assert any(line.startswith(("|---", "|--:")) for line in proc.stdout.splitlines()), proc.stdout[
        -2000:
    ]
    if script == "bench_gpueff.py":
        # The import breakdown ran in its own interpreters and printed its table.
        assert "import probe failed" not in proc.stdout, proc.stdout[-2000:]
        assert "| of the total: building" in proc.stdout, proc.stdout[-2000:]
        # The jobs it submits itself were timed: one running, one ended and not collected.
        assert "(running: the controller answers; median wall)" in proc.stdout, proc.stdout[-2000:]
        assert "(ended, not collected yet: accounting answers; median wall)" in proc.stdout, (
            proc.stdout[-2000:]
        )
