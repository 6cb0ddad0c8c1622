"""gres.conf ``Flags=env_uuid`` (Slurm 26.05): ``CUDA_VISIBLE_DEVICES`` holds GPU UUIDs instead
of indices, and the hooks must resolve them to the node's GPUs.

Slurm knows GPU UUIDs only from GPU detection; the lab gives each slurmd the UUIDs of its own
virtual GPUs through Slurm's ``fake_gpus.conf`` (share/testlab/start, ``LAB_GRES_FLAGS``). The
26.05 lab is restarted with the flag for this test and without it afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from labtools import START_SCRIPT, Lab, LabError, ensure_labs, stored_job

from slurm_gpu.accounting.hostlist import expand_hostlist


@pytest.fixture
def uuid_lab(labs: dict[str, Lab]) -> Iterator[Lab]:
    lab = labs["26.05"]
    env = {
        **os.environ,
        "BUILD_PYTHON": os.environ.get("BUILD_PYTHON") or sys.executable,
        "LAB_GRES_FLAGS": "env_uuid",
    }
    proc = subprocess.run(
        [str(START_SCRIPT), lab.version], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise LabError(f"start {lab.version} with env_uuid: {proc.stderr}")
    try:
        yield lab
    finally:
        ensure_labs()


def test_env_uuid_gives_uuids_and_the_hooks_resolve_each_nodes_own(uuid_lab: Lab) -> None:
    lab = uuid_lab
    assert "Flags=env_uuid" in (lab.root / "etc" / "slurm" / "gres.conf").read_text()
    job_id = lab.submit(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=1 --gres=gpu:2 --mem=200M --time=00:05:00\n"
        'srun bash -c \'echo "$(hostname) $CUDA_VISIBLE_DEVICES" '
        '> "$HOME/cvd-$SLURM_JOB_ID-$(hostname)"; sleep 4\'\n'
    )
    assert lab.wait_done(job_id) == "COMPLETED"
    nodes = list(expand_hostlist(lab.sacct_fields(job_id, ["NodeList"])["NodeList"]))
    assert len(nodes) == 2
    seen: dict[str, set[str]] = {}
    for node in nodes:
        host, cvd = (lab.root / "home" / "labuser1" / f"cvd-{job_id}-{node}").read_text().split()
        assert host == node
        seen[node] = set(cvd.split(","))
        own = {
            json.loads((lab.vgpu_dir(node) / str(i) / "identity.json").read_text())["uuid"]
            for i in range(4)
        }
        # UUIDs, not indices, and this node's own.
        assert len(seen[node]) == 2 and seen[node] <= own, (seen[node], own)
        lab.wait_record(job_id, node)
    report = lab.ship_and_collect(job_id, nodes)
    assert report["ingested"] == [job_id], report
    stored = stored_job(lab, job_id)
    assert {n.hostname: {g.info.uuid for g in n.gpus} for n in stored.nodes} == seen
