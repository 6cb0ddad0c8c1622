"""EpilogSlurmctld through each version's real controller (issue 27, point 8; docs/store.md,
"From EpilogSlurmctld").

The lab's slurm.conf names the shipped ``share/slurm/epilog-slurmctld.sh`` as the site installs
it (``/opt/slurm-gpu/share/...``, rendered with the lab's paths by ``share/testlab/start``, with
the sudoers line it documents). slurmctld runs it as SlurmUser for every ended job, array
tasks included. It acts only while the queue directory exists, which this test creates and
removes, so the other lab tests keep collecting by hand.

The jobs' records are on the compute hosts; shipping them to the inbox is a node timer's job,
which this test does every few seconds while the drainer waits. A burst of job ends must
never run more than one root drainer at a time, must keep no task in COMPLETING for it, and
must leave every task stored and the queue empty.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import PROJECT_BIN, Lab

TASKS = 8
DRAINER = f"{PROJECT_BIN}/slurm-gpu --config /etc/slurm-gpu/config.toml collect --queue"


def _drainers(lab: Lab) -> set[int]:
    """Root's ``slurm-gpu ... collect --queue`` interpreters chrooted into this lab's root
    (not the ``sudo`` that starts each, nor SlurmUser's wrapper shell, nor the other lab's).

    A drainer runs ``sacct`` through ``subprocess``: between its fork and its exec the child
    carries the drainer's command line, so a process whose parent is itself a drainer is that
    fleeting child, not a second drainer, and is not counted."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.stat(f"/proc/{name}").st_uid != 0:
                continue
            argv = Path(f"/proc/{name}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if os.path.basename(argv[0]) == b"sudo" or DRAINER.encode() not in b" ".join(argv):
                continue
            if os.readlink(f"/proc/{name}/root") != str(lab.root):
                continue
            # The parent pid is the second field after the parenthesised command name.
            stat = Path(f"/proc/{name}/stat").read_text()
            parents[int(name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return {pid for pid, parent in parents.items() if parent not in parents}


@pytest.fixture
def queue(lab: Lab) -> Iterator[Path]:
    """The lab's queue directory, SlurmUser's (0700), for this test only."""
    assert (lab.root / "etc" / "sudoers.d" / "slurm-gpu-lab").exists(), "no sudoers line"
    path = lab.root / "var" / "spool" / "slurm-gpu-queue"
    shutil.rmtree(path, ignore_errors=True)
    lab.run(
        [
            "install",
            "-d",
            "-o",
            "slurm",
            "-g",
            "slurm",
            "-m",
            "0700",
            str(path)[len(str(lab.root)) :],
        ]
    )
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        deadline = time.monotonic() + 180
        while _drainers(lab) and time.monotonic() < deadline:
            time.sleep(0.5)


def _stored(lab: Lab, job_ids: list[str]) -> set[str]:
    db = lab.root / "var" / "lib" / "slurm-gpu" / "slurm-gpu.db"
    if not db.exists():
        return set()  # a lab built anew: the first drainer has not created the store yet
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        marks = ",".join("?" * len(job_ids))
        rows = conn.execute(f"SELECT job_id FROM jobs WHERE job_id IN ({marks})", job_ids)
        return {r[0] for r in rows}


def _raw_ids(lab: Lab, array_id: str) -> list[str]:
    out = lab.run(["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobIDRaw"]).stdout.split()
    return sorted(set(out))


def test_a_burst_of_job_ends_runs_one_drainer_at_a_time_and_stores_every_task(
    lab: Lab, queue: Path
) -> None:
    array_id = lab.submit(
        "#!/bin/bash\nsleep 3\n",
        args=[f"--array=1-{TASKS}", "--gres=gpu:1", "--cpus-per-task=1", "--mem=200M", "--time=5"],
    )
    seen: set[int] = set()
    most = 0
    completing_since: dict[str, float] = {}
    longest_completing = 0.0
    raw: list[str] = []
    last_ship = 0.0
    deadline = time.monotonic() + 420
    while True:
        now = time.monotonic()
        running = _drainers(lab)
        seen |= running
        most = max(most, len(running))
        states = lab.run(["squeue", "-h", "-j", array_id, "-o", "%i %T"], check=False).stdout
        for line in filter(None, states.split("\n")):
            jid, state = line.split()
            if state == "COMPLETING":
                completing_since.setdefault(jid, now)
                longest_completing = max(longest_completing, now - completing_since[jid])
        if now - last_ship > 3:  # the nodes' ship timer
            for node in lab.nodes:
                lab.slurm_gpu("ship", node=node)
            last_ship = time.monotonic()
        if len(raw) < TASKS:
            raw = _raw_ids(lab, array_id)
        done = len(raw) == TASKS and _stored(lab, raw) == set(raw)
        if done and not any(queue.glob("[1-9]*")) and not running:
            break
        assert now < deadline, (
            f"[{lab.version}] after 420 s: {len(_stored(lab, raw))} of {TASKS} stored, "
            f"queue {sorted(p.name for p in queue.iterdir())}, drainers {sorted(running)}"
        )
        time.sleep(0.3)
    assert seen, "no drainer was ever started by EpilogSlurmctld"
    assert most == 1, f"{most} drainers at once"
    assert longest_completing < 30, longest_completing
    log = (lab.root / "var" / "log" / "slurm-gpu" / "collect-queue.log").read_text()
    assert "Traceback" not in log, log[-2000:]
