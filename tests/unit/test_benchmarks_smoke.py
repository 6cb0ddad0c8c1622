"""Benchmarks that cannot rot: each one in benchmarks/ runs at a tiny size, with a timeout, and
prints its table (what it prints is checked for shape, never for a timing).

Those that need the Slurm test cluster, PostgreSQL or the version lab carry that marker; the two
that load series into a throwaway Prometheus need ``prometheus`` and ``promtool`` installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
#: Longest one tiny run may take, in seconds (the non-cluster ones take 1-10 s each).
TIMEOUT_S = 120.0

_PROM = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="prometheus is not installed (make deps)",
)

#: Every benchmark script, with the arguments of its tiny run.
CASES = [
    pytest.param("bench_epilog.py", ["--smoke"], id="epilog"),
    pytest.param("bench_exporter.py", ["--scrapes", "20"], id="exporter"),
    pytest.param("bench_nvml_calls.py", ["--readings", "20"], id="nvml_calls"),
    pytest.param("bench_report.py", ["--smoke"], id="report"),
    pytest.param("bench_sampler.py", ["--smoke"], id="sampler"),
    pytest.param("bench_store_journal.py", ["--smoke", "--dir", "{tmp}"], id="store_journal"),
    pytest.param(
        "bench_store_prune.py",
        ["--jobs", "300", "--ingest-jobs", "20", "--dir", "{tmp}"],
        id="store_prune",
    ),
    pytest.param("bench_police.py", ["--jobs", "50"], marks=_PROM, id="police"),
    pytest.param(
        "bench_prom_source.py",
        ["--jobs", "20", "--scrapes", "4", "--measure", "5"],
        marks=_PROM,
        id="prom_source",
    ),
    pytest.param(
        "bench_collect.py",
        ["--jobs", "20", "--gpus", "1", "--repeat", "1"],
        marks=pytest.mark.cluster,
        id="collect",
    ),
    pytest.param(
        "bench_gpueff.py", ["--runs", "1", "--job", "{job}"], marks=pytest.mark.cluster, id="gpueff"
    ),
    pytest.param(
        "bench_pg_transport.py",
        ["--jobs", "30", "--gpus", "1", "--repeat", "1"],
        marks=pytest.mark.postgres,
        id="pg_transport",
    ),
    pytest.param("bench_lab_latency.py", ["--jobs", "2"], marks=pytest.mark.lab, id="lab_latency"),
]


def _newest_completed_job() -> str:
    """The newest completed job the test cluster's accounting knows (for ``bench_gpueff``)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-o", "JobID", "-s", "CD", "-S", "now-30days"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out, "no completed job on the test cluster"
    return out[-1]


def _printed_a_result(stdout: str) -> bool:
    """A Markdown table (a header rule line), or, for the lab benchmark, a JSON object."""
    lines = stdout.splitlines()
    if any(line.startswith("|---") or line.startswith("|--:") for line in lines):
        return True
    try:
        return isinstance(json.loads(lines[-1]), dict) if lines else False
    except ValueError:
        return False


def test_every_benchmark_has_a_tiny_run() -> None:
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    covered = {case.values[0] for case in CASES}
    assert scripts == covered


@pytest.mark.parametrize(("script", "args"), CASES)
def test_benchmark_runs_at_a_tiny_size(script: str, args: list[str], tmp_path: Path) -> None:
    job = _newest_completed_job() if "{job}" in args else ""
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{job}", job) for a in args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _printed_a_result(proc.stdout), proc.stdout[-2000:]


def test_report_benchmark_measures_the_child_alone() -> None:
    """A child's peak memory is its own, not that of the process that started it."""
    sys.path.insert(0, str(BENCH))
    try:
        import bench_report
    finally:
        sys.path.remove(str(BENCH))
    big = bytearray(256 * 2**20)
    big[::4096] = b"\x01" * len(big[::4096])  # touch every page: 256 MiB resident here
    got = bench_report.child_peak_mib('import json; print(json.dumps({"mib": PEAK_MIB()}))')
    del big
    assert got["mib"] < 128
