"""Record benchmark runs in a machine-readable results file, and render it as Markdown.

``benchmarks/run`` calls ``record`` once per benchmark, then ``render`` on the file::

    python benchmarks/results.py record --out R.jsonl [--timeout S] [--smoke] -- PYTHON bench_x.py
    python benchmarks/results.py render R.jsonl

Each line of the file is one benchmark run: its script and arguments, exit status, wall time
(s), the UTC start, the machine (``nproc``, ``uname -r``, OS, memory, GPU, Python), the load
averages from ``/proc/loadavg`` before and after, and what it printed (its Markdown section).
``render`` prints a heading naming the machine, date and load, then each benchmark's section
(or, for one that failed, its exit status and last error line). ``SMOKE_ARGS`` are the tiny
sizes, shared with ``tests/unit/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Each benchmark's tiny run ("{tmp}": a scratch directory; "{job}": a completed job of the
#: test cluster; "{tc_root}": its directory). Every bench_*.py has one.
SMOKE_ARGS: dict[str, list[str]] = {
    "bench_collect.py": ["--jobs", "20", "--gpus", "1", "--repeat", "1"],
    "bench_epilog.py": ["--smoke"],
    "bench_exporter.py": ["--scrapes", "20"],
    "bench_gpueff.py": ["--runs", "1", "--job", "{job}", "--config", "{tc_root}/slurm-gpu.toml"],
    "bench_lab_latency.py": ["--jobs", "2"],
    "bench_nvml_calls.py": ["--readings", "20"],
    "bench_pg_transport.py": ["--jobs", "30", "--gpus", "1", "--repeat", "1"],
    "bench_police.py": ["--jobs", "50"],
    "bench_prom_source.py": ["--jobs", "20", "--scrapes", "4", "--measure", "5"],
    "bench_report.py": ["--smoke"],
    "bench_sampler.py": ["--smoke"],
    "bench_stacks.py": ["--bursts", "1", "--samples", "1"],
    "bench_store_journal.py": ["--smoke", "--dir", "{tmp}"],
    "bench_store_prune.py": ["--jobs", "300", "--ingest-jobs", "20", "--dir", "{tmp}"],
}


def _loadavg() -> list[float]:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return [float(x) for x in fh.read().split()[:3]]


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, kernel, OS, memory (GiB), GPU, Python."""
    os_name = platform.system()
    try:
        info = platform.freedesktop_os_release()
        os_name = info.get("PRETTY_NAME", os_name)
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
            gpu = out.splitlines()[0] if out.strip() else gpu
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "os": os_name,
        "mem_gib": round(mem_gib),
        "gpu": gpu,
        "python": platform.python_version(),
    }


#: The window ``newest_completed_job`` looks in.
WINDOW = ("-S", "now-30days", "-E", "now")


def newest_completed_job() -> str:
    """The newest completed job the test cluster's accounting knows (``{job}``); ``""`` when
    ``sacct`` lists none or cannot be asked (the benchmark then fails and says why)."""
    try:
        out = subprocess.run(
            # A state filter needs an explicit window end, or sacct lists nothing.
            [*("sacct", "-X", "-n", "-P", "-a", "-o", "JobID", "-s", "CD"), *WINDOW],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out[-1] if out else ""


def smoke_argv(script: str, tmp: str, tc_root: str, job: str | None = None) -> list[str]:
    """``SMOKE_ARGS[script]`` with its placeholders filled (``{job}``: ``job``, else the test
    cluster's newest completed job)."""
    args = SMOKE_ARGS[script]
    if job is None:
        job = newest_completed_job() if "{job}" in args else ""
    return [
        a.replace("{tmp}", tmp).replace("{tc_root}", tc_root).replace("{job}", job) for a in args
    ]


def run_smoke(
    script: str, timeout_s: float, *, tmp: str = "", tc_root: str = "", job: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/script`` at its tiny size with this interpreter and this checkout's
    package, from the checkout (what the smoke tests run)."""
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, str(repo / "benchmarks" / script), *smoke_argv(script, tmp, tc_root, job)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        check=False,
    )


def record(out: Path, argv: list[str], timeout_s: float, smoke: bool) -> int:
    """Run one benchmark and append its result line to ``out``; its exit status."""
    script = Path(argv[-1]).name
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        tc_root = os.environ.get("TC_ROOT", "/var/lib/slurm-gpu-testcluster")
        extra = smoke_argv(script, tmp, tc_root) if smoke and script in SMOKE_ARGS else []
        started = datetime.now(UTC)
        load_before = _loadavg()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [*argv, *extra], capture_output=True, text=True, timeout=timeout_s, check=False
            )
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = 124
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            stderr = f"timed out after {timeout_s:g} s"
    row = {
        "bench": script,
        "args": extra,
        "smoke": smoke,
        "rc": rc,
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 3),
        "machine": machine(),
        "load_before": load_before,
        "load_after": _loadavg(),
        "stdout": stdout,
        "stderr_tail": stderr[-2000:],
    }
    with out.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rc


def render(path: Path) -> str:
    """The Markdown of a results file: a heading with machine, date and load, then each run."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not rows:
        return ""
    m = rows[0]["machine"]
    loads = [r["load_before"][0] for r in rows] + [r["load_after"][0] for r in rows]
    parts = [
        "",
        f"# Run of {rows[0]['started_utc'][:10]}: {m['os']}, kernel {m['kernel']}, "
        f"{m['nproc']} cores (nproc), {m['mem_gib']} GiB, {m['gpu']}, Python {m['python']}",
        "",
        f"Started {rows[0]['started_utc']} UTC; load average (1 min, /proc/loadavg) "
        f"{min(loads):.2f}–{max(loads):.2f} over the run"
        + (" (tiny sizes: a check that each runs, not a measure)." if rows[0]["smoke"] else "."),
        "",
    ]
    for r in rows:
        if r["rc"] == 0:
            parts.append(r["stdout"].rstrip("\n"))
        else:
            last = (r["stderr_tail"].strip().splitlines() or ["(no error output)"])[-1]
            parts.append(f"`{r['bench']}` did not complete: exit {r['rc']} ({last}).")
        parts.append("")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run one benchmark and append its result")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--timeout", type=float, default=3600.0, help="seconds")
    rec.add_argument("--smoke", action="store_true", help="with its tiny-size arguments")
    rec.add_argument("command", nargs="+", help="the interpreter and the benchmark script")
    ren = sub.add_parser("render", help="print a results file as Markdown")
    ren.add_argument("results", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "record":
        return record(args.out, args.command, args.timeout, args.smoke)
    sys.stdout.write(render(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
