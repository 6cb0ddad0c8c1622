"""The sampler's look for its job's slurmstepd (``JobLifeBound``), over a fake /proc.

A sampler no epilog stopped ends once every slurmstepd of its job seen running has exited.
It looks once a minute; listing /proc and reading a file per process of the node each time
cost more than a reading of eight GPUs at the default 10 s interval (issue 29), so the
slurmstepds once found are looked at first and /proc is listed only when they are gone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from slurm_gpu.hooks.common import job_stepd_running, job_stepds
from slurm_gpu.hooks.sampler import StepdWatch

ME = os.geteuid()


def _process(root: Path, pid: int, comm: str, cmdline: str, start: int) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline.encode() + b"\0")
    fields = ["S", "1"] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


def _node(root: Path) -> None:
    _process(root, 1, "systemd", "/sbin/init", 1)
    _process(root, 300, "python", "python train.py", 900)
    _process(root, 400, "slurmstepd", "slurmstepd: [56.batch]", 950)  # another job's
    (root / "self").mkdir()


def test_the_stepds_of_the_job_by_pid_and_start(tmp_path: Path) -> None:
    _node(tmp_path)
    _process(tmp_path, 100, "slurmstepd", "slurmstepd: [55.extern]", 800)
    _process(tmp_path, 101, "slurmstepd", "slurmstepd: [55.batch]", 810)
    assert job_stepds("55", str(tmp_path), owner_uid=ME) == {100: 800, 101: 810}
    assert job_stepds("5", str(tmp_path), owner_uid=ME) == {}
    assert job_stepds("55", str(tmp_path), owner_uid=ME + 1) == {}  # not root's: not one
    assert job_stepd_running("55", str(tmp_path)) == (ME == 0)


def test_a_known_stepd_is_looked_at_alone_and_proc_listed_when_it_is_gone(
    tmp_path: Path,
) -> None:
    _node(tmp_path)
    watch = StepdWatch(str(tmp_path), owner_uid=ME)
    assert not watch("55") and watch.listings == 1  # not started yet: listed each time
    _process(tmp_path, 100, "slurmstepd", "slurmstepd: [55.extern]", 800)
    assert watch("55") and watch.listings == 2
    for _ in range(5):
        assert watch("55")
    assert watch.listings == 2  # one stat read per look while it runs
    # It exits; a step started meanwhile has a slurmstepd of its own: found by a listing.
    shutil.rmtree(tmp_path / "100")
    _process(tmp_path, 120, "slurmstepd", "slurmstepd: [55.0]", 1200)
    assert watch("55") and watch.listings == 3 and watch.known == {120: 1200}
    # Its pid reused by another process (another start time): not the job's.
    shutil.rmtree(tmp_path / "120")
    _process(tmp_path, 120, "python", "python other.py", 1500)
    assert not watch("55") and watch.listings == 4
