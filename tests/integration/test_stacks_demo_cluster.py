"""Stack sampling on the test cluster (issue 31, docs/stacks.md "On the test cluster"): two
Python jobs that look input-bound from outside (the GPU mostly idle, the job's one core
saturated), submitted as sgtest1 with ``--comment=slurm-gpu:stacks``:

- ``loader``: the main loop waits on a multiprocessing queue fed by two slow worker processes
  and runs a short GPU burst per batch. Its ``DATALOADER_BOUND`` must be *confirmed* by the
  stacks: the share of samples waiting for the next batch, in the store and in ``gpueff`` as
  its owner runs it.
- ``checkpoint``: no worker at all; between GPU bursts the main process writes checkpoints
  with ``shutil.copyfileobj`` (one core busy). The stacks must *withdraw* the data-loading
  finding and name the class (``checkpoint_io``).

The cluster's slurm-gpu configuration is edited for this module only (the opt-in on the
default partition, bursts every 10 s) and restored byte for byte afterwards.

The cluster runs ``proctrack/linuxproc`` (docs/testcluster.md): Slurm puts no job into a
cgroup, and stack sampling never reads a process outside the job's cgroup (``no_cgroup``).
The test therefore plays the part of ``proctrack/cgroup`` for its two jobs: it makes the
cgroup v1 directory Slurm would make (``cpuacct/slurm_stackdemo/uid_<uid>/job_<id>``, root's)
and moves the batch shell into it before the shell starts the workload (which waits for
that); the workload's processes inherit it. The directories are removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.capture.spool import JobSpool, read_record
from slurm_gpu.config import load_settings
from slurm_gpu.records import NodeRecord
from slurm_gpu.store import open_store

pytestmark = pytest.mark.cluster

USER = "sgtest1"
#: Seconds each workload runs: 5 bursts of 20 samples at 10 s apart fit with room.
DURATION_S = 60
#: The stand-in for Slurm's cgroup v1 tree (``slurm*`` under the controller, root's).
CGROUP_TREE = Path("/sys/fs/cgroup/cpuacct/slurm_stackdemo")

#: Settings this module adds to the cluster's configuration ([section], key, TOML value).
EDITS = (
    ("stacks", "user_opt_in_partitions", '["gpu"]'),
    ("stacks", "interval_s", "10"),
    ("stacks", "first_burst_s", "3"),
    ("stacks", "samples_per_burst", "20"),
    ("stacks", "sample_spacing_s", "0.1"),
    # 20 dumps of ~15 ms each spread at 1 % would push the next burst ~30 s out; these jobs
    # last a minute.
    ("stacks", "max_core_pct", "10"),
)

#: The input-bound job: two workers burn 0.5 CPU s per batch into a multiprocessing queue;
#: the main loop waits on it (``multiprocessing/queues.py get``), then a 50 ms GPU burst.
LOADER = """
import multiprocessing as mp
import os
import sys
import time

from slurm_gpu.demo.gpus import job_gpu_minors
from slurm_gpu.telemetry.virtual_device import VirtualGpuDevice


def burn(cpu_s):
    end = time.process_time() + cpu_s
    acc = 0
    while time.process_time() < end:
        for k in range(2000):
            acc = (acc * 31 + k * k) % 1000003
    return acc


def worker(queue):
    while True:
        queue.put(burn(0.5).to_bytes(4, "little") * 4096)  # one "batch", 16 KiB


