"""Store write time with the rollback journal (the default) next to WAL, same batches.

Writes four batches of 500 one-GPU jobs (360 timeline points each) into a fresh SQLite store,
once with the store's own settings (``journal_mode = DELETE``, ``synchronous = FULL``) and once
with the settings of earlier releases (WAL, ``synchronous = NORMAL``), twice each, alternating.
Prints the median batch write time. Usage::

    python benchmarks/bench_store_journal.py [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from sqlalchemy import Connection, Engine, event
from store_fixtures import make_job, make_node

import slurm_gpu.store.store as store_mod
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

_OWN_SETUP = store_mod._sqlite_setup


def _wal_setup(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp", help="where the scratch stores go")
    ap.add_argument("--smoke", action="store_true", help="batches of 20 jobs, one run each")
    args = ap.parse_args()
    size, rounds = (20, 1) if args.smoke else (500, 2)
    batches = [
        [
            JobBundle(
                make_job(str(b * size + i), gpus=1),
                (make_node(str(b * size + i), timeline_points=360),),
                TELEMETRY_COMPLETE,
            )
            for i in range(size)
        ]
        for b in range(4)
    ]
    runs = (("rollback journal, FULL", _OWN_SETUP), ("WAL, NORMAL", _wal_setup)) * rounds
    print("| settings | journal mode | median time per batch |")
    print("|---|---|---|")
    for name, setup in runs:
        store_mod._sqlite_setup = setup  # type: ignore[assignment]
        scratch = tempfile.mkdtemp(dir=args.dir)
        try:
            store = Store.open(f"sqlite:///{scratch}/s.db")
            times = []
            for batch in batches:
                start = time.perf_counter()
                store.write_batch(batch, collected_at_s=1.0)
                times.append(time.perf_counter() - start)
            with store.engine.connect() as conn:
                mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
            store.close()
        finally:
            shutil.rmtree(scratch)
        print(f"| {name} | {mode} | {statistics.median(times):.3f} s ({size}-job batches) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
