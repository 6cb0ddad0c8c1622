"""Retention and export on a large store: ``store prune`` and ``store export`` time and peak
memory, and the collector's ingest rate while a prune runs (next to its rate alone).

The store is filled by direct bulk inserts (one ``jobs``, ``job_hosts``, ``job_gpus``,
``findings``, ``timelines`` and ``job_reports`` row per one-GPU job, the timeline a real
encoded one-hour timeline, the report a real-sized text), with end times spread evenly over
the year before now, so that about half the jobs are past the default 180 days. Then, in this
order, each measured in a fresh process (``VmHWM``, the high-water mark of that process image
since its ``exec``; not ``ru_maxrss``, which keeps the peak of the filling parent across fork
and exec):

1. ``export`` of every job summary to CSV, and of every finding;
2. the collector ingesting ``--ingest-jobs`` sealed records alone (sacct replaced by the
   offline runner of ``bench_collect.py``);
3. ``prune`` (default retention: 180 days, batches of 500) while the collector ingests as
   many records again; the collector's rate and the longest prune transaction are reported;
4. ``prune`` again (nothing left to do: what a daily run costs on a pruned store).

Usage::

    python benchmarks/bench_store_prune.py --jobs 1000000 [--pg-url postgresql+psycopg://…]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_collect

from slurm_gpu.store import Store, codec, schema
from slurm_gpu.store.export import export
from slurm_gpu.store.prune import DAY_S, RetentionPolicy, prune

PG_SCHEMA = "bench_prune"  # the default of --pg-schema
FILL_CHUNK = 5000


def _reset_pg(url: str, pg_schema: str) -> str:
    if not pg_schema.isidentifier():
        raise SystemExit(f"--pg-schema {pg_schema!r}: use letters, digits and underscores")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
        conn.exec_driver_sql(f"CREATE SCHEMA {pg_schema}")
    engine.dispose()
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{pg_schema}"


def fill(url: str, n: int, now_s: float) -> float:
    """``n`` one-GPU jobs ending evenly over the year before ``now_s``; returns seconds."""
    rng = random.Random(7)
    rec = bench_collect.make_record("0", "node1", 1, rng)
    blob = codec.encode_timeline(rec.timeline, 1)
    hist = codec.encode_distribution(rec.gpus[0].utilization)
    host_hist = codec.encode_distribution(rec.host.cpu_cores_busy) if rec.host else None
    report = ("x" * 70 + "\n") * 30  # about the size of a rendered report
    started = time.perf_counter()
    with Store.open(url) as store:
        for lo in range(0, n, FILL_CHUNK):
            ids = range(lo, min(n, lo + FILL_CHUNK))
            jobs, hosts, gpus, finds, tls, reps = [], [], [], [], [], []
            for i in ids:
                jid = str(1_000_000 + i)
                end = now_s - 365 * DAY_S + i * (365 * DAY_S / n)
                jobs.append(
                    {
                        "job_id": jid,
                        "job_id_display": jid,
                        "user": f"user{i % 500}",
                        "account": f"acct{i % 40}",
                        "partition": "gpu",
                        "qos": "normal",
                        "job_name": f"train-{i % 97}",
                        "nodelist": "node1",
                        "node_count": 1,
                        "state": "COMPLETED",
                        "exit_code": 0,
                        "alloc_tres": "cpu=8,gres/gpu=1",
                        "req_tres": "cpu=8,gres/gpu=1",
                        "tres_json": "{}",
                        "alloc_cpus": 8,
                        "alloc_gpus": 1,
                        "elapsed_s": 3600,
                        "time_limit_s": 7200,
                        "submit_s": end - 3700,
                        "start_s": end - 3600,
                        "end_s": end,
                        "restarts": 0,
                        "missing_hosts": "",
                        "telemetry": "complete",
                        "gpu_hours": 1.0,
                        "collected_at_s": end + 300,
                    }
                )
                hosts.append(
                    {
                        "job_id": jid,
                        "host": "node1",
                        "source": "nvml",
                        "interval_s": 10.0,
                        "started_s": end - 3600,
                        "ended_s": end,
                        "complete": True,
                        "notes": "",
                        "gpu_count": 1,
                        "has_host_summary": True,
                        "cpu_busy_hist": host_hist,
                    }
                )
                gpus.append(
                    {
                        "job_id": jid,
                        "host": "node1",
                        "uuid": f"GPU-{i:08d}",
                        "position": 0,
                        "samples": 360,
                        "samples_available": 360,
                        "util_mean_pct": 50.0,
                        "util_hist": hist,
                        "sub_util_hist": hist,
                        "idle_samples": 10,
                        "idle_fraction": 10 / 360,
                        "memory_used_max_bytes": 2**34,
                        "energy_j": 9e5,
                        "throttle_power_s": 0.0,
                        "throttle_thermal_s": 0.0,
                        "xid_events": "",
                        "process_seen": True,
                        "max_processes": 1,
                        "pids": "1",
                    }
                )
                finds.append(
                    {
                        "job_id": jid,
                        "seq": 0,
                        "code": "LOW_DUTY",
                        "severity": "warning",
                        "cause": 1,
                        "evidence": '{"duty_mean_pct":50.0}',
                        "analysis_version": "1",
                    }
                )
                tls.append(
                    {
                        "job_id": jid,
                        "host": "node1",
                        "gpu_uuids": f"GPU-{i:08d}",
                        "points": 360,
                        "data": blob,
                    }
                )
                reps.append(
                    {
                        "job_id": jid,
                        "typed_id": jid,
                        "render_key": "k",
                        "plain": report,
                        "colour": report,
                        "rendered_at_s": end + 300,
                    }
                )
            with store.engine.begin() as conn:
                for table, rows in (
                    (schema.jobs, jobs),
                    (schema.job_hosts, hosts),
                    (schema.job_gpus, gpus),
                    (schema.findings, finds),
                    (schema.timelines, tls),
                    (schema.job_reports, reps),
                ):
                    conn.execute(table.insert(), rows)
    return time.perf_counter() - started


#: Longest wait for one measured child process, in seconds.
CHILD_TIMEOUT_S = 3600.0


def _peak_mib() -> float:
    """This process's peak resident memory (MiB) since its exec (/proc/self/status VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _do_export(url: str, out: str, what: str, q: Any) -> None:
    tracemalloc.start()
    t = time.perf_counter()
    with Store.open(url, migrate=False) as store:
        r = export(store.engine, out, since_s=0, until_s=4e9, what=what)
    q.put(
        {
            "seconds": time.perf_counter() - t,
            "rows": r.rows,
            "rss_mib": _peak_mib(),
            "py_peak_mib": tracemalloc.get_traced_memory()[1] / 2**20,
            "bytes": os.path.getsize(out),
        }
    )


