"""cgroup v1 enforcement on the version lab (proctrack/cgroup, task/cgroup, ConstrainDevices,
ConstrainRAMSpace): the host sampler reads the job's real cgroup, its numbers agree with
sacct's, and the sampler itself is not in the job's cgroup.

Tolerances, and why:

- CPU time: the sampler's last reading is taken up to one sampling interval (1 s here) before
  the job's processes exit, and the job can burn at most its allocated cores in that time;
  sacct's TotalCPU is the kernel's count over the whole step. So the two may differ by
  ``interval_s * cores`` (1 CPU-second) plus 5 % for the readings' own timing.
- Peak memory: the sampler takes the job cgroup's ``memory.max_usage_in_bytes`` high-water mark,
  sacct's MaxRSS is the largest RSS that jobacct_gather saw at its 1 s polls of the step. Both
  see the same 300 MiB the job touches; the cgroup also counts page cache and the interpreter's
  own pages (tens of MiB). Agreement within 10 % of MaxRSS.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from labtools import PROJECT_BIN, Lab

from slurm_gpu.capture.spool import read_record

MIB = 1024 * 1024

BURN_JOB = f"""#!/bin/bash
#SBATCH --job-name=lab-cgroup --gres=gpu:1 --mem=600M --cpus-per-task=1 -N1 --time=00:05:00
{PROJECT_BIN}/python -c "
import errno, os, time
# ConstrainDevices: the job's one GPU opens as far as a device with no driver can (ENXIO),
# the other three are refused by the devices cgroup (EPERM).
with open(os.path.expanduser('~/devices-%s.txt' % os.environ['SLURM_JOB_ID']), 'w') as out:
    for i in range(4):
        try:
            os.close(os.open('/opt/lab-gpus/nvidia%d' % i, os.O_RDONLY))
            out.write('%d ok\\n' % i)
        except OSError as exc:
            out.write('%d %s\\n' % (i, errno.errorcode[exc.errno]))
a = bytearray(300 * 1024 * 1024)
for i in range(0, len(a), 4096):
    a[i] = 1
t = time.process_time()
while time.process_time() - t < 6:
    pass
time.sleep(3)
"
"""


def _seconds(sacct_time: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm] as seconds."""
    days = 0
    if "-" in sacct_time:
        d, sacct_time = sacct_time.split("-", 1)
        days = int(d)
    parts = [float(p) for p in sacct_time.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _bytes(sacct_size: str) -> int:
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)", sacct_size)
    assert m, sacct_size
    scale = {"": 1, "K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}[m.group(2)]
    return int(float(m.group(1)) * scale)


def _job_cgroup(lab: Lab, node: str, job_id: str, controller: str) -> Path:
    """The job's cgroup directory of one v1 controller. slurmd makes it when the job's first
    step starts, which may come after the prolog (seen on 26.05): wait for it."""
    base = Path("/sys/fs/cgroup") / controller / f"slurm_{node}"
    deadline = time.monotonic() + 30
    while not (found := sorted(base.glob(f"uid_*/job_{job_id}"))):
        assert time.monotonic() < deadline, f"no {controller} cgroup for job {job_id} under {base}"
        time.sleep(0.2)
    return found[0]


def test_sampler_reads_the_job_cgroup_outside_it_and_agrees_with_sacct(lab: Lab) -> None:
    job_id = lab.submit(BURN_JOB)
    lab.wait_running(job_id)
    node = lab.sacct_fields(job_id, ["NodeList"])["NodeList"]
    assert node in lab.nodes

    # While the job runs: Slurm confines it (memory limit, devices), its processes are in the
    # job's cgroup and the sampler is not.
    pid_file = lab.spool(node) / job_id / f"{node}.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"no sampler pid file {pid_file}"
        time.sleep(0.2)
    sampler = int(pid_file.read_text().split()[0])
    memory = _job_cgroup(lab, node, job_id, "memory")
    assert int((memory / "memory.limit_in_bytes").read_text()) == 600 * MIB
    opened = lab.root / "home" / "labuser1" / f"devices-{job_id}.txt"
    deadline = time.monotonic() + 30
    while not opened.exists() or opened.read_text().count("\n") < 4:
        assert time.monotonic() < deadline, f"the job wrote no {opened}"
        time.sleep(0.2)
    results = sorted(line.split()[1] for line in opened.read_text().splitlines())
    assert results == ["ENXIO", "EPERM", "EPERM", "EPERM"], opened.read_text()
    job_pids: set[int] = set()
    deadline = time.monotonic() + 30
    while not job_pids:
        assert time.monotonic() < deadline, "the job's cgroup never got a process"
        job_pids = {int(p) for f in memory.rglob("cgroup.procs") for p in f.read_text().split()}
        time.sleep(0.2)
    assert sampler not in job_pids
    own = Path(f"/proc/{sampler}/cgroup").read_text()
    assert f"job_{job_id}" not in own, own

    assert lab.wait_done(job_id) == "COMPLETED"
    record = read_record(str(lab.wait_record(job_id, node)))
    host = record.host
    assert host is not None and host.method == "cgroup1", host
    acct = lab.sacct_fields(job_id, ["TotalCPU", "MaxRSS"], step="batch")
    total_cpu = _seconds(acct["TotalCPU"])
    assert total_cpu >= 5.5  # the job burned 6 s of CPU
    assert host.cpu_time_s is not None
    assert host.cpu_time_s == pytest.approx(
        total_cpu, abs=record.interval_s * (host.allocated_cores or 1) + 0.05 * total_cpu
    )
    max_rss = _bytes(acct["MaxRSS"])
    assert max_rss >= 300 * MIB
    assert host.rss_max_bytes is not None
    assert host.rss_max_bytes == pytest.approx(max_rss, rel=0.10)
