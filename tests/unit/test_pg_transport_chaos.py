"""Crash safety of the PostgreSQL transport: SIGKILL a node's shipper or the collector at
random points; afterwards every record is stored exactly once and none is lost.

Three nodes (three spools, as three hosts would have) push their sealed records into the
inbox of a real PostgreSQL store while the collector takes them, each a real process (forked).
In every trial one of the four is the victim: it is SIGKILLed after a random delay within the
length of its uninterrupted run. Then the timers' next runs (every shipper, then the
collector) finish the work, and the whole store is compared, row by row, with the store of an
uninterrupted run: with a fixed clock the two are identical when nothing was lost or
duplicated. The inbox and its quarantine are empty and no record is left on a node.
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inbox_fixtures import InboxDb, inbox_db
from store_fixtures import FakeAccounting, dump_db, make_job, make_node

from slurm_gpu.capture import spool
from slurm_gpu.capture.pgship import ship_postgresql
from slurm_gpu.collector import Collector, CollectorLock, CollectorOptions
from slurm_gpu.store import Store
from slurm_gpu.store.inbox import PgInbox

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not glob.glob("/usr/lib/postgresql/*/bin/psql"), reason="needs PostgreSQL's psql"
    ),
]

NODES = ("n1", "n2", "n3")
JOBS = 15
NOW = 1_700_000_100.0 + 7200
KILLED_TRIALS = 50


def _hosts(i: int) -> tuple[str, ...]:
    """Jobs on one node, and every fourth on two (whose records come from two shippers)."""
    if i % 4 == 0:
        return (NODES[i % 3], NODES[(i + 1) % 3])
    return (NODES[i % 3],)


def _accounting() -> FakeAccounting:
    return FakeAccounting(
        {str(7000 + i): make_job(str(7000 + i), gpus=1, nodes=_hosts(i)) for i in range(JOBS)}
    )


def _make_template(root: Path) -> None:
    for i in range(JOBS):
        jid = str(7000 + i)
        for host in _hosts(i):
            js = spool.JobSpool(str(root / host), jid, host)
            js.create_dir()
            spool.write_record(js.record, make_node(jid, host, gpus=1, timeline_points=16))
            Path(js.jsonl).write_text("{}\n")


def _ship(db: InboxDb, root: Path, host: str) -> None:
    ship_postgresql(str(root / host), db.target(connect_timeout_s=5, statement_timeout_s=10))


def _collect(db: InboxDb, root: Path) -> None:
    """One pass, as ``slurm-gpu collect --once`` runs it: lock, open the store, collect."""
    state = root / "state"
    (root / "collector-spool").mkdir(exist_ok=True)
    lock = CollectorLock(str(state))
    assert lock.acquire()
    try:
        with Store.open(db.url) as store:
            Collector(
                store=store,
                accounting=_accounting(),
                spool_dir=str(root / "collector-spool"),
                state_dir=str(state),
                options=CollectorOptions(batch_size=4, node_wait_s=1e9, missing_grace_s=600),
                clock=lambda: NOW,
                inbox=PgInbox(store.engine),
            ).run_once(missing_pass=False)
    finally:
        lock.release()


def _in_child(work: Callable[[], None]) -> None:
    work()
    os._exit(0)


def _reset(db: InboxDb, template: Path, root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(template, root)
    engine = sa.create_engine(db.url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "TRUNCATE jobs, job_hosts, job_gpus, timelines, findings, job_reports, "
                "record_inbox, record_quarantine"
            )
    finally:
        engine.dispose()


def _left_on_nodes(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for h in NODES for p in (root / h).rglob("*.record"))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxDb]:
    with inbox_db(tmp_path_factory.mktemp("chaos")) as made:
        yield made


def test_sigkill_of_a_shipper_or_the_collector_loses_and_duplicates_nothing(
    db: InboxDb, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("fork")
    template = tmp_path / "template"
    _make_template(template)
    root = tmp_path / "trial"
    works: dict[str, Callable[[], None]] = {
        **{h: (lambda h=h: _ship(db, root, h)) for h in NODES},  # type: ignore[misc]
        "collector": lambda: _collect(db, root),
    }

    # The reference: the nodes ship, then the collector takes; timed to choose kill delays.
    _reset(db, template, root)
    duration: dict[str, float] = {}
    for name in (*NODES, "collector"):
        t0 = time.monotonic()
        p = ctx.Process(target=_in_child, args=(works[name],))
        p.start()
        p.join()
        duration[name] = time.monotonic() - t0
        assert p.exitcode == 0, name
    reference = dump_db(db.url)
    assert len(reference["jobs"]) == JOBS
    assert len(reference["job_hosts"]) == sum(len(_hosts(i)) for i in range(JOBS))
    assert _left_on_nodes(root) == []

    rng = random.Random(20261125)
    killed: dict[str, int] = {}
    trials = 0
    while sum(killed.values()) < KILLED_TRIALS:
        trials += 1
        assert trials < 4 * KILLED_TRIALS, "the victims always finished before the kill"
        _reset(db, template, root)
        victim = rng.choice((*NODES, "collector"))
        # Every process of the trial runs at once: shippers push while the collector takes.
        procs = {name: ctx.Process(target=_in_child, args=(works[name],)) for name in works}
        for p in procs.values():
            p.start()
        time.sleep(rng.uniform(0, duration[victim]))
        pid = procs[victim].pid
        assert pid is not None
        # A victim that already finished (and was reaped) is no kill: the trial still checks
        # recovery, and only real kills count towards KILLED_TRIALS.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for p in procs.values():
            p.join()
        if procs[victim].exitcode == -signal.SIGKILL:
            killed[victim] = killed.get(victim, 0) + 1
        for name, p in procs.items():
            assert name == victim or p.exitcode == 0, (trials, name, p.exitcode)
        # Recovery: each timer's next run.
        for host in NODES:
            _ship(db, root, host)
        _collect(db, root)
        assert dump_db(db.url) == reference, f"trial {trials} ({victim} killed): store differs"
        assert _left_on_nodes(root) == [], f"trial {trials}: records left on a node"
        assert db.scalar("SELECT count(*) FROM record_inbox") == 0
        assert db.scalar("SELECT count(*) FROM record_quarantine") == 0
    # Both sides were killed, many times each.
    assert killed.get("collector", 0) >= 5 and sum(killed[h] for h in NODES if h in killed) >= 5
