"""Benchmark of the weekly report: time and peak memory against the number of jobs in a week.

For each size, a fresh store gets a synthetic week (and a previous week of half the size, so
the comparison has data) from ``gen_week``; then a separate process builds the report and
renders the HTML, and reports its wall time and its own peak resident memory: ``VmHWM`` of
``/proc/self/status``, the high-water mark of the process image since its ``exec``. Not
``ru_maxrss``: a child's ``RUSAGE_SELF`` keeps the peak of the process it was forked from
(the generator's, hundreds of MiB at 100k jobs) across fork and exec.

    python benchmarks/bench_report.py --sizes 10000 100000 --sqlite-dir /tmp/bench \\
        [--pg-url postgresql+psycopg://…] [--json results.jsonl] [--keep] \\
        [--code before=/path/to/other/checkout]
    python benchmarks/bench_report.py --smoke     # 300 jobs in a temporary SQLite store

Prints one Markdown table row per (backend, size, code): with ``--code`` the same store is
reported by another checkout's package in the same run, so before and after are paired.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_week

from slurm_gpu.store.store import Store

WEEK_S = 7 * 86400.0

#: Longest a report (or a generated week) may take before the benchmark gives up, in seconds.
TIMEOUT_S = 1800.0

_CHILD = r"""
import json, sys, time
from slurm_gpu.weekly.aggregate import build_report
from slurm_gpu.weekly.model import Period
from slurm_gpu.weekly.render import render_html
from slurm_gpu.store.store import Store
url, since = sys.argv[1], float(sys.argv[2])
t0 = time.perf_counter()
with Store.open(url, migrate=False) as store:
    report = build_report(store.engine, Period(since, since + 7 * 86400.0))
t1 = time.perf_counter()
html = render_html(report)
t2 = time.perf_counter()
print(json.dumps({
    "aggregate_s": t1 - t0, "render_s": t2 - t1, "jobs": report.headline.jobs,
    "html_bytes": len(html), "maxrss_mib": PEAK_MIB(),
}))
"""

#: Source of ``PEAK_MIB()`` in a child: its own peak resident memory in MiB (``VmHWM``, reset
#: by ``exec``, so nothing of the parent's peak is in it).
_PEAK = r"""
def PEAK_MIB():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
"""


def child_peak_mib(
    code: str, *args: str, timeout_s: float = TIMEOUT_S, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter (``PEAK_MIB()`` defined) and parse the JSON line it
    prints last. Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK + code, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
        env=env,
        # Not the caller's directory: ``-c`` puts it first on sys.path, and a checkout there
        # would shadow the package that PYTHONPATH names.
        cwd="/",
    )
    result: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return result


#: The benchmark works in its own schema, so it never touches the tests' tables.
PG_SCHEMA = "bench_report"


def _reset_pg(url: str) -> str:
    """Empty the benchmark's schema and return a URL whose search_path is that schema."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        conn.exec_driver_sql(f"CREATE SCHEMA {PG_SCHEMA}")
    engine.dispose()
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{PG_SCHEMA}"


