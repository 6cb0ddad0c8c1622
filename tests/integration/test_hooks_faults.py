"""Faults injected on the real test cluster: whatever breaks, the job completes, the node is
not drained, both hooks exit within their budget, and the failure is logged with the job id.

These tests change the cluster's slurm-gpu configuration and always restore it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.capture.spool import JobSpool, read_pidfile, read_record
from slurm_gpu.config import load_settings

pytestmark = pytest.mark.cluster

JOB = """#!/bin/sh
{python} -c '
import time
end = time.process_time() + 1
while time.process_time() < end:
    pass
'
sleep {sleep}
"""


@pytest.fixture
def config() -> Iterator[Path]:
    """The cluster's slurm-gpu config file; restored byte for byte afterwards."""
    path = slurmtools.slurm_gpu_config_path()
    saved = path.read_bytes()
    try:
        yield path
    finally:
        path.write_bytes(saved)


def edit(path: Path, section: str, key: str, value: str) -> None:
    """Set ``key = value`` (TOML literal) in ``[section]`` of the config file."""
    text = path.read_text()
    text = re.sub(rf"(?m)^{key}\s*=.*\n", "", text)
    if f"[{section}]" in text:
        text = text.replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n", 1)
    else:
        text += f"\n[{section}]\n{key} = {value}\n"
    path.write_text(text)


def run_job(job_dir: Path, sleep: float = 4.0) -> str:
    script = JOB.format(python=slurmtools.venv_python(), sleep=sleep)
    return slurmtools.submit(
        script, args=["--gres=gpu:1", f"--chdir={job_dir}", f"--output={job_dir}/%j.out"]
    )


def hook_lines(log_file: str, job_id: str, hook: str, timeout_s: float = 60.0) -> list[str]:
    """The log lines of ``hook`` for the job, once its final line (with a duration) is there."""
    deadline = time.monotonic() + timeout_s
    pattern = re.compile(rf"job={job_id} {hook}: .*\((\d+\.\d+)s\)$")
    while True:
        with contextlib.suppress(OSError):
            lines = [
                line for line in Path(log_file).read_text().splitlines() if pattern.search(line)
            ]
            if lines:
                return lines
        assert time.monotonic() < deadline, f"no final {hook} line for job {job_id} in {log_file}"
        time.sleep(0.3)


def assert_survived(job_id: str, log_file: str, budget_s: float = 20.0) -> tuple[str, str]:
    """The job COMPLETED, the node is not drained, both hooks logged a final line with a
    duration within budget. Returns the two final lines."""
    assert slurmtools.wait_done(job_id, timeout_s=240) == "COMPLETED"
    out = []
    for hook in ("prolog", "epilog"):
        line = hook_lines(log_file, job_id, hook)[-1]
        seconds = float(re.search(r"\((\d+\.\d+)s\)$", line).group(1))  # type: ignore[union-attr]
        assert seconds < budget_s, line
        out.append(line)
    state = slurmtools.node_state()
    assert "drain" not in state and "down" not in state, state
    return out[0], out[1]


def spool_paths(job_id: str) -> JobSpool:
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    return JobSpool(settings.paths.spool_dir, job_id, slurmtools.node_name())


def running_sampler(job_dir: Path, sleep: float, started: str) -> tuple[str, JobSpool, int]:
    """A job sleeping ``sleep`` s, once its sampler has written ``started`` (a name of its
    ``JobSpool``) and read a little more: (job id, its spool paths, the sampler's pid)."""
    job_id = run_job(job_dir, sleep=sleep)
    paths = spool_paths(job_id)
    wait_for(getattr(paths, started), timeout_s=120)
    time.sleep(1.5)
    pid = read_pidfile(paths.pid)[0]  # type: ignore[index]
    return job_id, paths, pid


