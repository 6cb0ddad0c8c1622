"""Issue 26 end to end on the test cluster: a job ended by its time limit mid-step, a job with
a failed step, a ``--gpus``-style and a ``--gpus-per-task``-style job with an unused GPU, and
one whose ``--gpus`` request is written in its batch script's ``#SBATCH`` lines alone, each run
by ``sgtest1``, collected, then diagnosed from the store alone (the job record as the collector
stored it: its submit line, its script's directives and Slurm's reason included); each
recommended set must pass ``sbatch --test-only``, the script's pasted into the script.

Takes about three minutes (the time-limit job runs its one-minute limit out).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import slurmtools

from slurm_gpu.analysis import Analysis, Code, analyze
from slurm_gpu.config import load_settings
from slurm_gpu.records import JobRecord
from slurm_gpu.store import open_store

pytestmark = pytest.mark.cluster

DEMO = slurmtools.REPO / "share" / "demo"


def _idle_gpu_script() -> str:
    """The idle-gpu demo (two GPUs asked, one used) without its ``--gres`` line: the GPU
    request comes from the submit line, in the style under test."""
    lines = (DEMO / "idle-gpu.sbatch").read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("#SBATCH --gres")) + "\n"


def _script_styled_gpus_script() -> str:
    """The idle-gpu demo with its GPU and core request written as ``#SBATCH --gpus=2`` and
    ``#SBATCH --cpus-per-gpu=1``: submitted with no option, its submit line names nothing."""
    out = []
    for line in (DEMO / "idle-gpu.sbatch").read_text().splitlines():
        if line.startswith("#SBATCH --gres"):
            line = "#SBATCH --gpus=2"
        elif line.startswith("#SBATCH --cpus-per-task"):
            line = "#SBATCH --cpus-per-gpu=1"
        out.append(line)
    return "\n".join(out) + "\n"


def _step_script(body: str) -> str:
    return f"#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --mem=1G\n{body}\n"


@pytest.fixture(scope="module")
def analyses() -> Iterator[dict[str, Analysis]]:
    config = slurmtools.slurm_gpu_config_path()
    settings = load_settings(str(config))
    python = slurmtools.venv_python()
    out = slurmtools.user_dir("sgtest1")
    common = (
        f"--chdir={out}",
        f"--output={out}/%j.out",
        f"--export=ALL,SLURM_GPU_PYTHON={python},SLURM_GPU_CONFIG={config}",
    )
    plan = {
        # The step runs past the one-minute limit: Slurm ends it with the job (TIMEOUT).
        "timeout": (_step_script("srun sleep 600"), ("--time=1",)),
        # The step fails on its own; the script exits 0 (COMPLETED, DerivedExitCode 1).
        "failed-step": (_step_script("srun sh -c 'sleep 15; exit 3'\nexit 0"), ("--time=5",)),
        "gpus": (_idle_gpu_script(), ("--gpus=2",)),
        "gpus-per-task": (_idle_gpu_script(), ("--ntasks=2", "--gpus-per-task=1")),
        "script-gpus": (_script_styled_gpus_script(), ()),
    }
    jobs = {
        name: slurmtools.submit(script, "sgtest1", (*common, *extra))
        for name, (script, extra) in plan.items()
    }
    for job_id in jobs.values():
        slurmtools.wait_done(job_id, timeout_s=420)
    slurm_gpu = str(python.with_name("slurm-gpu"))
    deadline = time.monotonic() + 120
    with open_store(settings) as store:
        while set(jobs.values()) - store.existing_job_ids(list(jobs.values())):
            assert time.monotonic() < deadline, "jobs not collected"
            subprocess.run(
                [slurm_gpu, "--config", str(config), "collect", "--once", "--no-missing"],
                capture_output=True,
                timeout=300,
                check=False,
            )
            time.sleep(2)
    result = {}
    with open_store(settings, readonly=True) as store:
        for name, job_id in jobs.items():
            stored = store.get_job(job_id, timelines=True)
            assert stored is not None, name
            result[name] = analyze(stored.job, stored.nodes, settings.analysis)
            STORED[name] = stored.job
    yield result


#: The job records as the collector stored them, by case.
STORED: dict[str, JobRecord] = {}


def _codes(a: Analysis) -> set[Code]:
    return {f.code for f in a.findings}


def _test_only(a: Analysis, options: tuple[str, ...]) -> None:
    """The job's own options with the recommended lines in their place pass --test-only."""
    after = {o.split("=", 1)[0]: o for o in options}
    for r in a.recommendations:
        for line in r.sbatch_lines:
            option = line.removeprefix("#SBATCH ")
            after[option.split("=", 1)[0]] = option
    proc = slurmtools.run_as(
        "sgtest1", ["sbatch", "--test-only", *after.values(), "--wrap=true"], check=False
    )
    assert proc.returncode == 0, (after, proc.stderr)


def test_job_ended_by_its_time_limit_mid_step(analyses: dict[str, Analysis]) -> None:
    a = analyses["timeout"]
    assert Code.TIME_LIMIT_REACHED in _codes(a) and Code.STEPS_FAILED not in _codes(a)


def test_job_with_a_failed_step(analyses: dict[str, Analysis]) -> None:
    f = next(f for f in analyses["failed-step"].findings if f.code is Code.STEPS_FAILED)
    assert f.evidence["steps_failed"] == 1 and f.evidence["first_failed_exit_code"] == 3


def test_gpus_style_job_with_an_unused_gpu(analyses: dict[str, Analysis]) -> None:
    a = analyses["gpus"]
    lines = [line for r in a.recommendations for line in r.sbatch_lines]
    assert "#SBATCH --gpus=1" in lines and not any("--gres" in x for x in lines)
    _test_only(a, ("--gpus=2", "--cpus-per-task=2", "--mem=2G"))


def test_gpus_per_task_style_job_with_an_unused_gpu(analyses: dict[str, Analysis]) -> None:
    a = analyses["gpus-per-task"]
    lines = [line for r in a.recommendations for line in r.sbatch_lines]
    assert "#SBATCH --ntasks=1" in lines and not any("--gres" in x for x in lines)
    _test_only(a, ("--ntasks=2", "--gpus-per-task=1", "--cpus-per-task=2", "--mem=2G"))


def test_gpus_written_only_in_the_batch_script_keep_their_form(
    analyses: dict[str, Analysis],
) -> None:
    # Submitted as plain "sbatch": the style is in the script, which the test cluster keeps
    # (AccountingStoreFlags=job_script) and the collector read and stored.
    job = STORED["script-gpus"]
    assert job.batch_directives is not None and "#SBATCH --gpus=2" in job.batch_directives
    a = analyses["script-gpus"]
    lines = [line for r in a.recommendations for line in r.sbatch_lines]
    assert "#SBATCH --gpus=1" in lines and not any("--gres" in x for x in lines), lines
    # Pasted into the script in place of the lines naming the same options.
    script = _script_styled_gpus_script().splitlines()
    for line in lines:
        name = line.split("=", 1)[0]
        script = [x if x.split("=", 1)[0] != name else line for x in script]
        if line not in script:
            script.insert(1, line)
    proc = slurmtools.run_as(
        "sgtest1",
        ["sbatch", "--test-only"],
        input_text="\n".join(script) + "\n",
        cwd=slurmtools.user_dir("sgtest1"),
        check=False,
    )
    assert proc.returncode == 0, (script, proc.stderr)
