"""Real jobs on the version lab, on every version (24.11, 26.05): the hooks on each compute host,
GPU resolution, the collector with that version's sacct, the JS1 AdminComment written after the
job and read by the real reportseff, gpueff as owner and as another user.

The project runs as a site installs it (/opt/slurm-gpu in the lab's root); these tests only
look at what it wrote, with the checkout's own readers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from labtools import PROJECT_BIN, REPORTSEFF, Lab, stored_job
from reportseff import job as reportseff_job

from slurm_gpu.accounting.admincomment import build_summary
from slurm_gpu.accounting.hostlist import expand_hostlist

PYTHON = f"{PROJECT_BIN}/python"

# Two nodes, all four GPUs of each, one task per node driving its node's GPUs.
TWO_NODE_JOB = f"""#!/bin/bash
#SBATCH --job-name=lab-two-node
#SBATCH -N2 --ntasks-per-node=1 --cpus-per-task=1 --gres=gpu:4 --mem=400M --time=00:05:00
srun {PYTHON} -m slurm_gpu.demo healthy --duration 15
"""


def node_uuids(lab: Lab, node: str) -> set[str]:
    """The UUIDs of the node's own four virtual GPUs."""
    return {
        json.loads((lab.vgpu_dir(node) / str(i) / "identity.json").read_text())["uuid"]
        for i in range(4)
    }


@pytest.fixture(scope="module")
def collected() -> Iterator[dict[str, tuple[str, dict[str, list[str]]]]]:
    """Per version: one collected two-node job (job id, collector report)."""
    yield {}


def two_node_job(
    lab: Lab, cache: dict[str, tuple[str, dict[str, list[str]]]]
) -> tuple[str, dict[str, list[str]]]:
    if lab.version not in cache:
        job_id = lab.submit(TWO_NODE_JOB)
        assert lab.wait_done(job_id) == "COMPLETED"
        nodes = lab.sacct_fields(job_id, ["NodeList"])["NodeList"]
        used = [n for n in lab.nodes if n in _expand(nodes)]
        assert len(used) == 2, nodes
        for node in used:
            lab.wait_record(job_id, node)
        cache[lab.version] = (job_id, lab.ship_and_collect(job_id, used))
    return cache[lab.version]


def _expand(nodelist: str) -> set[str]:
    return set(expand_hostlist(nodelist))


def test_each_node_seals_its_own_record_of_its_own_gpus(
    lab: Lab, collected: dict[str, tuple[str, dict[str, list[str]]]]
) -> None:
    job_id, report = two_node_job(lab, collected)
    assert report["ingested"] == [job_id], report
    stored = stored_job(lab, job_id)
    assert stored.missing_hosts == ()
    hosts = sorted(n.hostname for n in stored.nodes)
    assert len(hosts) == 2 and set(hosts) <= set(lab.nodes)
    for node in stored.nodes:
        # The prolog on that host resolved Slurm's indices to that host's own GPUs.
        assert {g.info.uuid for g in node.gpus} == node_uuids(lab, node.hostname)
        assert node.complete, node.notes
        # The srun task on that host drove its GPUs: the sampler there saw them busy.
        assert all(g.utilization.mean and g.utilization.mean > 10 for g in node.gpus)
    # The analysis sees the job whole: two nodes, eight GPUs.
    assert sum(len(n.gpus) for n in stored.nodes) == 8
    assert stored.job.alloc_tres.gpus == 8


def test_the_collector_keeps_the_batch_scripts_directives(
    lab: Lab, collected: dict[str, tuple[str, dict[str, list[str]]]]
) -> None:
    # The lab keeps scripts (AccountingStoreFlags=job_script): this version's
    # "sacct --batch-script" output is read, and the request style is the script's.
    from slurm_gpu.analysis.request import request_of

    job_id, _ = two_node_job(lab, collected)
    job = stored_job(lab, job_id).job
    assert job.batch_directives == (
        "#SBATCH --job-name=lab-two-node\n"
        "#SBATCH -N2 --ntasks-per-node=1 --cpus-per-task=1 --gres=gpu:4 --mem=400M --time=00:05:00"
    )
    req = request_of(job)
    assert (req.gpu_form, req.cpu_form, req.mem_form) == ("gres", "cpus-per-task", "mem")


