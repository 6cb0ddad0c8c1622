"""Record benchmark runs in a machine-readable results file, and render it as Markdown.

``benchmarks/run`` calls ``record`` once per benchmark, then ``render`` on the file::

    python benchmarks/results.py record --out R.jsonl [--timeout S] [--smoke] -- PYTHON bench_x.py
    python benchmarks/results.py render R.jsonl
    python benchmarks/results.py write-doc RENDERED.md docs/performance.md

Each line of the file is one benchmark run: its script and arguments, exit status, wall time
(s), the UTC start, the machine (``nproc``, ``uname -r``, OS, memory, GPU, Python), the load
averages from ``/proc/loadavg`` before and after, the machine's pace (``pace_ms``), and what it
printed (its Markdown section). ``render`` prints a heading naming the machine, date, load and
pace, then each benchmark's section
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
    "bench_gpueff.py": [
        *("--runs", "1", "--job", "{job}", "--config", "{tc_root}/slurm-gpu.toml"),
        *("--running", "--ended"),
    ],
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


#: The arguments of the documented run of each benchmark, where its defaults are not that run
#: (sizes the targets name, a job of the test cluster, a scratch directory); "{pg_url}": the
#: test PostgreSQL server's URL (``share/testpg/start``), the pair dropped when it has none.
FULL_ARGS: dict[str, list[str]] = {
    "bench_collect.py": ["--jobs", "1000", "--gpus", "1", "4", "--repeat", "3"],
    "bench_gpueff.py": [
        *("--runs", "11", "--job", "{job}", "--config", "{tc_root}/slurm-gpu.toml"),
        *("--user", "sgtest1", "--running", "--ended"),
    ],
    "bench_report.py": [
        "--sizes",
        "100000",
        "1000000",
        "--sqlite-dir",
        "{tmp}",
        "--pg-url",
        "{pg_url}",
    ],
    "bench_store_journal.py": ["--dir", "{tmp}"],
    "bench_store_prune.py": ["--jobs", "100000", "--dir", "{tmp}"],
}
#: Where the test PostgreSQL server writes its URL.
TESTPG_URL_FILE = Path("/var/lib/slurm-gpu-testpg/url")


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


def newest_completed_job(user: str | None = None) -> str:
    """The newest completed GPU job the test cluster's accounting knows (``{job}``; of
    ``user`` alone when given: the collector stores only jobs with GPUs); ``""`` when ``sacct``
    lists none or cannot be asked (the benchmark then fails and says why)."""
    who = ["-u", user] if user else ["-a"]
    try:
        out = subprocess.run(
            # A state filter needs an explicit window end, or sacct lists nothing.
            [*("sacct", "-X", "-n", "-P", *who, "-o", "JobID,AllocTRES", "-s", "CD"), *WINDOW],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    gpu_jobs = [line.split("|", 1)[0] for line in out if "gres/gpu" in line]
    return gpu_jobs[-1] if gpu_jobs else ""


def newest_stored_job(config: str, user: str | None = None) -> str:
    """The newest GPU job (of ``user`` alone when given) that the store of the slurm-gpu
    configuration ``config`` holds, that is one the collector has stored (and rendered its
    owner's report of); else ``newest_completed_job(user)``. A job that ended but was not
    collected yet (tests leave such jobs on purpose) would time another path of ``gpueff``."""
    try:
        import time

        from slurm_gpu.config import load_settings
        from slurm_gpu.store import Store

        now = time.time()
        with Store.open(load_settings(config).store_url) as store:
            jobs = [
                s.job
                for s in store.jobs_between(now - 30 * 86400, now + 1)
                if (user is None or s.job.user == user) and s.job.alloc_tres.gpus and s.nodes
            ]
    except Exception:  # any failure: the accounting answer, and the run says why
        jobs = []
    if not jobs:
        return newest_completed_job(user)
    return max(jobs, key=lambda j: (j.end_s or 0.0, int(j.job_id))).job_id_display


def smoke_argv(script: str, tmp: str, tc_root: str, job: str | None = None) -> list[str]:
    """``SMOKE_ARGS[script]`` with its placeholders filled (``{job}``: ``job``, else the test
    cluster's newest completed job)."""
    args = SMOKE_ARGS[script]
    if job is None:
        job = newest_completed_job() if "{job}" in args else ""
    return [
        a.replace("{tmp}", tmp).replace("{tc_root}", tc_root).replace("{job}", job) for a in args
    ]


def full_argv(script: str, tmp: str, tc_root: str) -> list[str]:
    """``FULL_ARGS[script]`` with its placeholders filled; ``[]`` for a benchmark whose
    defaults are its documented run."""
    args = list(FULL_ARGS.get(script, []))
    if "{pg_url}" in args:
        at = args.index("{pg_url}")
        try:
            url = TESTPG_URL_FILE.read_text(encoding="utf-8").strip()
        except OSError:
            url = ""
        if url:
            args[at] = url
        else:
            del args[at - 1 : at + 1]
    # The gpueff benchmark times the job's owner: a stored job of the user it names.
    user = args[args.index("--user") + 1] if "--user" in args else None
    config = f"{tc_root}/slurm-gpu.toml"
    job = newest_stored_job(config, user) if "{job}" in args else ""
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


#: The machine's pace: a fixed piece of pure Python, timed before each benchmark. Python-heavy
#: figures (gpueff, the sampler, the collector) scale with it; a peer that mostly waits (seff,
#: whose time is mostly slurmdbd's) does not, so the ratios of two days compare only at a
#: similar pace.
PACE_LOOP = 1_000_000


def pace_ms() -> float:
    """Milliseconds of CPU for ``PACE_LOOP`` additions in a loop, the fastest of 3 tries."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        total = 0
        for i in range(PACE_LOOP):
            total += i
        best = min(best, time.process_time() - t0)
    return round(best * 1e3, 1)


def record(out: Path, argv: list[str], timeout_s: float, smoke: bool) -> int:
    """Run one benchmark and append its result line to ``out``; its exit status."""
    script = Path(argv[-1]).name
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        tc_root = os.environ.get("TC_ROOT", "/var/lib/slurm-gpu-testcluster")
        if smoke:
            extra = smoke_argv(script, tmp, tc_root) if script in SMOKE_ARGS else []
        else:
            extra = full_argv(script, tmp, tc_root)
        pace = pace_ms()
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
        "pace_ms": pace,
        "stdout": stdout,
        "stderr_tail": stderr[-2000:],
    }
    with out.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rc


#: How a benchmark marks a figure that has a target: one line of its output, an HTML comment
#: (invisible in the rendered section) holding JSON, gathered by ``render`` into one table.
TARGET_PREFIX = "<!-- target "


def target_line(figure: str, measured: str, target: str, met: bool, peer: str = "—") -> str:
    """The line a benchmark prints for a figure with a target: ``measured`` and ``peer`` as
    shown (units and ranges included; ``peer``: the peer tool's figure in the same run)."""
    data = {"figure": figure, "measured": measured, "peer": peer, "target": target, "met": met}
    return TARGET_PREFIX + json.dumps(data, ensure_ascii=False) + " -->"


def _targets(stdout: str) -> tuple[list[dict[str, Any]], str]:
    """(the target records of one benchmark's output, that output without their lines)."""
    found: list[dict[str, Any]] = []
    kept: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(TARGET_PREFIX) and line.endswith(" -->"):
            found.append(json.loads(line[len(TARGET_PREFIX) : -len(" -->")]))
        else:
            kept.append(line)
    return found, "\n".join(kept)


def render(path: Path) -> str:
    """The Markdown of a results file: a heading with machine, date and load, the table of
    every figure that has a target (with its peer in the same run), then each run."""
    every = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    # A benchmark run again into the same file (``RESULTS=FILE benchmarks/run NAME``, after
    # fixing what it needed) replaces its earlier row, in its first row's place.
    last = {r["bench"]: r for r in every}
    rows = [last[b] for b in dict.fromkeys(r["bench"] for r in every)]
    if not rows:
        return ""
    m = rows[0]["machine"]
    loads = [r["load_before"][0] for r in rows] + [r["load_after"][0] for r in rows]
    rerun = [r for r in rows if sum(e["bench"] == r["bench"] for e in every) > 1]
    parts = [
        "",
        f"## Latest run, {rows[0]['started_utc'][:10]}: {m['os']}, kernel {m['kernel']}, "
        f"{m['nproc']} cores (nproc), {m['mem_gib']} GiB, {m['gpu']}, Python {m['python']}",
        "",
        f"Started {rows[0]['started_utc']} UTC; load average (1 min, /proc/loadavg) "
        f"{min(loads):.2f}–{max(loads):.2f} over the run"
        + (" (tiny sizes: a check that each runs, not a measure)." if rows[0]["smoke"] else "."),
        "",
    ]
    paces = [r["pace_ms"] for r in rows if isinstance(r.get("pace_ms"), int | float)]
    if paces:
        parts += [
            f"Pace of the machine: {PACE_LOOP:,} additions in a Python loop took "
            f"{min(paces):.0f}–{max(paces):.0f} ms of CPU before the benchmarks (faster is "
            "lower; Python-heavy figures scale with it, `seff`'s mostly waits).",
            "",
        ]
    if rerun:
        again = ", ".join(f"`{r['bench']}` at {r['started_utc'][11:19]}" for r in rerun)
        parts += [f"Run again into the same results file, replacing their first rows: {again}.", ""]
    targets: list[tuple[str, dict[str, Any]]] = []
    bodies: list[str] = []
    for r in rows:
        found, body = _targets(r["stdout"])
        targets += [(r["bench"], t) for t in found]
        bodies.append(body)
    if targets:
        parts += [
            "| figure | measured | peer, same run | target | met | benchmark |",
            "|---|---|---|---|---|---|",
        ]
        for bench, t in targets:
            met = "yes" if t["met"] else "**no**"
            parts.append(
                f"| {t['figure']} | {t['measured']} | {t['peer']} | {t['target']} | {met} "
                f"| `{bench}` |"
            )
        parts.append("")
    for r, body in zip(rows, bodies, strict=True):
        if r["rc"] == 0:
            parts.append(body.rstrip("\n"))
        else:
            last = (r["stderr_tail"].strip().splitlines() or ["(no error output)"])[-1]
            parts.append(f"`{r['bench']}` did not complete: exit {r['rc']} ({last}).")
        parts.append("")
    return "\n".join(parts) + "\n"


#: The lines that bound the generated block of ``docs/performance.md``.
DOC_BEGIN = "<!-- latest run: written by benchmarks/run; do not edit by hand -->"
DOC_END = "<!-- end of the latest run -->"


def write_doc(rendered: str, doc: Path) -> None:
    """Put ``rendered`` between ``DOC_BEGIN`` and ``DOC_END`` in ``doc``, replacing what was
    there; without the markers, insert the block before the first second-level heading."""
    text = doc.read_text(encoding="utf-8")
    block = f"{DOC_BEGIN}\n{rendered.strip()}\n{DOC_END}"
    if DOC_BEGIN in text and DOC_END in text:
        head, rest = text.split(DOC_BEGIN, 1)
        tail = rest.split(DOC_END, 1)[1]
        text = head + block + tail
    else:
        at = text.find("\n## ")
        at = len(text) if at < 0 else at + 1
        text = text[:at] + block + "\n\n" + text[at:]
    doc.write_text(text, encoding="utf-8")


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
    doc = sub.add_parser("write-doc", help="write a rendering into the doc's latest-run block")
    doc.add_argument("rendered", type=Path)
    doc.add_argument("doc", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "record":
        return record(args.out, args.command, args.timeout, args.smoke)
    if args.cmd == "write-doc":
        write_doc(args.rendered.read_text(encoding="utf-8"), args.doc)
        return 0
    sys.stdout.write(render(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
