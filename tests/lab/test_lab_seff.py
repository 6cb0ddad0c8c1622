"""The seff agreement check (tests/integration/test_seff_agreement.py) on the 24.11 lab: our CPU
and memory efficiencies against the real ``seff`` of Slurm 24.11.5 on the same real jobs
(cgroup v1 enforcement, ``jobacct_gather/cgroup``).

``share/testlab/get-seff`` puts seff into ``ROOT/opt/seff/seff`` from the upstream tarball of
Debian's slurm-wlm source package of the root's version (docs/compat.md says why that tarball
and not the whole source package, and why 26.05 has none). The cases, the seff parser and the
printing rules are the 22.05 check's; the jobs run in the lab as ``labuser1``, the collector
and ``gpueff`` are the root's, and the accounting record is read with the root's ``sacct``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from labtools import PROJECT_BIN, REPO, Lab

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.runner import CommandResult, SubprocessRunner
from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.analysis.metrics import (
    seff_cpu_efficiency_pct,
    seff_cpu_used_s,
    seff_mem_efficiency_pct,
    seff_ncpus,
    seff_pct_text,
)
from slurm_gpu.records import JobRecord

sys.path.insert(0, str(REPO / "tests" / "integration"))
from test_seff_agreement import CASES, WORKLOAD, SeffReport, kbytes2str, parse_seff

#: The 22.05 check's cases; a lab node has 2 CPUs, so "mem_per_cpu" asks 2 × 384 MiB (the
#: same 768 MiB) instead of 3 × 256 MiB; its plausible ranges still hold.
CASES = {
    **CASES,
    "mem_per_cpu": dataclasses.replace(
        CASES["mem_per_cpu"], options=("--gres=gpu:1", "--cpus-per-task=2", "--mem-per-cpu=384M")
    ),
}
VERSION = "24.11"  # the only lab version whose seff the registry serves (docs/compat.md)
GET_SEFF = REPO / "share" / "testlab" / "get-seff"


class _InRoot:
    """Runs the accounting commands chrooted into the lab's root (its sacct, its slurm.conf)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.inner = SubprocessRunner()

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        return self.inner(["chroot", str(self.root), *argv], env=env, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def seff_jobs(labs: dict[str, Lab]) -> dict[str, tuple[SeffReport, dict[str, Any], JobRecord]]:
    """name -> (seff's report, our gpueff --json object, the accounting record)."""
    lab = labs[VERSION]
    got = subprocess.run([str(GET_SEFF), VERSION], capture_output=True, text=True, check=False)
    if got.returncode != 0:
        pytest.fail(f"share/testlab/get-seff {VERSION} failed: {got.stderr}", pytrace=False)
    lab.run(["tee", "/home/labuser1/workload.py"], user="labuser1", input_text=WORKLOAD)
    ids = {
        name: lab.submit(
            f"#!/bin/sh\n#SBATCH --time=00:05:00\n#SBATCH --job-name=seff-{name}\n{case.command}\n",
            args=case.options,
        )
        for name, case in CASES.items()
    }
    out = {}
    source = SacctSource(runner=_InRoot(lab.root))
    for name, job_id in ids.items():
        assert lab.wait_done(job_id, timeout_s=240) == "COMPLETED", name
        nodes = list(expand_hostlist(lab.sacct_fields(job_id, ["NodeList"])["NodeList"]))
        lab.wait_record(job_id, nodes[0])
        lab.ship_and_collect(job_id, nodes)
        seff = lab.run(["perl", "/opt/seff/seff", job_id]).stdout
        ours = lab.run([f"{PROJECT_BIN}/gpueff", "--json", job_id], user="labuser1").stdout
        (job,) = json.loads(ours)["jobs"]
        assert job["telemetry"] == "final", job
        out[name] = (parse_seff(seff), job, source.get_jobs([job_id])[job_id])
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_efficiency_agrees_with_seff_2411(
    seff_jobs: dict[str, tuple[SeffReport, dict[str, Any], JobRecord]], name: str
) -> None:
    seff, gpueff, record = seff_jobs[name]
    low, high = CASES[name].cpu_pct
    assert low <= float(seff.cpu_efficiency.rstrip("%")) <= high, seff.text
    assert seff_pct_text(seff_cpu_efficiency_pct(record)) == seff.cpu_efficiency, seff.text
    assert seff_pct_text(gpueff["cpu_efficiency_pct"]) == seff.cpu_efficiency, seff.text
    assert seff_ncpus(record) == seff.cores == gpueff["cpus"]
    assert seff_cpu_used_s(record) == seff.cpu_utilized_s
    assert record.elapsed_s == gpueff["elapsed_s"] == seff.wall_clock_s


@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_efficiency_agrees_with_seff_2411(
    seff_jobs: dict[str, tuple[SeffReport, dict[str, Any], JobRecord]], name: str
) -> None:
    seff, gpueff, record = seff_jobs[name]
    low, high = CASES[name].mem_pct
    assert low <= float(seff.memory_efficiency.rstrip("%")) <= high, seff.text
    assert seff_pct_text(seff_mem_efficiency_pct(record)) == seff.memory_efficiency, seff.text
    assert seff_pct_text(gpueff["mem_efficiency_pct"]) == seff.memory_efficiency, seff.text
    assert record.max_rss_bytes is not None and record.alloc_tres.mem_bytes is not None
    assert kbytes2str(record.max_rss_bytes / 1024) == seff.memory_utilized, seff.text
    assert kbytes2str(record.alloc_tres.mem_bytes / 1024) == seff.memory_allocated