def test_admincomment_is_written_after_the_job_and_read_by_reportseff(
    lab: Lab, collected: dict[str, tuple[str, dict[str, list[str]]]]
) -> None:
    job_id, report = two_node_job(lab, collected)
    # 23.02+ keeps AdminComment's case, so the collector writes it after the job ended.
    assert report["admin_comment_written"] == [job_id], report
    assert report["admin_comment_failed"] == []
    comment = lab.sacct_fields(job_id, ["AdminComment"])["AdminComment"]
    assert comment.startswith("JS1:")
    stored = stored_job(lab, job_id)
    parsed = reportseff_job._parse_admin_comment_to_dict(comment)
    assert parsed == build_summary(stored.job, stored.nodes)
    # The real reportseff, installed in the lab's root, on the real job.
    out = lab.run([REPORTSEFF, "--no-color", "--format", "JobID,State,GPUEff,GPUMem", job_id])
    line = next(ln.split() for ln in out.stdout.splitlines() if ln.split()[:1] == [job_id])
    assert line[1] == "COMPLETED"
    assert line[2] != "---" and line[2].endswith("%")
    means = [g.utilization.mean for n in stored.nodes for g in n.gpus]
    assert all(m is not None for m in means)
    assert float(line[2].rstrip("%")) > 10


def test_gpueff_as_owner_and_as_another_user(
    lab: Lab, collected: dict[str, tuple[str, dict[str, list[str]]]]
) -> None:
    job_id, _ = two_node_job(lab, collected)
    own = lab.run([f"{PROJECT_BIN}/gpueff", job_id], user="labuser1", check=False)
    assert own.returncode == 0, own.stderr
    assert f"Job {job_id}" in own.stdout and "COMPLETED" in own.stdout
    assert own.stdout.count("% busy") == 8
    other = lab.run([f"{PROJECT_BIN}/gpueff", job_id], user="labuser2", check=False)
    # PrivateData=jobs: another user learns nothing about the job (docs/gpueff.md: exit 4).
    assert other.returncode == 4, (other.returncode, other.stdout, other.stderr)
    assert "% busy" not in other.stdout


def test_the_controller_answers_a_running_job_on_every_version(lab: Lab) -> None:
    """``squeue --Format`` with the fields ``accounting.controller`` asks, framed by a random
    delimiter, read by that version's squeue; and ``gpueff`` on the running job as its owner,
    answered by the controller alone."""
    job_id = lab.submit(
        "#!/bin/bash\n#SBATCH --job-name=lab-ctl|x --gres=gpu:2 --mem=100M --time=00:05:00\n"
        "sleep 120\n"
    )
    try:
        lab.wait_running(job_id)
        probe = (
            "import json, sys\n"
            "from slurm_gpu.accounting.controller import SqueueView\n"
            "(j,) = SqueueView().jobs([sys.argv[1]])\n"
            "print(json.dumps([j.job_id, j.job_name, j.state, j.user, list(j.nodelist),"
            " j.tres.gpus, j.start_s is not None, j.time_limit_s]))\n"
        )
        out = lab.run([PYTHON, "-c", probe, job_id], user="labuser1").stdout
        assert json.loads(out) == [
            job_id,
            "lab-ctl|x",
            "RUNNING",
            "labuser1",
            json.loads(out)[4],
            2,
            True,
            300,
        ], out
        assert len(json.loads(out)[4]) == 1
        report = lab.run([f"{PROJECT_BIN}/gpueff", "--json", job_id], user="labuser1").stdout
        (job,) = json.loads(report)["jobs"]
        assert job["state"] == "RUNNING" and job["job_name"] == "lab-ctl|x"
        assert job["gpus_allocated"] == 2 and job["exit_code"] is None
        # Another user: the controller hides it (PrivateData=jobs), and so does accounting.
        other = lab.run([f"{PROJECT_BIN}/gpueff", job_id], user="labuser2", check=False)
        assert other.returncode == 4, (other.returncode, other.stdout, other.stderr)
    finally:
        lab.run(["scancel", job_id], check=False)