def _do_prune(url: str, now_s: float, q: Any) -> None:
    tracemalloc.start()
    with Store.open(url, migrate=False) as store:
        r = prune(store.engine, RetentionPolicy(180, 0, 500), clock=lambda: now_s)
    q.put(
        {
            "seconds": r.seconds,
            "ended_at": time.time(),
            "pruned": r.timelines_pruned,
            "batches": r.batches,
            "longest_batch_ms": r.longest_batch_s * 1e3,
            "rss_mib": _peak_mib(),
            "py_peak_mib": tracemalloc.get_traced_memory()[1] / 2**20,
        }
    )


def _do_ingest(url: str, workdir: str, n: int, first_id: int, q: Any) -> None:
    from slurm_gpu.accounting.sacct import SacctSource
    from slurm_gpu.collector import Collector, CollectorOptions

    root = Path(workdir)
    spool_dir, state_dir = root / "spool", root / "state"
    bench_collect.fill_spool(spool_dir, n, 1, "vm", first_id=first_id)
    acc = SacctSource(batch_size=500, runner=bench_collect.OfflineRunner(1, "vm"))
    with Store.open(url, migrate=False) as store:
        c = Collector(
            store=store,
            accounting=acc,
            spool_dir=str(spool_dir),
            state_dir=str(state_dir),
            options=CollectorOptions(batch_size=500),
        )
        t = time.perf_counter()
        report = c.run_once(missing_pass=False)
        elapsed = time.perf_counter() - t
    shutil.rmtree(root, ignore_errors=True)
    q.put(
        {
            "jobs": len(report.ingested),
            "seconds": elapsed,
            "jobs_per_s": n / elapsed,
            "ended_at": time.time(),
        }
    )


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    try:
        out = q.get(timeout=CHILD_TIMEOUT_S)
    finally:
        p.join(timeout=CHILD_TIMEOUT_S)
        if p.is_alive():
            p.kill()
    return out  # type: ignore[no-any-return]