def generate(url: str, n_jobs: int) -> float:
    """Fill the store at ``url`` with a week of ``n_jobs`` jobs and a previous week of half as
    many; the seconds it took."""
    since = gen_week.DEFAULT_SINCE_S
    t0 = time.perf_counter()
    gen_week.generate(url, n_jobs, since, seed=1)
    gen_week.generate(url, n_jobs // 2, since - WEEK_S, seed=2, id_offset=n_jobs)
    gen_s = time.perf_counter() - t0
    if url.startswith("postgresql"):
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
        engine.dispose()
    return gen_s


def report_once(url: str, code: str | None) -> dict[str, float]:
    """Build and render the report of the generated week in a fresh process, with the
    package found at ``code`` (a checkout; ``None``: this one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = code or str(Path(__file__).resolve().parents[1])
    result = child_peak_mib(_CHILD, url, str(gen_week.DEFAULT_SINCE_S), env=env)
    result["load_1min"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--sqlite-dir", help="directory for the SQLite stores (skip SQLite if absent)")
    p.add_argument("--pg-url", help=f"PostgreSQL URL (works in schema {PG_SCHEMA})")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the SQLite stores, and reuse one generated by an earlier --keep run",
    )
    p.add_argument(
        "--code",
        action="append",
        metavar="LABEL=PATH",
        help="also run the report with the package of another checkout (e.g. before=../main), "
        "on the same store in the same run; repeatable",
    )
    p.add_argument("--json", help="append one JSON line per row to this file")
    p.add_argument("--smoke", action="store_true", help="300 jobs in a temporary SQLite store")
    args = p.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            return _run(argparse.Namespace(**{**vars(args), "sizes": [300], "sqlite_dir": tmp}))
    return _run(args)


def _codes(specs: list[str] | None) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [("this checkout", None)]
    for spec in specs or []:
        label, _, path = spec.partition("=")
        out.append((label, str(Path(path).resolve())))
    return out


#: Issue 29's targets: seconds at a week of jobs, and the memory that must stay flat.
TIME_TARGETS_S = {100_000: 5.0, 1_000_000: 30.0}
MEMORY_TARGET_MIB = 300


def _print_targets(backend: str, jobs: int, total_s: float, rss_mib: float) -> None:
    """The target lines (``results.target_line``) of one size on one back end."""
    from results import target_line

    for size, limit in TIME_TARGETS_S.items():
        if jobs == size:
            print(
                target_line(
                    f"weekly report, {jobs:,} jobs, {backend}: aggregate + render",
                    f"{total_s:.2f} s",
                    f"≤ {limit:g} s",
                    total_s <= limit,
                )
            )
    if jobs == max(TIME_TARGETS_S):
        print(
            target_line(
                f"weekly report, {jobs:,} jobs, {backend}: peak resident memory of the report",
                f"{rss_mib:.0f} MiB",
                f"≤ {MEMORY_TARGET_MIB} MiB",
                rss_mib <= MEMORY_TARGET_MIB,
            )
        )


def _run(args: argparse.Namespace) -> int:
    codes = _codes(args.code)
    print(
        "## Weekly report: time and memory against jobs per week (`benchmarks/bench_report.py`)\n"
    )
    print(
        "| backend | code | jobs in week | generate (s) | aggregate (s) | render (s) | total (s) "
        "| peak RSS (MiB) | load (1 min) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        targets: list[tuple[str, str, Path | None]] = []
        if args.sqlite_dir:
            path = Path(args.sqlite_dir) / f"week-{n}.db"
            generated = Path(f"{path}.generated")
            if not (args.keep and generated.exists()):
                for suffix in ("", "-wal", "-shm", "-journal", ".generated"):
                    if os.path.exists(f"{path}{suffix}"):
                        os.unlink(f"{path}{suffix}")
            targets.append(("SQLite", f"sqlite:///{path.resolve()}", generated))
        if args.pg_url:
            targets.append(("PostgreSQL", _reset_pg(args.pg_url), None))
        for name, url, done in targets:
            if done is not None and done.exists():
                gen_s = float(done.read_text())
                with Store.open(url):  # a kept store is brought to this release's schema
                    pass
            else:
                gen_s = generate(url, n)
                if done is not None:
                    done.write_text(f"{gen_s}\n")
            for label, code in codes:
                r = report_once(url, code)
                r["generate_s"] = gen_s
                total = r["aggregate_s"] + r["render_s"]
                if args.json:
                    with open(args.json, "a", encoding="utf-8") as fh:
                        row = {"bench": "report", "backend": name, "code": label, "size": n}
                        fh.write(json.dumps({**row, **r, "total_s": total}) + "\n")
                print(
                    f"| {name} | {label} | {int(r['jobs']):,} | {r['generate_s']:.1f} "
                    f"| {r['aggregate_s']:.2f} | {r['render_s']:.2f} | {total:.2f} "
                    f"| {r['maxrss_mib']:.0f} | {r['load_1min']:.1f} |",
                    flush=True,
                )
                if code is None:
                    _print_targets(name, int(r["jobs"]), total, r["maxrss_mib"])
            if done is not None and not args.keep:
                for suffix in ("", "-journal", ".generated"):
                    if os.path.exists(f"{url.removeprefix('sqlite:///')}{suffix}"):
                        os.unlink(f"{url.removeprefix('sqlite:///')}{suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
