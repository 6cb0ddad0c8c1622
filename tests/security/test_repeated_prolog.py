"""A repeated prolog leaves an orphan root sampler (issue 27, point 2).

A second prolog for the same job and node started another sampler and recorded it in place
of the first; the epilog stopped only the recorded one. With the /proc method the orphan
never saw its job end: it ran as root for good and kept rewriting the ended job's live file.
Now the prolog keeps a live sampler of the job (pid file plus start time and command line, or
any found in /proc), the epilog stops every sampler of the job, and a sampler no epilog stops
ends with its job's slurmstepd or its projected end (``JobLifeBound``). Real prolog, sampler
and epilog processes on virtual GPUs; needs root, like the hooks.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from test_node_side import _job_id, _started, paths_of, run_hook

from slurm_gpu.capture.spool import JobSpool, read_record, write_pidfile
from slurm_gpu.hooks.common import JobEnv, read_cmdline
from slurm_gpu.hooks.epilog import find_job_samplers, wait_gone
from slurm_gpu.hooks.prolog import sampler_command
from slurm_gpu.hooks.sampler import END_MARGIN_S, STEPD_CHECK_S, JobLifeBound
from slurm_gpu.telemetry.virtual_device import create_gpus

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node side runs as root")


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, object]:
    """Virtual GPUs and a configuration, as ``test_node_side``'s site."""
    vdir = tmp_path / "vgpu"
    infos = create_gpus(vdir, 2)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'log_file = "{tmp_path}/log/hooks.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = 0.1\n'
        "checkpoint_interval_s = 1\n[hooks]\nsampler_stop_timeout_s = 3\n"
    )
    return {"tmp": tmp_path, "cfg": cfg, "infos": infos, "vdir": vdir}


def _pids(job: str) -> list[int]:
    """The samplers of ``job`` (a random id: the node may run other samplers, and only this
    test's are looked at or stopped)."""
    return [pid for pid, _start in find_job_samplers(job)]


def _end(site: dict[str, object], job: str) -> None:
    run_hook(site, "epilog", job)
    cfg = str(site["cfg"])
    for pid in _pids(job):  # never leave one of this test's samplers behind
        if cfg in read_cmdline(pid):
            os.kill(pid, 9)
            wait_gone(pid, 5.0)


def test_repeated_prolog_keeps_the_running_sampler_and_starts_no_second(
    site: dict[str, object],
) -> None:
    job = _job_id()
    run_hook(site, "prolog", job, SLURM_JOB_GPUS="0")
    first = _started(site, job)
    try:
        run_hook(site, "prolog", job, SLURM_JOB_GPUS="0")
        assert _pids(job) == [first[0]], "a second sampler of the same job was started"
        assert _started(site, job)[0] == first[0]
        run_hook(site, "epilog", job)
        assert _pids(job) == []
        assert os.path.exists(paths_of(site, job).record)
    finally:
        _end(site, job)


def test_repeated_prolog_finds_the_sampler_when_its_pid_file_is_gone(
    site: dict[str, object],
) -> None:
    """Variant: the pid file no longer names the running sampler (removed, or written by
    an older release): the prolog still finds it in /proc and names it again."""
    job = _job_id()
    run_hook(site, "prolog", job, SLURM_JOB_GPUS="0")
    first = _started(site, job)
    try:
        os.unlink(paths_of(site, job).pid)
        run_hook(site, "prolog", job, SLURM_JOB_GPUS="0")
        assert _pids(job) == [first[0]]
        assert _started(site, job)[0] == first[0]
    finally:
        _end(site, job)