def run(label: str, url: str, n: int, ingest_jobs: int, tmp: Path) -> None:
    now = time.time()
    fill_s = fill(url, n, now)
    print(f"\n### {label}, {n:,} jobs (filled by bulk inserts in {fill_s:.0f} s)\n", flush=True)
    with Store.open(url, migrate=False) as store:
        size = store.info().size_bytes
    print(f"store size before: {size / 2**20:,.0f} MiB\n" if size else "", flush=True)
    print("| step | time | peak RSS | Python heap peak | result |")
    print("|---|---:|---:|---:|---|")
    for what in ("jobs", "findings"):
        e = _in_child(_do_export, url, str(tmp / f"export-{what}.csv"), what)
        print(
            f"| export {what} (CSV) | {e['seconds']:.1f} s | {e['rss_mib']:.0f} MiB | "
            f"{e['py_peak_mib']:.1f} MiB | {e['rows']:,} rows, {e['bytes'] / 2**20:.0f} MiB |",
            flush=True,
        )
        os.unlink(tmp / f"export-{what}.csv")
    alone = _in_child(_do_ingest, url, str(tmp / "ingest-a"), ingest_jobs, 50_000_000)
    print(
        f"| collector alone | {alone['seconds']:.1f} s | | | {alone['jobs_per_s']:.0f} jobs/s |",
        flush=True,
    )
    ctx = mp.get_context("spawn")
    q_prune, q_ingest = ctx.Queue(), ctx.Queue()
    pp = ctx.Process(target=_do_prune, args=(url, now, q_prune))
    pp.start()
    time.sleep(1.0)  # the prune is under way when the collector starts
    pi = ctx.Process(
        target=_do_ingest, args=(url, str(tmp / "ingest-b"), ingest_jobs, 60_000_000, q_ingest)
    )
    pi.start()
    during = q_ingest.get(timeout=CHILD_TIMEOUT_S)
    pr = q_prune.get(timeout=CHILD_TIMEOUT_S)
    pi.join(timeout=CHILD_TIMEOUT_S)
    pp.join(timeout=CHILD_TIMEOUT_S)
    print(
        f"| prune (180 days, batches of 500) | {pr['seconds']:.1f} s | {pr['rss_mib']:.0f} MiB | "
        f"{pr['py_peak_mib']:.1f} MiB | {pr['pruned']:,} jobs' timelines in {pr['batches']:,} "
        f"batches, longest {pr['longest_batch_ms']:.0f} ms |",
        flush=True,
    )
    overlap = (
        "the prune still ran when it ended"
        if pr["ended_at"] > during["ended_at"]
        else "the prune ended first"
    )
    print(
        f"| collector during the prune | {during['seconds']:.1f} s | | | "
        f"{during['jobs_per_s']:.0f} jobs/s ({overlap}) |",
        flush=True,
    )
    again = _in_child(_do_prune, url, now)
    print(
        f"| prune again (nothing due) | {again['seconds']:.2f} s | {again['rss_mib']:.0f} MiB | "
        f"{again['py_peak_mib']:.1f} MiB | {again['pruned']} jobs |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--ingest-jobs", type=int, default=1000)
    ap.add_argument("--pg-url", help="also on PostgreSQL, in the schema --pg-schema")
    ap.add_argument(
        "--pg-schema",
        default=PG_SCHEMA,
        help=f"schema dropped and recreated for the run (default {PG_SCHEMA}); give each "
        "concurrent run on a shared server its own",
    )
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--dir", default=None, help="where the SQLite store goes (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-prune-", dir=args.dir) as tmp_s:
        tmp = Path(tmp_s)
        print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f}")
        if not args.no_sqlite:
            run("SQLite", f"sqlite:///{tmp}/store.db", args.jobs, args.ingest_jobs, tmp)
        if args.pg_url:
            run(
                "PostgreSQL",
                _reset_pg(args.pg_url, args.pg_schema),
                args.jobs,
                args.ingest_jobs,
                tmp,
            )
        print(f"\nload average (1 min) at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