def wait_for(path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def log_file() -> str:
    return load_settings(str(slurmtools.slurm_gpu_config_path())).paths.log_file


def test_virtual_gpus_missing(config: Path, job_dir: Path) -> None:
    """The NVML-unavailable analogue: the telemetry source cannot be opened."""
    edit(config, "telemetry", "virtual_dir", f'"{slurmtools.tc_root()}/no-such-vgpu"')
    job_id = run_job(job_dir, sleep=2)
    prolog, _epilog = assert_survived(job_id, log_file())
    assert "TelemetryUnavailableError" in prolog


def test_spool_dir_unwritable(config: Path, job_dir: Path, tmp_path: Path) -> None:
    blocker = slurmtools.tc_root() / "not-a-dir"
    blocker.write_text("a file where the spool directory should be\n")
    try:
        edit(config, "paths", "spool_dir", f'"{blocker}/spool"')
        job_id = run_job(job_dir, sleep=2)
        prolog, _ = assert_survived(job_id, log_file())
        assert "failed" in prolog and "Not a directory" in prolog
    finally:
        blocker.unlink()


def test_disk_full(config: Path, job_dir: Path) -> None:
    mnt = slurmtools.tc_root() / "tiny-spool"
    mnt.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k,mode=0700", "tmpfs", str(mnt)], check=True
    )
    try:
        edit(config, "paths", "spool_dir", f'"{mnt}"')
        job_id = run_job(job_dir, sleep=8)
        paths = JobSpool(str(mnt), job_id, slurmtools.node_name())
        wait_for(paths.jsonl)
        # Fill the file system while the sampler writes.
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=4096"], check=False, capture_output=True
        )
        assert_survived(job_id, log_file())
        log = Path(log_file()).read_text()
        assert re.search(rf"job={job_id} .*No space left on device", log), "ENOSPC not logged"
        (mnt / "filler").unlink()
        # With room again the record is there if the sampler or the epilog could seal it.
        if os.path.exists(paths.record):
            assert any(n.startswith("spool_write_failed") for n in read_record(paths.record).notes)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(mnt, ignore_errors=True)


def test_broken_config(config: Path, job_dir: Path) -> None:
    log = log_file()
    config.write_text(config.read_text() + "\n[telemetry\nthis is = = not toml\n")
    job_id = run_job(job_dir, sleep=1)
    prolog, epilog = assert_survived(job_id, log)
    assert "configuration unusable" in prolog and "configuration unusable" in epilog


def test_sampler_killed_mid_job(config: Path, job_dir: Path) -> None:
    """Recovery from a checkpoint plus the spool lines after it."""
    edit(config, "telemetry", "checkpoint_interval_s", "2")
    job_id, paths, pid = running_sampler(job_dir, 8, "state")
    os.kill(pid, signal.SIGKILL)
    _, epilog = assert_survived(job_id, log_file())
    assert "sampler not_running; record recovered" in epilog
    record = read_record(paths.record)
    assert not record.complete and "sampler_not_running" in record.notes
    assert record.gpus[0].samples >= 1


def test_sampler_stopped_and_continued_samples_on(job_dir: Path) -> None:
    """A sampler stopped (SIGSTOP: a suspended job's processes, a debugger) for longer than
    its wait and then continued goes on sampling; the epilog stops and seals it as usual.
    Seen before: it took the SIGCONT for a stop request and sealed at once, the job running on."""
    job_id, paths, pid = running_sampler(job_dir, 14, "jsonl")
    os.kill(pid, signal.SIGSTOP)
    time.sleep(4)  # four of the test cluster's 1 s intervals
    os.kill(pid, signal.SIGCONT)
    time.sleep(3)
    assert not os.path.exists(paths.record), "the sampler sealed on SIGCONT"
    os.kill(pid, 0)  # still running (raises ProcessLookupError otherwise)
    _, epilog = assert_survived(job_id, log_file())
    assert "sampler stopped; record sealed by the sampler" in epilog, epilog
    record = read_record(paths.record)
    assert record.complete, record.notes
    # Readings resumed after the stop: the job's last seconds are in the record.
    assert record.ended_s is not None and record.gpus[0].samples >= 8


def test_sampler_ignoring_sigterm(job_dir: Path) -> None:
    """Recovery without a checkpoint (the default interval is longer than the job): the
    whole spool is folded."""
    job_id = run_job(job_dir, sleep=6)
    paths = spool_paths(job_id)
    wait_for(paths.jsonl, timeout_s=120)
    time.sleep(2)
    pid = read_pidfile(paths.pid)[0]  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)  # a hung sampler: SIGTERM is never acted on
    _, epilog = assert_survived(job_id, log_file())
    assert "sampler killed; record recovered" in epilog
    record = read_record(paths.record)
    assert not record.complete and "sampler_killed" in record.notes
    assert record.gpus[0].samples >= 2