def test_epilog_stops_every_sampler_of_the_job(site: dict[str, object]) -> None:
    """An orphan left by a repeated prolog of an older release (a second sampler of the job
    that no pid file names): the epilog stops it too, and the record is the named one's."""
    job = _job_id()
    run_hook(site, "prolog", job, SLURM_JOB_GPUS="0")
    first = _started(site, job)
    argv = read_cmdline(first[0])
    orphan = subprocess.Popen(argv, cwd="/", start_new_session=True)
    try:
        for _ in range(500):
            if orphan.pid in _pids(job):
                break
            wait_gone(orphan.pid, 0.01)
        assert sorted(_pids(job)) == sorted([first[0], orphan.pid])
        # The orphan rewrote the pid file when it started; the file names the first again,
        # as after the older release's repeated prolog the first one is the orphan.
        write_pidfile(paths_of(site, job).pid, first[0])
        run_hook(site, "epilog", job)
        assert orphan.wait(timeout=10) is not None
        assert _pids(job) == [], "a sampler of the ended job still runs"
        assert os.path.exists(paths_of(site, job).record)
    finally:
        if orphan.poll() is None:
            orphan.kill()
        orphan.wait()
        _end(site, job)


def test_prolog_passes_the_jobs_projected_end_to_the_sampler(site: dict[str, object]) -> None:
    from slurm_gpu.config import load_settings

    env = JobEnv.from_environ({"SLURM_JOB_ID": "704", "SLURM_JOB_END_TIME": "1800000000"})
    assert env.end_time_s == 1_800_000_000
    settings = load_settings(str(site["cfg"]), trusted=False)
    cmd = sampler_command(settings, env, ["GPU-x"], "n1")
    assert cmd[cmd.index("--end-time") + 1] == "1800000000"
    bad = JobEnv.from_environ({"SLURM_JOB_ID": "704", "SLURM_JOB_END_TIME": "1800000000\n"})
    assert bad.end_time_s is None
    assert "--end-time" not in sampler_command(settings, bad, ["GPU-x"], "n1")


class _Host:
    method = "proc"

    def job_gone(self) -> bool:
        return False  # the /proc method cannot tell an ended job from a quiet one


def test_a_sampler_no_epilog_stops_ends_when_its_slurmstepd_is_gone() -> None:
    now = [0.0]
    running = [True]
    bound = JobLifeBound(
        _Host(), "705", None, clock=lambda: now[0], stepd_running=lambda _job: running[0]
    )
    assert not bound.job_gone()
    running[0] = False
    now[0] += STEPD_CHECK_S
    assert bound.job_gone(), "its slurmstepd exited and the sampler would run on"


def test_a_sampler_whose_slurmstepd_never_showed_ends_after_the_jobs_projected_end() -> None:
    """Variant: no slurmstepd seen (the job never started a step here); the job's projected
    end plus the margin bounds the sampler's life instead."""
    now = [1_000.0]
    bound = JobLifeBound(
        _Host(), "706", 2_000.0, clock=lambda: now[0], stepd_running=lambda _job: False
    )
    assert not bound.job_gone()
    now[0] = 2_000.0 + END_MARGIN_S - 1
    assert not bound.job_gone()
    now[0] = 2_000.0 + END_MARGIN_S + 1
    assert bound.job_gone()


def test_epilog_leaves_the_same_jobs_sampler_of_another_node(site: dict[str, object]) -> None:
    """Two slurmd on one host (the version lab's compute hosts, ``--enable-multiple-slurmd``)
    see one /proc: a two-node job has a sampler per node name there. Each node's epilog
    stops its own and leaves the other's to seal its own record (seen in CI: each epilog
    killed the other node's sampler and both records were recovered, not sealed)."""
    job = _job_id()
    nodes = ("lab-n1", "lab-n2")
    for node in nodes:
        run_hook(site, "prolog", job, SLURM_JOB_GPUS="0", SLURMD_NODENAME=node)
    spools = {n: JobSpool(f"{site['tmp']}/spool", job, n) for n in nodes}
    try:
        for node in nodes:
            deadline = time.monotonic() + 20
            while not os.path.exists(spools[node].state):
                assert time.monotonic() < deadline, f"{node}'s sampler never checkpointed"
                time.sleep(0.05)
        assert len(_pids(job)) == 2
        first, second = nodes
        run_hook(site, "epilog", job, SLURMD_NODENAME=first)
        assert len(_pids(job)) == 1, "the epilog of one node stopped the other node's sampler"
        run_hook(site, "epilog", job, SLURMD_NODENAME=second)
        assert _pids(job) == []
        for node in nodes:
            record = read_record(spools[node].record)
            assert record.complete, (node, record.notes)
    finally:
        _end(site, job)
