"""Records reach the collector through PostgreSQL on the version lab, with no directory shared
between the nodes and the collector (issue 12, part 3; docs/transport.md).

``share/testlab/pg start VERSION`` starts the lab's own PostgreSQL on the bridge address and
writes, in the root, a node configuration (``/etc/slurm-gpu/ship-pg.toml``: transport
postgresql, no ``inbox_dir``, the insert-only role ``slurmgpu_node`` with a root-owned 0600
password file) and the collector's (``/etc/slurm-gpu/collect-pg.toml``, its store on that
server). Each node runs ``slurm-gpu --config ship-pg.toml ship`` inside its own namespaces, as
a node timer would; the collector runs in the root on the controller.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import PROJECT_BIN, REPO, Lab

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.store import Store
from slurm_gpu.store.rows import StoredJob

PG_SCRIPT = REPO / "share" / "testlab" / "pg"
SHIP_CONFIG = "/etc/slurm-gpu/ship-pg.toml"
COLLECT_CONFIG = "/etc/slurm-gpu/collect-pg.toml"


@pytest.fixture
def pg_url(lab: Lab) -> Iterator[str]:
    """The lab's PostgreSQL started and set up for ``lab``; the collector's store URL."""
    proc = subprocess.run(
        [str(PG_SCRIPT), "start", lab.version], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"share/testlab/pg start failed:\n{proc.stdout}\n{proc.stderr}")
    config = tomllib.loads((lab.root / COLLECT_CONFIG.lstrip("/")).read_text())
    yield str(config["store"]["url"])


def _ship(lab: Lab, node: str) -> subprocess.CompletedProcess[str]:
    return lab.run([f"{PROJECT_BIN}/slurm-gpu", "--config", SHIP_CONFIG, "ship"], node=node)


def _collect(lab: Lab, job_id: str) -> dict[str, list[str]]:
    argv = [f"{PROJECT_BIN}/slurm-gpu", "--config", COLLECT_CONFIG, "collect", "--job", job_id]
    proc = lab.run([*argv, "--wait", "60", "--json"], timeout_s=240)
    report: dict[str, list[str]] = json.loads(proc.stdout.splitlines()[-1])
    return report


def _stored(url: str, job_id: str) -> StoredJob:
    with Store.open(url, migrate=False) as store:
        got = store.get_job(job_id)
    assert got is not None, f"job {job_id} is not in the PostgreSQL store"
    return got


def _inbox_hosts(url: str, job_id: str) -> list[str]:
    with Store.open(url, migrate=False) as store, store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT host FROM record_inbox WHERE job_id = %(j)s ORDER BY host", {"j": job_id}
        ).all()
    return [str(r[0]) for r in rows]


def _two_node_job(lab: Lab) -> tuple[str, list[str]]:
    job_id = lab.submit(
        "#!/bin/bash\n#SBATCH --job-name=lab-pg -N2 --ntasks-per-node=1 --cpus-per-task=1\n"
        "#SBATCH --gres=gpu:4 --mem=400M --time=00:05:00\n"
        f"srun {PROJECT_BIN}/python -m slurm_gpu.demo healthy --duration 8\n"
    )
    assert lab.wait_done(job_id) == "COMPLETED"
    nodes = list(expand_hostlist(lab.sacct_fields(job_id, ["NodeList"])["NodeList"]))
    assert len(nodes) == 2 and set(nodes) <= set(lab.nodes), nodes
    for node in nodes:
        lab.wait_record(job_id, node)
    return job_id, nodes


def _mounts_of_node(lab: Lab, node: str) -> list[tuple[str, str]]:
    """(source root, mount point) of every mount inside the lab's root, in the namespace of
    the node's slurmd (where its shipper runs)."""
    found = []
    for line in Path(f"/proc/{lab.slurmd_pid(node)}/mountinfo").read_text().splitlines():
        fields = line.split()
        source_root, point = fields[3], fields[4]
        if point.startswith(f"{lab.root}/"):
            found.append((source_root, point))
    return found


