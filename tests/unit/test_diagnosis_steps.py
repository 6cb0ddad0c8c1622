"""Step-aware diagnosis (issue 11, items 2, 4 and 10): accounting keeps each step's CPUs, GPUs,
state, exit code, elapsed and CPU time; CPU saturation is judged against what a step was bound
to; failed steps and node failures are reported. Each test is named after the real case."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import GIB, T0, gpu, host, job, node

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sacct_fixtures import parse_rows, row, step
from store_fixtures import make_job, make_node, rolled_back_store

from slurm_gpu.accounting.sacct import FIELDS, TEXT_FIELDS
from slurm_gpu.analysis import Analysis, Audience, Code, Severity, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, JobStep, Tres
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store, migrations
from slurm_gpu.store.sqlite_reader import SqliteReader

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def text_of(a: Analysis, code: Code) -> str:
    f = finding(a, code)
    assert f is not None, [x.code for x in a.findings]
    return wording(ENV, f)[1]


def task_step(
    i: int,
    *,
    cpus: int = 1,
    gpus: int | None = 1,
    state: str = "COMPLETED",
    rc: int = 0,
    elapsed: int = 2400,
    busy: float = 1.0,
) -> JobStep:
    return JobStep(
        step_id=str(i),
        cpus=cpus,
        gpus=gpus,
        nodes=1,
        state=state,
        exit_code=rc,
        exit_signal=0,
        elapsed_s=elapsed,
        total_cpu_s=busy * cpus * elapsed,
    )


BATCH = JobStep("batch", 96, None, 1, "COMPLETED", 0, 0, 36000, 50.0)
EXTERN = JobStep("extern", 96, None, 1, "COMPLETED", 0, 0, 36000, 0.0)


# --------------------------------------------------------------------------- accounting


def test_sacct_keeps_each_step_with_its_cpus_gpus_state_and_exit_code() -> None:
    j = row(JobIDRaw="500", JobID="500", AllocCPUS="96", ElapsedRaw="3600")
    rows = [
        j,
        step(j, "batch", AllocCPUS="96", TotalCPU="00:10.000", ElapsedRaw="3600"),
        step(j, "extern", AllocCPUS="96", TotalCPU="00:00.000", ElapsedRaw="3600"),
        step(
            j,
            "0",
            AllocCPUS="1",
            AllocTRES="cpu=1,mem=4G,node=1,gres/gpu=1",
            State="FAILED",
            ExitCode="1:0",
            ElapsedRaw="1680",
            TotalCPU="27:50.500",
        ),
        step(
            j,
            "1",
            AllocCPUS="1",
            AllocTRES="cpu=1,node=1",
            State="CANCELLED by 1001",
            ExitCode="0:15",
            ElapsedRaw="60",
            TotalCPU="01:00",
        ),
    ]
    rec = parse_rows(rows).jobs["500"]
    assert [s.step_id for s in rec.steps] == ["batch", "extern", "0", "1"]
    s0 = rec.steps[2]
    assert (s0.cpus, s0.gpus, s0.nodes, s0.state, s0.exit_code) == (1, 1, 1, "FAILED", 1)
    assert s0.elapsed_s == 1680 and s0.total_cpu_s == 1670.5
    assert s0.is_task and s0.failed
    s1 = rec.steps[3]
    assert s1.gpus is None and s1.state == "CANCELLED" and s1.exit_signal == 15 and s1.failed
    assert not rec.steps[0].is_task


def test_step_records_come_from_the_accounting_query_which_holds_no_step_name() -> None:
    # Step names are user text: they must not enter the accounting query (whose framing no
    # user string can forge); the text query asks for job lines only.
    assert "JobName" not in FIELDS
    assert "JobName" in TEXT_FIELDS
    j = row(JobIDRaw="501", JobID="501")
    forged = step(j, "0", JobName="x\x1f|\x1f501.1\x1f|\x1fFAILED")
    rec = parse_rows([j, forged]).jobs["501"]
    assert [s.step_id for s in rec.steps] == ["0"]
    assert rec.steps[0].state == "COMPLETED"


# --------------------------------------------------------------------------- the store


def test_steps_survive_the_store_and_the_sqlite_reader(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    steps = (BATCH, task_step(0, state="FAILED", rc=1), task_step(1))
    bundle = JobBundle(
        job=replace(make_job("9"), steps=steps),
        nodes=(make_node("9"),),
        telemetry=TELEMETRY_COMPLETE,
    )
    with Store.open(url) as store:
        store.write_batch([bundle], collected_at_s=1.0)
        got = store.get_job("9")
    assert got is not None and got.job.steps == steps
    with SqliteReader.open(str(tmp_path / "store.db")) as reader:
        again = reader.get_job("9")
    assert again is not None and again.job.steps == steps


def test_a_version_3_store_gains_the_migration_4_columns_and_keeps_its_jobs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    # Back to a version-3 store: no steps column, version 3.
    rolled_back_store(
        url,
        3,
        [
            ("jobs", "steps_json"),
            ("job_gpus", "process_list_unread"),
            ("job_gpus", "stall_grid"),
        ],
    )
    with Store.open(url) as store:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST_VERSION
        got = store.get_job("7")
        assert got is not None and got.job.steps == ()
        # Rows stored before: the GPU counters read as "not counted".
        assert got.nodes[0].gpus[0].process_list_unread is None
        assert got.nodes[0].gpus[0].stall_grid == ()
        store.write_batch(
            [
                JobBundle(
                    job=replace(make_job("8"), steps=(task_step(0),)),
                    nodes=(make_node("8"),),
                    telemetry=TELEMETRY_COMPLETE,
                )
            ],
            collected_at_s=2.0,
        )
        again = store.get_job("8")
        assert again is not None and again.job.steps == (task_step(0),)


# --------------------------------------------------------------------------- the task farm


def _task_farm(steps: tuple[JobStep, ...], *, state: str = "COMPLETED") -> JobRecord:
    # 4 GPUs and 96 cores per node (whole-node site); steps bound to 1 core and 1 GPU each.
    base = job(
        gpus=4,
        cpus=96,
        elapsed=36000,
        limit=43200,
        total_cpu=4 * 36000.0,
        mem=512 * GIB,
        state=state,
    )
    req = Tres(cpus=4, mem_bytes=16 * GIB, nodes=1, gpus=4)
    return replace(base, req_tres=req, steps=(BATCH, EXTERN, *steps))


def _farm_node(duty: float = 68.0) -> object:
    gpus = [gpu(f"GPU-{i}", duty=duty) for i in range(4)]
    # 4 of 96 cores busy all the time: job-wide, the CPUs look idle.
    return node(gpus, end=T0 + 36000, host_summary=host(cores=96, busy_frac=4 / 96))


def test_task_farm_of_one_core_steps_is_cpu_bound_per_step_not_cpu_overrequested() -> None:
    steps = tuple(task_step(i, busy=0.99) for i in range(8))
    a = analyze(_task_farm(steps), [_farm_node()], S)  # type: ignore[list-item]
    f = finding(a, Code.STEPS_CPU_BOUND)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["step_cpus_max"] == 1
    assert f.evidence["step_cpu_efficiency_pct"] == 99.0
    assert finding(a, Code.CPU_OVERREQUESTED) is None
    assert finding(a, Code.LOW_UTILIZATION_UNEXPLAINED) is None
    assert not any(r.finding is Code.CPU_OVERREQUESTED for r in a.recommendations)
    assert "--cpus-per-task" in text_of(a, Code.STEPS_CPU_BOUND)


def test_task_farm_on_a_shared_site_does_not_get_told_to_ask_for_fewer_cores() -> None:
    # Not a whole-node allocation: 96 cores requested and given, steps bound to one each.
    steps = tuple(task_step(i, busy=0.99) for i in range(8))
    farm = replace(_task_farm(steps), req_tres=Tres(cpus=96, mem_bytes=512 * GIB, nodes=1, gpus=4))
    a = analyze(farm, [_farm_node()], S)  # type: ignore[list-item]
    assert not a.metrics.whole_node
    assert finding(a, Code.STEPS_CPU_BOUND) is not None
    assert finding(a, Code.CPU_OVERREQUESTED) is None


def test_steps_that_idle_their_cores_are_not_cpu_bound() -> None:
    steps = tuple(task_step(i, busy=0.3) for i in range(8))
    a = analyze(_task_farm(steps), [_farm_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_CPU_BOUND) is None


def test_steps_bound_to_the_whole_node_leave_the_judgement_to_the_job_wide_rules() -> None:
    steps = tuple(task_step(i, cpus=96, gpus=4, busy=0.99) for i in range(2))
    a = analyze(_task_farm(steps), [_farm_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_CPU_BOUND) is None


def test_all_200_steps_failed_inside_a_completed_job() -> None:
    steps = tuple(task_step(i, state="FAILED", rc=1, elapsed=600) for i in range(200))
    farm = replace(_task_farm(steps), derived_exit_code=1)
    a = analyze(farm, [_farm_node()], S)  # type: ignore[list-item]
    f = finding(a, Code.STEPS_FAILED)
    assert f is not None and f.severity is Severity.CRITICAL
    assert f.evidence["steps"] == 200 and f.evidence["steps_failed"] == 200
    assert f.evidence["first_failed_exit_code"] == 1
    # 200 steps × 1 GPU × 600 s = 33.3 GPU-hours, within the job's 4 × 10 h.
    assert f.evidence["gpu_hours_failed"] == round(200 * 600 / 3600, 3)
    assert f.evidence["job_completed"] == 1
    text = text_of(a, Code.STEPS_FAILED)
    assert "200 of 200" in text and "COMPLETED" in text and "33.33 GPU-hours" in text
    assert f.audience is Audience.USER


def test_some_steps_failed_is_a_warning_with_their_gpu_hours_only() -> None:
    steps = (
        task_step(0, state="FAILED", rc=2, elapsed=3600),
        *(task_step(i) for i in range(1, 10)),
    )
    a = analyze(_task_farm(steps), [_farm_node()], S)  # type: ignore[list-item]
    f = finding(a, Code.STEPS_FAILED)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["steps_failed"] == 1 and f.evidence["gpu_hours_failed"] == 1.0


def test_job_without_steps_gets_no_step_finding() -> None:
    a = analyze(job(), [node()], S)
    assert a.metrics.steps is None
    assert finding(a, Code.STEPS_FAILED) is None and finding(a, Code.STEPS_CPU_BOUND) is None


# --------------------------------------------------------------------------- node failure


def test_64_node_job_ended_by_two_failed_nodes_is_the_sites_problem() -> None:
    hosts = tuple(f"gpu{i:03d}" for i in range(64))
    j = job(
        gpus=256,
        cpus=64 * 32,
        elapsed=6 * 3600,
        state="NODE_FAIL",
        nodes=hosts,
        total_cpu=64 * 32 * 0.5 * 6 * 3600,
    )
    step0 = JobStep("0", 64 * 32, 256, 64, "NODE_FAIL", 0, 0, 6 * 3600, None)
    j = replace(j, steps=(step0,))
    a = analyze(j, [node(end=T0 + 6 * 3600)], S)
    f = finding(a, Code.NODE_FAILED)
    assert f is not None and f.severity is Severity.CRITICAL
    assert f.audience is Audience.SITE
    assert f.evidence["gpu_hours_lost"] == 256 * 6.0
    # The step did not fail by the user's doing: no failed-steps finding.
    assert finding(a, Code.STEPS_FAILED) is None
    text = text_of(a, Code.NODE_FAILED)
    assert "site's problem" in text and "1536.00 GPU-hours" in text


def test_node_fail_of_a_step_in_a_job_that_went_on_is_reported() -> None:
    steps = (JobStep("0", 8, 1, 1, "NODE_FAIL", 0, 0, 600, 100.0), task_step(1, cpus=8))
    a = analyze(replace(job(), steps=steps), [node()], S)
    f = finding(a, Code.NODE_FAILED)
    assert f is not None and f.evidence["steps_node_failed"] == 1
    assert f.evidence["job_node_failed"] == 0


def test_completed_job_has_no_node_failure() -> None:
    assert finding(analyze(job(), [node()], S), Code.NODE_FAILED) is None
