"""Benchmarks that cannot rot: each one in benchmarks/ runs at a tiny size, with a timeout, and
prints its table (what it prints is checked for shape, never for a timing).

Those that need PostgreSQL carry that marker; the two that load series into a throwaway
Prometheus need ``prometheus`` and ``promtool`` installed. Those that drive the Slurm test
cluster or the version lab run under that one's session fixture, which starts it (a cluster or
lab that a reboot left stopped is started, not used): ``tests/integration/
test_bench_smoke_cluster.py`` and ``tests/lab/test_lab_bench_smoke.py``.
"""

from __future__ import annotations

import json
import shutil
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

_PY_SPY = pytest.mark.skipif(
    not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()),
    reason="py-spy is not installed (the stacks extra)",
)

#: What a benchmark needs beyond this machine, as a pytest mark.
_NEEDS = {
    "bench_stacks.py": _PY_SPY,
    "bench_pg_transport.py": pytest.mark.postgres,
    "bench_police.py": _PROM,
    "bench_prom_source.py": _PROM,
}

sys.path.insert(0, str(BENCH))
try:
    from results import SMOKE_ARGS, render, run_smoke
finally:
    sys.path.remove(str(BENCH))


def _marks(script: str) -> list[pytest.MarkDecorator]:
    need = _NEEDS.get(script)
    if need is None:
        return []
    return list(need) if isinstance(need, list) else [need]


#: Benchmarks whose tiny run is under the cluster's or the lab's session fixture.
ELSEWHERE = {"bench_collect.py", "bench_gpueff.py", "bench_lab_latency.py"}

CASES = [
    pytest.param(script, args, marks=_marks(script), id=script)
    for script, args in sorted(SMOKE_ARGS.items())
    if script not in ELSEWHERE
]


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
    assert {p.name for p in BENCH.glob("bench_*.py")} == set(SMOKE_ARGS)


def test_results_render_machine_load_and_each_section(tmp_path: Path) -> None:
    row = {
        "bench": "bench_x.py",
        "args": [],
        "smoke": False,
        "rc": 0,
        "started_utc": "2026-11-29T01:00:00+00:00",
        "wall_s": 1.0,
        "machine": {
            "nproc": 2,
            "kernel": "6.1.0-test",
            "os": "Debian GNU/Linux 12",
            "mem_gib": 24,
            "gpu": "no GPU",
            "python": "3.12.0",
        },
        "load_before": [0.5, 0.4, 0.3],
        "load_after": [1.5, 0.9, 0.4],
        "stdout": "| a | b |\n|---|---|\n| 1 | 2 |\n",
        "stderr_tail": "",
    }
    failed = {**row, "bench": "bench_y.py", "rc": 124, "stdout": "", "stderr_tail": "timed out"}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(failed) + "\n")
    text = render(path)
    assert "kernel 6.1.0-test, 2 cores (nproc)" in text
    assert "2026-11-29T01:00:00+00:00 UTC" in text
    assert "0.50–1.50" in text
    assert "| 1 | 2 |" in text
    assert "`bench_y.py` did not complete: exit 124 (timed out)." in text


@pytest.mark.parametrize(("script", "args"), CASES)
def test_benchmark_runs_at_a_tiny_size(script: str, args: list[str], tmp_path: Path) -> None:
    proc = run_smoke(script, TIMEOUT_S, tmp=str(tmp_path))
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
