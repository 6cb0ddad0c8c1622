"""EpilogSlurmctld through the real controller (docs/store.md, "From EpilogSlurmctld";
docs/security.md, "Work triggered per job on the controller is coalesced").

The test cluster's slurm.conf names the shipped ``share/slurm/epilog-slurmctld.sh`` (rendered
with its paths by ``share/testcluster/start``); slurmctld runs it as SlurmUser for every ended
job, array tasks included, and it starts ``slurm-gpu collect --queue`` through the sudoers line
the script documents. It acts only while the queue directory exists, which this test creates
and removes, so the other cluster tests keep collecting by hand.

A burst of job ends must never run more than one root drainer at a time, must keep no job in
COMPLETING, and must leave every job stored and the queue empty.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.config import load_settings

pytestmark = pytest.mark.cluster

TASKS = 12


def _drainers() -> set[int]:
    """The pids of running drainers: root's ``slurm-gpu ... collect --queue`` interpreters
    (not the ``sudo`` that starts each, also root's, nor SlurmUser's wrapper shell).

    Between its fork and its exec, the child a drainer starts ``sacct`` in carries the
    drainer's command line: a match whose parent is itself a match is that child."""
    out = subprocess.run(
        ["pgrep", "-u", "root", "-f", "slurm-gpu --config .* collect --queue"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    parents: dict[int, int] = {}
    for p in out:
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv0 = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0", 1)[0]
            if os.path.basename(argv0) != b"sudo":
                # The parent pid follows the state, after the parenthesised command name.
                stat = Path(f"/proc/{p}/stat").read_text()
                parents[int(p)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return {pid for pid, parent in parents.items() if parent not in parents}


@pytest.fixture
def queue() -> Iterator[Path]:
    """The queue directory, SlurmUser's (0700), for the test only."""
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    if not shutil.which("sudo") or not Path("/etc/sudoers.d/slurm-gpu-testcluster").exists():
        pytest.fail("the test cluster has no sudoers line for the drainer (make deps; start)")
    path = Path(settings.paths.queue_dir)
    slurm = pwd.getpwnam("slurm")
    path.mkdir(mode=0o700)
    os.chown(path, slurm.pw_uid, slurm.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        deadline = time.monotonic() + 120
        while _drainers() and time.monotonic() < deadline:
            time.sleep(0.5)


def _stored(job_ids: list[str]) -> set[str]:
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    db = settings.store_url.removeprefix("sqlite:///")
    if not os.path.exists(db):
        return set()  # a cluster started anew: the first drainer has not created the store yet
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        marks = ",".join("?" * len(job_ids))
        rows = conn.execute(f"SELECT job_id FROM jobs WHERE job_id IN ({marks})", job_ids)
        return {r[0] for r in rows}


def _raw_ids(array_id: str) -> list[str]:
    out = slurmtools.run_as(
        None, ["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobIDRaw"]
    ).stdout.split()
    return sorted(set(out))


def test_a_burst_of_job_ends_runs_one_drainer_at_a_time_and_stores_every_job(
    queue: Path, job_dir: Path
) -> None:
    array_id = slurmtools.submit(
        "#!/bin/sh\nsleep 2\n",
        args=[
            f"--array=1-{TASKS}",
            "--gres=gpu:1",
            "--cpus-per-task=1",
            f"--chdir={job_dir}",
            f"--output={job_dir}/%A_%a.out",
        ],
    )
    seen: set[int] = set()
    most = 0
    completing_since: dict[str, float] = {}
    longest_completing = 0.0
    deadline = time.monotonic() + 300
    raw: list[str] = []
    while True:
        now = time.monotonic()
        running = _drainers()
        seen |= running
        most = max(most, len(running))
        states = slurmtools.run_as(
            None, ["squeue", "-h", "-j", array_id, "-o", "%i %T"], check=False
        ).stdout.split("\n")
        for line in filter(None, states):
            jid, state = line.split()
            if state == "COMPLETING":
                completing_since.setdefault(jid, now)
                longest_completing = max(longest_completing, now - completing_since[jid])
        if not raw or len(raw) < TASKS:
            raw = _raw_ids(array_id)
        done = len(raw) == TASKS and _stored(raw) == set(raw)
        if done and not any(queue.glob("[1-9]*")) and not running:
            break
        assert now < deadline, (
            f"after 300 s: {len(_stored(raw))} of {TASKS} stored, "
            f"queue {sorted(p.name for p in queue.iterdir())}, drainers {sorted(running)}"
        )
        time.sleep(0.2)
    # One drainer at a time, whatever the burst; it ran at all (the controller path was taken).
    assert most == 1, f"{most} drainers at once"
    assert seen, "no drainer was ever started by EpilogSlurmctld"
    # The controller's epilog never waits: no task stays in COMPLETING for it.
    assert longest_completing < 30, longest_completing