def _assert_nothing_shared(lab: Lab, nodes: list[str]) -> None:
    ship = tomllib.loads((lab.root / SHIP_CONFIG.lstrip("/")).read_text())
    collect = tomllib.loads((lab.root / COLLECT_CONFIG.lstrip("/")).read_text())
    assert ship["paths"]["inbox_dir"] == "" and collect["paths"]["inbox_dir"] == ""
    assert ship["ship"]["transport"] == "postgresql" == collect["ship"]["transport"]
    password = lab.root / "etc" / "slurm-gpu" / "inbox.password"
    st = password.stat()
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    # What a node mounts in the root is its own (spool, log, fake_gpus.conf) or the kernel's
    # (/proc, /sys, /dev): no directory another host also has.
    system = tuple(f"{lab.root}/{d}" for d in ("proc", "sys", "dev"))
    for node in nodes:
        for source, point in _mounts_of_node(lab, node):
            if point == str(lab.root) or point.startswith(system):
                continue
            assert f"/srv/nodes/{node}/" in source + "/", (node, source, point)


def test_two_node_job_reaches_the_store_through_postgresql_only(lab: Lab, pg_url: str) -> None:
    job_id, nodes = _two_node_job(lab)
    _assert_nothing_shared(lab, nodes)
    for node in nodes:
        _ship(lab, node)
        assert not (lab.spool(node) / job_id / f"{node}.record").exists()
    assert _inbox_hosts(pg_url, job_id) == sorted(nodes)
    assert not (lab.root / "srv" / "inbox" / job_id).exists()  # the directory inbox is unused

    report = _collect(lab, job_id)
    assert report["ingested"] == [job_id], report
    assert _inbox_hosts(pg_url, job_id) == []  # taken in the store's transaction
    stored = _stored(pg_url, job_id)
    assert stored.missing_hosts == ()
    assert sorted(n.hostname for n in stored.nodes) == sorted(nodes)
    assert all(n.complete and len(n.gpus) == 4 for n in stored.nodes)
    assert all(g.utilization.mean and g.utilization.mean > 10 for n in stored.nodes for g in n.gpus)


def _wait_lock_waiter(url: str, timeout_s: float = 30.0) -> None:
    """Until the node role's INSERT waits on the lock the test holds."""
    deadline = time.monotonic() + timeout_s
    with Store.open(url, migrate=False) as store, store.engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks "
                "WHERE NOT granted AND relation = 'record_inbox'::regclass"
            ).scalar_one()
            conn.rollback()
            if waiting:
                return
            time.sleep(0.1)
    raise AssertionError("the shipper's INSERT never waited on the lock")


def test_shipper_sigkilled_mid_push_loses_nothing(lab: Lab, pg_url: str) -> None:
    """The first node's shipper is SIGKILLed while its INSERT waits on a lock the test holds
    on record_inbox (before the commit): the record stays in its spool, and the next pass
    ships it (a no-op where the orphaned INSERT committed after all); the job is stored
    whole, each node's record once."""
    job_id, nodes = _two_node_job(lab)
    victim, other = nodes
    record = lab.spool(victim) / job_id / f"{victim}.record"
    with Store.open(pg_url, migrate=False) as store, store.engine.connect() as locker:
        locker.exec_driver_sql("LOCK TABLE record_inbox IN ACCESS EXCLUSIVE MODE")
        nsenter, chroot = shutil.which("nsenter"), shutil.which("chroot")
        assert nsenter and chroot
        argv = [nsenter, "-t", str(lab.slurmd_pid(victim)), "-n", "-u", "-m", chroot]
        argv += [str(lab.root), "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
        argv += [f"{PROJECT_BIN}/slurm-gpu", "--config", SHIP_CONFIG, "ship"]
        # nsenter (no --fork), chroot and env exec: the child's pid is the shipper's.
        shipper = subprocess.Popen(argv, cwd="/", stdout=subprocess.DEVNULL, env={})
        try:
            _wait_lock_waiter(pg_url)
            os.kill(shipper.pid, signal.SIGKILL)
        finally:
            shipper.wait(timeout=30)
            locker.rollback()
    assert shipper.returncode == -signal.SIGKILL
    assert record.exists(), "a record left its spool without a commit"
    # The server notices a dead client only when it answers it: the waiting INSERT may still
    # commit once the lock goes. Either way the record is still on the node, and only once
    # in the inbox.
    assert _inbox_hosts(pg_url, job_id) in ([], [victim])

    _ship(lab, other)
    _ship(lab, victim)  # the node timer's next pass
    assert not record.exists()
    assert _inbox_hosts(pg_url, job_id) == sorted(nodes)
    report = _collect(lab, job_id)
    assert report["ingested"] == [job_id], report
    stored = _stored(pg_url, job_id)
    assert stored.missing_hosts == ()
    assert sorted(n.hostname for n in stored.nodes) == sorted(nodes)
    assert sum(len(n.gpus) for n in stored.nodes) == 8
