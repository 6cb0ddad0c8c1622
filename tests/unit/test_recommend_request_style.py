"""Recommendations in the user's own request style (issue 26, point 5): the form the job was
submitted with (``--gres`` with or without a type, ``--gpus``, ``--gpus-per-node``,
``--gpus-per-task``, ``--cpus-per-task``, ``--cpus-per-gpu``, ``--mem``, ``--mem-per-gpu``,
``--mem-per-cpu``) read from sacct's SubmitLine and ReqTRES; only what must change, in the
same form; never a GPU type the user did not ask for; a GPU cut with the CPU line its cores
need. Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace

import pytest
from analysis_factory import GIB, gpu, host, job, node, timeline

from slurm_gpu.analysis import Analysis, Option, analyze
from slurm_gpu.analysis.request import GPUS_PER_TASK, Request, request_of
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, Tres

S = AnalysisSettings()


def rec(a: Analysis, option: Option):  # type: ignore[no-untyped-def]
    return next((r for r in a.recommendations if r.option is option), None)


def two_gpu_job(submit_line: str | None, *, typed_alloc: bool = True) -> JobRecord:
    """Two A100s allocated (AllocTRES names the type), ReqTRES untyped: the user asked for
    GPUs of any type."""
    j = job(gpus=2, cpus=16, total_cpu=2 * 3600.0)
    alloc = Tres(
        cpus=16,
        mem_bytes=16 * GIB,
        nodes=1,
        gpus=2,
        gpu_types=(("a100", 2),) if typed_alloc else (),
    )
    return replace(j, alloc_tres=alloc, submit_line=submit_line)


def one_of_two_used() -> list[object]:
    tl = timeline([90.0] * 10, [2.0] * 10, n_gpus=2)
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    return [node(gpus, tl=tl, host_summary=host(cores=16, busy_frac=2 / 16))]


def test_gpus_style_job_is_told_gpus_1_without_a_type_it_never_asked_for() -> None:
    # The real case: written with --gpus=2, told "#SBATCH --gres=gpu:a100:1", which sbatch
    # refuses in that script and which adds a type the user never asked for.
    a = analyze(two_gpu_job("sbatch --gpus=2 train.sh"), one_of_two_used(), S)  # type: ignore[arg-type]
    r = rec(a, Option.GPUS)
    assert r is not None, [x.code for x in a.findings]
    assert r.sbatch_lines == ("#SBATCH --gpus=1",)
    assert r.current == "2"


def test_gpus_per_task_style_job_is_told_one_task_not_a_gres_line() -> None:
    a = analyze(
        two_gpu_job("sbatch --ntasks=2 --gpus-per-task=1 run.sh"),
        one_of_two_used(),  # type: ignore[arg-type]
        S,
    )
    r = rec(a, Option.GPUS)
    assert r is not None and r.sbatch_lines == ("#SBATCH --ntasks=1",)


def test_unknown_style_keeps_the_usual_gres_form_but_no_type_from_alloctres() -> None:
    a = analyze(two_gpu_job(None), one_of_two_used(), S)  # type: ignore[arg-type]
    r = rec(a, Option.GPUS)
    assert r is not None and r.sbatch_lines == ("#SBATCH --gres=gpu:1",)


def test_typed_gres_request_keeps_its_type() -> None:
    j = two_gpu_job("sbatch --gres=gpu:a100:2 train.sh")
    a = analyze(j, one_of_two_used(), S)  # type: ignore[arg-type]
    r = rec(a, Option.GPUS)
    assert r is not None and r.sbatch_lines == ("#SBATCH --gres=gpu:a100:1",)


def test_gpus_per_node_style_on_two_nodes() -> None:
    j = replace(
        job(gpus=8, cpus=64, nodes=("gpu001", "gpu002"), total_cpu=4 * 3600.0),
        submit_line="sbatch -N 2 --gpus-per-node=4 train.sh",
    )
    nodes = []
    for h in ("gpu001", "gpu002"):
        gpus = [gpu(f"{h}-0", duty=90.0), gpu(f"{h}-1", duty=90.0)]
        gpus += [gpu(f"{h}-{i}", duty=0.0, process=False) for i in (2, 3)]
        nodes.append(node(gpus, hostname=h, host_summary=host(cores=32, busy_frac=2 / 32)))
    r = rec(analyze(j, nodes, S), Option.GPUS)
    assert r is not None and r.sbatch_lines == ("#SBATCH --gpus-per-node=2",)


def test_gpu_cut_with_cores_per_gpu_comes_with_the_cpu_line_its_busy_cores_need() -> None:
    # The real case (5 of 120 held-out sets): 4 GPUs with --cpus-per-gpu=8, one GPU used while
    # 20 cores were busy; --gpus=1 alone would leave 8 cores.
    tl = timeline([90.0] * 10, [20.0] * 10, n_gpus=4)
    gpus = [gpu("GPU-0", duty=90.0)] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in (1, 2, 3)]
    n = node(gpus, tl=tl, host_summary=host(cores=32, busy_frac=20 / 32))
    j = replace(
        job(gpus=4, cpus=32, total_cpu=20 * 3600.0),
        submit_line="sbatch --gpus=4 --cpus-per-gpu=8 train.sh",
    )
    a = analyze(j, [n], S)
    assert rec(a, Option.GPUS).sbatch_lines == ("#SBATCH --gpus=1",)
    cpu = rec(a, Option.CPUS_PER_GPU)
    assert cpu is not None and cpu.sbatch_lines == ("#SBATCH --cpus-per-gpu=25",)  # 20 × 1.25


def test_gpu_cut_with_cores_per_task_keeps_the_tasks_cores() -> None:
    # -c per task without --gpus-per-task: the cores do not go with the GPUs; no CPU line.
    tl = timeline([90.0] * 10, [20.0] * 10, n_gpus=4)
    gpus = [gpu("GPU-0", duty=90.0)] + [gpu(f"GPU-{i}", duty=0.0, process=False) for i in (1, 2, 3)]
    n = node(gpus, tl=tl, host_summary=host(cores=32, busy_frac=20 / 32))
    j = replace(
        job(gpus=4, cpus=32, total_cpu=20 * 3600.0), submit_line="sbatch --gpus=4 -c 32 x.sh"
    )
    a = analyze(j, [n], S)
    assert rec(a, Option.GPUS) is not None and rec(a, Option.CPUS_PER_GPU) is None


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("sbatch --mem-per-gpu=64G x.sh", "#SBATCH --mem-per-gpu=10G"),
        ("sbatch --mem-per-cpu=8G x.sh", "#SBATCH --mem-per-cpu=1280M"),
        ("sbatch --mem=128G x.sh", "#SBATCH --mem=20G"),
    ],
)
def test_memory_advice_in_the_jobs_own_memory_form(line: str, want: str) -> None:
    # 2 GPUs, 16 cores, 128 GiB asked for, 16 GiB peak: 20 GiB with headroom per node.
    j = replace(
        job(gpus=2, cpus=16, mem=128 * GIB, max_rss=16 * GIB, total_cpu=8 * 3600.0),
        submit_line=line,
    )
    n = node(
        [gpu("GPU-0"), gpu("GPU-1")],
        host_summary=host(cores=16, busy_frac=0.5, rss_max_bytes=16 * GIB),
    )
    r = rec(analyze(j, [n], S), Option.MEMORY)
    assert r is not None and r.sbatch_lines == (want,)


def test_submit_line_options_short_and_long_with_and_without_equals() -> None:
    j = replace(
        job(), submit_line="sbatch -G a100:2 -c 4 --ntasks 2 --mem-per-gpu 8G job.sh --gpus=9"
    )
    got = request_of(j)
    assert got == Request(
        gpu_form="gpus",
        gpu_type="a100",
        ntasks=2,
        cpu_form="cpus-per-task",
        cpus_value=4,
        mem_form="mem-per-gpu",
        from_submit_line=True,
    )
    per_task = request_of(replace(job(), submit_line="sbatch --gpus-per-task=1 -n 4 -c 8 x"))
    assert per_task.gpu_form == GPUS_PER_TASK and per_task.cores_per_gpu
    assert request_of(replace(job(), submit_line="sbatch 'unbalanced")) == Request()


def test_gpu_cut_counts_the_cores_asked_per_gpu_not_the_allocation() -> None:
    # Found by sbatch --test-only on the test cluster: --cpus-per-gpu=2 on 2 GPUs with 3 cores
    # busy; the allocation (8 CPUs) hid that --gpus=1 alone would give 2 cores.
    tl = timeline([90.0] * 10, [3.0] * 10, n_gpus=2)
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    n = node(gpus, tl=tl, host_summary=host(cores=8, busy_frac=3 / 8))
    j = replace(
        job(gpus=2, cpus=8, total_cpu=3 * 3600.0),
        submit_line="sbatch --gpus=2 --cpus-per-gpu=2 x.sh",
    )
    a = analyze(j, [n], S)
    cpu = rec(a, Option.CPUS_PER_GPU)
    assert cpu is not None and cpu.sbatch_lines == ("#SBATCH --cpus-per-gpu=4",)
