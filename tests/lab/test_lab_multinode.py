"""Multi-node jobs on the version lab when a node fails or is late: a node whose slurmd and
sampler are SIGKILLed mid-job is stored as missing with nothing else lost; a node whose record
reaches the inbox after the job was stored is added to it by the next collection.

The lab's collector waits ``[collector] node_wait_s = 20`` for missing nodes and slurmctld
notices a dead slurmd after ``SlurmdTimeout=20`` (share/testlab/start).
"""

from __future__ import annotations

import os
import signal
import time

from labtools import PROJECT_BIN, Lab, ensure_labs, stored_job

from slurm_gpu.accounting.hostlist import expand_hostlist


def _two_node_job(lab: Lab, seconds: int) -> str:
    return lab.submit(
        "#!/bin/bash\n#SBATCH --job-name=lab-multi -N2 --ntasks-per-node=1 --cpus-per-task=1\n"
        "#SBATCH --gres=gpu:4 --mem=400M --time=00:05:00\n"
        f"srun {PROJECT_BIN}/python -m slurm_gpu.demo healthy --duration {seconds}\n"
    )


def _nodes(lab: Lab, job_id: str) -> list[str]:
    nodes = list(expand_hostlist(lab.sacct_fields(job_id, ["NodeList"])["NodeList"]))
    assert len(nodes) == 2 and set(nodes) <= set(lab.nodes), nodes
    return nodes


def _sampler_pid(lab: Lab, job_id: str, node: str) -> int:
    pid_file = lab.spool(node) / job_id / f"{node}.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"no sampler pid file {pid_file}"
        time.sleep(0.2)
    return int(pid_file.read_text().split()[0])


def test_node_killed_mid_job_is_stored_missing_and_nothing_else_is_lost(lab: Lab) -> None:
    job_id = _two_node_job(lab, 25)
    lab.wait_running(job_id)
    batch_host, victim = _nodes(lab, job_id)
    sampler = _sampler_pid(lab, job_id, victim)
    _sampler_pid(lab, job_id, batch_host)
    time.sleep(3)  # a few readings on both nodes
    try:
        os.kill(lab.slurmd_pid(victim), signal.SIGKILL)
        os.kill(sampler, signal.SIGKILL)
        lab.wait_done(job_id, timeout_s=240)
        lab.wait_record(job_id, batch_host)
        report = lab.ship_and_collect(job_id, [batch_host])
        assert report["ingested"] == [job_id], report
        assert report["partial"] == [job_id], report
        stored = stored_job(lab, job_id)
        assert stored.missing_hosts == (victim,)
        assert [n.hostname for n in stored.nodes] == [batch_host]
        survivor = stored.nodes[0]
        assert survivor.complete and len(survivor.gpus) == 4
        assert all(g.utilization.mean and g.utilization.mean > 10 for g in survivor.gpus)
    finally:
        ensure_labs()  # restarts the killed slurmd and resumes its node
    assert lab.run(["sinfo", "-h", "-n", victim, "-o", "%T"]).stdout.strip() in ("idle", "mixed")


def test_record_arriving_late_is_added_to_the_stored_job(lab: Lab) -> None:
    job_id = _two_node_job(lab, 12)
    assert lab.wait_done(job_id) == "COMPLETED"
    first, late = _nodes(lab, job_id)
    lab.wait_record(job_id, first)
    lab.wait_record(job_id, late)
    report = lab.ship_and_collect(job_id, [first])
    assert report["partial"] == [job_id], report
    assert stored_job(lab, job_id).missing_hosts == (late,)

    report = lab.ship_and_collect(job_id, [late])
    assert report["ingested"] == [job_id], report
    stored = stored_job(lab, job_id)
    assert stored.missing_hosts == ()
    assert sorted(n.hostname for n in stored.nodes) == sorted([first, late])
    assert sum(len(n.gpus) for n in stored.nodes) == 8


def test_node_that_waits_on_the_other_is_cause_5_across_nodes(lab: Lab) -> None:
    """Node 0's GPUs work at 90 %, node 1's at 15 %: within each node the GPUs agree, so only
    the job seen whole (both nodes' records joined) shows that one node waits on the other."""
    demo = f"{PROJECT_BIN}/python -m slurm_gpu.demo healthy --duration 15 --noise 0.01"
    job_id = lab.submit(
        "#!/bin/bash\n#SBATCH --job-name=lab-wait -N2 --ntasks-per-node=1 --cpus-per-task=1\n"
        "#SBATCH --gres=gpu:4 --mem=400M --time=00:05:00\n"
        f'srun bash -c \'if [ "$SLURM_NODEID" = 0 ]; then exec {demo} --util 0.9; '
        f"else exec {demo} --util 0.15; fi'\n"
    )
    assert lab.wait_done(job_id) == "COMPLETED"
    nodes = _nodes(lab, job_id)
    for node in nodes:
        lab.wait_record(job_id, node)
    report = lab.ship_and_collect(job_id, nodes)
    assert report["ingested"] == [job_id], report
    stored = stored_job(lab, job_id)
    means = {n.hostname: [g.utilization.mean or 0.0 for g in n.gpus] for n in stored.nodes}
    busy, waiting = means[nodes[0]], means[nodes[1]]
    assert min(busy) > 70 and max(waiting) < 30, means
    assert max(busy) - min(busy) < 30 and max(waiting) - min(waiting) < 30  # each node even
    found = [f for f in stored.findings if f.code == "GPU_IMBALANCE"]
    assert found and found[0].cause == 5, [f.code for f in stored.findings]
    assert found[0].evidence["node_spread_pct"] > 50
    assert found[0].evidence["gpus_used"] == 8