def main():
    vdir, duration = sys.argv[1], float(sys.argv[2])
    os.sched_setaffinity(0, {0})  # the job's one core (the cluster runs task/none)
    dev = VirtualGpuDevice.open(vdir, job_gpu_minors(os.environ)[0])
    dev.attach(memory_bytes=int(0.35 * dev.memory_total_bytes))
    queue = mp.Queue(maxsize=4)
    workers = [mp.Process(target=worker, args=(queue,), daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    end = time.time() + duration
    batches = 0
    while time.time() < end:
        queue.get()  # waiting for the next batch
        dev.tick(0.0)
        time.sleep(0.05)  # the GPU step
        dev.tick(1.0, sm_active=0.8, tensor_active=0.5, pcie_rx_bytes_per_s=12e9)
        batches += 1
    for w in workers:
        w.terminate()
    dev.detach()
    print(f"{batches} batches", flush=True)


if __name__ == "__main__":
    main()
"""

#: Looks input-bound from outside (GPU idle most of the time, its one core busy) but never
#: waits for data: between 0.15 s GPU bursts it writes a 16 MiB checkpoint again and again for
#: about 2 s with ``shutil.copyfileobj`` (``checkpoint_io``), to /dev/shm so that the shared
#: machine's disk is spared. (``json.dump`` would not do: py-spy shows a running generator
#: without its callers, so most samples hold only ``json/encoder.py`` frames.)
CHECKPOINT = """
import io
import os
import shutil
import sys
import time

from slurm_gpu.demo.gpus import job_gpu_minors
from slurm_gpu.telemetry.virtual_device import VirtualGpuDevice


def main():
    vdir, duration, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # not the loader's core
    dev = VirtualGpuDevice.open(vdir, job_gpu_minors(os.environ)[0])
    dev.attach(memory_bytes=int(0.35 * dev.memory_total_bytes))
    weights = os.urandom(16 << 20)
    end = time.time() + duration
    saves = 0
    try:
        with open(out, "wb") as fh:
            while time.time() < end:
                time.sleep(0.15)  # the GPU steps
                dev.tick(1.0, sm_active=0.8, tensor_active=0.5)
                until = time.time() + 2.0
                while time.time() < until:  # the checkpoint, written with the GPU idle
                    fh.seek(0)
                    shutil.copyfileobj(io.BytesIO(weights), fh)
                    saves += 1
                dev.tick(0.0)
    finally:
        os.unlink(out)
    dev.detach()
    print(f"{saves} checkpoint writes", flush=True)


if __name__ == "__main__":
    main()
"""

#: The batch script: records its pid, waits (30 s at most) until it is in the job's cgroup,
#: then becomes the workload.
BATCH = """#!/bin/sh
#SBATCH --job-name=stacks-{name}
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
#SBATCH --time=00:05:00
echo $$ > {dir}/$SLURM_JOB_ID.pid
i=0
until grep -q "/job_$SLURM_JOB_ID\\$" /proc/self/cgroup || [ $i -ge 300 ]; do
  i=$((i + 1)); sleep 0.1
done
exec {python} {dir}/{name}.py {args}
"""


@dataclass(frozen=True)
class Seen:
    """One collected job: the store's findings, its owner's gpueff, the sealed record."""

    job_id: str
    evidence: dict[str, dict[str, Any]]
    gpueff_text: str
    gpueff_json: dict[str, Any]
    record: NodeRecord


def _python() -> Path:
    """The interpreter of the cluster's hooks (``slurmtools.venv_python``), else this one."""
    python = slurmtools.venv_python()
    return python if python.exists() else Path(sys.executable)


def _edit(text: str, section: str, key: str, value: str) -> str:
    text = re.sub(rf"(?m)^{key}\s*=.*\n", "", text)
    if f"[{section}]\n" in text:
        return text.replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n", 1)
    return text + f"\n[{section}]\n{key} = {value}\n"


@pytest.fixture(scope="module")
def config() -> Iterator[Path]:
    """The cluster's slurm-gpu config with ``EDITS``; restored byte for byte afterwards."""
    path = slurmtools.slurm_gpu_config_path()
    saved = path.read_bytes()
    try:
        text = saved.decode()
        for section, key, value in EDITS:
            text = _edit(text, section, key, value)
        path.write_text(text)
        yield path
    finally:
        path.write_bytes(saved)
    assert path.read_bytes() == saved


def _cgroup_cleanup() -> None:
    """Empty and remove the stand-in tree (leftover processes go back to the root cgroup)."""
    if not CGROUP_TREE.exists():
        return
    for d in sorted(CGROUP_TREE.rglob("job_*"), reverse=True) + sorted(CGROUP_TREE.glob("uid_*")):
        with contextlib.suppress(OSError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CGROUP_TREE.parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        CGROUP_TREE.rmdir()


def _job_cgroup(job_id: str, uid: int) -> Path:
    """Make the job's cgroup v1 directory as Slurm's proctrack/cgroup would (root's)."""
    job_cg = CGROUP_TREE / f"uid_{uid}" / f"job_{job_id}"
    job_cg.mkdir(parents=True, exist_ok=True)
    return job_cg


def _move_in(job_cg: Path, pid_file: Path, timeout_s: float = 180) -> None:
    """Move the batch shell into the job's cgroup once it has written its pid."""
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, f"the job never started ({pid_file})"
        time.sleep(0.1)
    (job_cg / "cgroup.procs").write_text(pid_file.read_text().strip())


def _collect(jobs: list[str]) -> None:
    config = slurmtools.slurm_gpu_config_path()
    settings = load_settings(str(config))
    slurm_gpu = str(_python().with_name("slurm-gpu"))
    deadline = time.monotonic() + 120
    with open_store(settings) as store:
        while True:
            subprocess.run(
                [slurm_gpu, "--config", str(config), "collect", "--once", "--no-missing"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            missing = set(jobs) - store.existing_job_ids(jobs)
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert not missing, f"not collected: {sorted(missing)}"


@pytest.fixture(scope="module")
def seen(config: Path) -> Iterator[dict[str, Seen]]:
    """name -> the collected job, both jobs run at once on one GPU each."""
    settings = load_settings(str(config))
    python = _python()
    uid = pwd.getpwnam(USER).pw_uid
    out = slurmtools.user_dir(USER)
    vdir = settings.telemetry.virtual_dir
    args = {
        "loader": f"{vdir} {DURATION_S}",
        "checkpoint": f"{vdir} {DURATION_S} /dev/shm/stacks-checkpoint-$SLURM_JOB_ID.bin",
    }
    for name, code in (("loader", LOADER), ("checkpoint", CHECKPOINT)):
        (out / f"{name}.py").write_text(code)
    _cgroup_cleanup()
    CGROUP_TREE.mkdir()
    try:
        jobs = {}
        for name in args:
            script = BATCH.format(name=name, dir=out, python=python, args=args[name])
            jobs[name] = slurmtools.submit(
                script,
                USER,
                (f"--chdir={out}", f"--output={out}/%j.out", "--comment=slurm-gpu:stacks"),
            )
        cgroups = {job_id: _job_cgroup(job_id, uid) for job_id in jobs.values()}
        for job_id, job_cg in cgroups.items():
            _move_in(job_cg, out / f"{job_id}.pid")
        for name, job_id in jobs.items():
            state = slurmtools.wait_done(job_id, timeout_s=300)
            output = (out / f"{job_id}.out").read_text(errors="replace")
            assert state == "COMPLETED", f"{name} job {job_id} ended {state}: {output}"
        _cgroup_cleanup()
        _collect(list(jobs.values()))
        host = slurmtools.node_name()
        records = {}
        for name, job_id in jobs.items():
            # The sealed record, in done/ once collected (in the spool before).
            done = Path(settings.paths.state_dir) / "done" / f"{job_id}.{host}.record"
            spool = JobSpool(settings.paths.spool_dir, job_id, host).record
            records[name] = read_record(str(done) if done.exists() else spool)
        gpueff = str(python.with_name("gpueff"))
        result = {}
        with open_store(settings, readonly=True) as store:
            for name, job_id in jobs.items():
                stored = store.get_job(job_id)
                assert stored is not None, name
                as_owner = [gpueff, "--config", str(config), job_id]
                text = slurmtools.run_as(USER, as_owner).stdout
                js = json.loads(
                    slurmtools.run_as(USER, [as_owner[0], "--json", *as_owner[1:]]).stdout
                )
                result[name] = Seen(
                    job_id,
                    {f.code: dict(f.evidence) for f in stored.findings},
                    text,
                    js["jobs"][0],
                    records[name],
                )
        for name, s in result.items():  # what the run showed, for the report (pytest -s)
            print(f"\n== {name} job {s.job_id}: stacks {s.record.stacks}\n{s.gpueff_text}")
        yield result
    finally:
        _cgroup_cleanup()
        shutil.rmtree(out, ignore_errors=True)


def _stack_shares(s: Seen) -> dict[str, float]:
    st = s.record.stacks
    assert st is not None, f"job {s.job_id}: the record has no stack sampling"
    total = sum(st.counts)
    assert total >= 30, f"job {s.job_id}: {total} samples, notes {st.notes}"
    return {c: 100.0 * n / total for c, n in zip(st.classes, st.counts, strict=True)}


def test_slow_input_pipeline_confirmed_by_the_stacks(seen: dict[str, Seen]) -> None:
    s = seen["loader"]
    shares = _stack_shares(s)
    assert shares["input_wait"] >= 50, shares
    assert s.record.stacks is not None and s.record.stacks.worker_samples > 0  # counted apart
    ev = s.evidence.get("DATALOADER_BOUND")
    assert ev is not None, f"job {s.job_id}: {sorted(s.evidence)}"
    assert ev["stacks_confirmed"] == 1
    assert ev["stacks_input_wait_pct"] >= 20  # stacks_confirm_input_pct
    assert ev["stacks_samples"] >= 30
    text = re.sub(r"\s+", " ", s.gpueff_text)
    pct = ev["stacks_input_wait_pct"]
    assert re.search(
        r"Confirmed from inside the job: the main process waited for the next batch "
        rf"{round(pct)} % of the time \(\d+ stack samples",
        text,
    ), text
    assert "input_wait: queues.get" in text  # the deciding frame, in STACK_PROFILE
    codes = [f["code"] for f in s.gpueff_json["findings"]]
    assert "DATALOADER_BOUND" in codes and "STACK_PROFILE" in codes


def test_checkpoint_writer_finding_withdrawn_and_class_named(seen: dict[str, Seen]) -> None:
    s = seen["checkpoint"]
    shares = _stack_shares(s)
    assert shares["checkpoint_io"] >= 50, shares
    assert shares["input_wait"] < 5, shares
    assert "DATALOADER_BOUND" not in s.evidence
    note = s.evidence["STACK_PROFILE"]
    assert note["checkpoint_io_pct"] >= 50
    text = re.sub(r"\s+", " ", s.gpueff_text)
    assert "writing checkpoints or files" in text, text
    assert "checkpoint_io: shutil.copyfileobj" in text, text
    # Raised from outside and withdrawn by the stacks (the core was busy, the GPU idle).
    assert note.get("withdrew_DATALOADER_BOUND") == 1, note
    assert "The data-loading finding was withdrawn" in text, text
