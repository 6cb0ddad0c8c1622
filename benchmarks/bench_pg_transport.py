"""PostgreSQL transport: records shipped and jobs collected per second, three nodes pushing.

Three shipper processes (one per node, each with its own spool, as three compute nodes would
run ``slurm-gpu ship``) push their sealed records into the inbox of a real PostgreSQL store as
the insert-only node role, over TCP with a password, while one collector process takes them
(passes of ``Collector.run_once`` with the inbox, ``batch_size = 500``) until every job is
stored. All four start together; "end to end" is from their start to the collector's last
commit. Records: one node per job, one hour at the default 10 s interval (360 readings and
timeline points), noisy utilization and power (``bench_collect.make_record``).

``--transports postgresql directory`` runs the same with the directory inbox in turn (the three
shippers copy into a local ``inbox_dir``, the collector reads it): the same collector, machine
and load, so the difference between the two rows is the PostgreSQL transport's own cost.

Left out on purpose, to measure the transport: accounting is an in-process dict (the real
collector asks ``sacct`` once per 500 jobs: about 1 ms per job, ``docs/performance.md``), the
analysis is not run, and no report is rendered.

Where the time goes, in the collector (wall time per job, summed per step): reading the inbox
rows, decoding the records, writing the ``done/`` copies, and the store transaction (rows,
timelines, deleting the inbox rows, commit). Shippers: wall and CPU time per record.

Run as root (uses the test PostgreSQL server of ``share/testpg``, in a fresh schema and a
fresh node role that are dropped afterwards)::

    .venv/bin/python benchmarks/bench_pg_transport.py --jobs 3000 --gpus 1 4 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_collect import make_record  # noqa: E402
from inbox_fixtures import InboxDb, inbox_db  # noqa: E402
from store_fixtures import FakeAccounting, make_job  # noqa: E402

from slurm_gpu.capture import spool  # noqa: E402
from slurm_gpu.capture.pgship import ship_postgresql  # noqa: E402
from slurm_gpu.capture.ship import ship  # noqa: E402
from slurm_gpu.collector import Collector, CollectorOptions  # noqa: E402
from slurm_gpu.store import Store  # noqa: E402
from slurm_gpu.store.inbox import PgInbox  # noqa: E402

NODES = ("bn1", "bn2", "bn3")
FIRST_ID = 20_000_000


def fill_spools(root: Path, n_jobs: int, n_gpus: int) -> dict[str, str]:
    """Sealed records of ``n_jobs`` jobs, round robin over the three nodes' spools; returns
    job id -> host."""
    rng = random.Random(n_jobs * 31 + n_gpus)
    templates = {
        h: [spool.encode_record(make_record("0", h, n_gpus, rng)) for _ in range(10)] for h in NODES
    }
    hosts = {}
    for i in range(n_jobs):
        jid, host = str(FIRST_ID + i), NODES[i % 3]
        d = root / host / jid
        d.mkdir(parents=True)
        data = templates[host][i % 10].replace(b'"job_id":"0"', f'"job_id":"{jid}"'.encode())
        (d / f"{host}.record").write_bytes(data)
        hosts[jid] = host
    return hosts


def _timed(obj: Any, name: str, totals: dict[str, float], key: str) -> None:
    inner: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t

    setattr(obj, name, wrapper)


def collector_proc(
    db: InboxDb,
    root: str,
    hosts: dict[str, str],
    n_gpus: int,
    start: Any,
    out: Any,
    transport: str,
) -> None:
    totals: dict[str, float] = {}
    _timed(PgInbox, "pending", totals, "read rows")
    _timed(spool, "decode_record", totals, "decode")
    _timed(Collector, "_keep_inbox_records", totals, "done/ copies")
    _timed(Store, "write_batch", totals, "store transaction")
    jobs = {jid: make_job(jid, gpus=n_gpus, nodes=(h,)) for jid, h in hosts.items()}
    empty = Path(root) / "collector-spool"
    empty.mkdir(exist_ok=True)
    pg = transport == "postgresql"
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    stored = 0
    with Store.open(db.url) as store:
        collector = Collector(
            store=store,
            accounting=FakeAccounting(jobs),
            spool_dir=str(empty) if pg else str(Path(root) / "inbox"),
            state_dir=str(Path(root) / "state"),
            options=CollectorOptions(batch_size=500),
            inbox=PgInbox(store.engine) if pg else None,
        )
        passes = 0
        while stored < len(jobs):
            report = collector.run_once(missing_pass=False)
            passes += 1
            stored += len(report.ingested)
            if not report.ingested:
                time.sleep(0.02)
    out.put(
        (
            "collector",
            {
                "wall": time.perf_counter() - t0,
                "cpu": time.process_time() - c0,
                "stored": stored,
                "passes": passes,
                **totals,
            },
        )
    )


def shipper_proc(db: InboxDb, root: str, host: str, start: Any, out: Any, transport: str) -> None:
    target = db.target()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    if transport == "postgresql":
        result = ship_postgresql(str(Path(root) / host), target)
    else:
        result = ship(str(Path(root) / host), str(Path(root) / "inbox"))
    out.put(
        (
            host,
            {
                "wall": time.perf_counter() - t0,
                "cpu": time.process_time() - c0,
                "shipped": len(result.shipped),
                "failed": len(result.failed),
            },
        )
    )


def run(n_jobs: int, n_gpus: int, workdir: Path, transport: str) -> dict[str, Any]:
    root = workdir / f"run-{n_jobs}-{n_gpus}-{time.monotonic_ns()}"
    hosts = fill_spools(root, n_jobs, n_gpus)
    (root / "inbox").mkdir(mode=0o700)
    size = (root / NODES[0] / str(FIRST_ID) / f"{NODES[0]}.record").stat().st_size
    ctx = multiprocessing.get_context("fork")
    with inbox_db(workdir, hosts=NODES) as db:
        start, out = ctx.Event(), ctx.Queue()
        args = (db, str(root), hosts, n_gpus, start, out, transport)
        procs = [ctx.Process(target=collector_proc, args=args)]
        procs += [
            ctx.Process(target=shipper_proc, args=(db, str(root), h, start, out, transport))
            for h in NODES
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)  # every process imported and waiting
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        start.set()
        results = dict(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
        left = db.scalar("SELECT count(*) FROM record_inbox")
        stored = db.scalar("SELECT count(*) FROM jobs")
    c = results["collector"]
    ships = [results[h] for h in NODES]
    if stored != n_jobs or left != 0 or any(s["failed"] for s in ships):
        raise SystemExit(f"stored {stored} of {n_jobs}, {left} left in the inbox: {results}")
    return {
        "load": load,
        "record_kb": size / 1000,
        "end_to_end_jobs_per_s": n_jobs / max(wall, c["wall"]),
        "shipped_per_s": n_jobs / max(s["wall"] for s in ships),
        "ship_ms_per_record": statistics.mean(s["wall"] / s["shipped"] for s in ships) * 1e3,
        "ship_cpu_ms_per_record": statistics.mean(s["cpu"] / s["shipped"] for s in ships) * 1e3,
        "collector_cpu_ms_per_job": c["cpu"] / n_jobs * 1e3,
        "passes": c["passes"],
        "steps_ms_per_job": {
            k: c.get(k, 0.0) / n_jobs * 1e3
            for k in ("read rows", "decode", "done/ copies", "store transaction")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[3000])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    ap.add_argument(
        "--transports",
        nargs="+",
        choices=("postgresql", "directory"),
        default=["postgresql"],
        help="run each configuration with these transports, alternately",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pg-transport-") as tmp:
        print(f"{args.repeat} run(s) each; 3 shippers and 1 collector, started together")
        print(
            "| transport | jobs | GPUs/job | record KB | end to end jobs/s median (min–max) | "
            "shipped records/s (3 nodes) | ship ms/record (CPU) | collector CPU ms/job | "
            "collector ms/job: read rows / decode / done copies / store transaction | "
            "load avg (1 min) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for n_gpus in args.gpus:
            for n in args.jobs:
                by: dict[str, list[dict[str, Any]]] = {t: [] for t in args.transports}
                for _ in range(args.repeat):
                    for t in args.transports:
                        by[t].append(run(n, n_gpus, Path(tmp), t))
                for t, runs in by.items():
                    row(t, n, n_gpus, runs)


def row(transport: str, n: int, n_gpus: int, runs: list[dict[str, Any]]) -> None:
    """One Markdown table row: medians of ``runs``."""
    rates = sorted(r["end_to_end_jobs_per_s"] for r in runs)
    med = statistics.median
    steps = " / ".join(
        f"{med(r['steps_ms_per_job'][k] for r in runs):.2f}" for k in runs[0]["steps_ms_per_job"]
    )
    loads = [r["load"] for r in runs]
    print(
        f"| {transport} | {n:,} | {n_gpus} | {runs[0]['record_kb']:.0f} | {med(rates):.0f} "
        f"({rates[0]:.0f}–{rates[-1]:.0f}) | "
        f"{med(r['shipped_per_s'] for r in runs):.0f} | "
        f"{med(r['ship_ms_per_record'] for r in runs):.2f} "
        f"({med(r['ship_cpu_ms_per_record'] for r in runs):.2f}) | "
        f"{med(r['collector_cpu_ms_per_job'] for r in runs):.2f} | {steps} | "
        f"{min(loads):.1f}–{max(loads):.1f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
