"""Step outcomes read with Slurm's semantics (issue 26, point 1): steps Slurm ended (the time
limit, a node failure, a ``scancel``, the job's own end) are not the user's failures; each
class has its owner, severity and wording. Each test is named after the real case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import T0, gpu, host, job, node
from sacct_fixtures import parse_rows, row, step

from slurm_gpu.analysis import Analysis, Audience, Code, Severity, analyze
from slurm_gpu.analysis.outcomes import StepEnd, node_failure, step_end
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, JobStep

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))
HOURS = 10 * 3600
END = T0 + HOURS


def finding(a: Analysis, code: Code):  # type: ignore[no-untyped-def]
    return next((f for f in a.findings if f.code is code), None)


def text_of(a: Analysis, code: Code) -> str:
    f = finding(a, code)
    assert f is not None, [x.code for x in a.findings]
    return wording(ENV, f)[1]


def killed(i: int, state: str, rc: int, sig: int, *, end: float = END) -> JobStep:
    """A step ended at ``end`` (the job's end by default) the way Slurm ends steps."""
    return JobStep(str(i), 16, 1, 1, state, rc, sig, HOURS, 1000.0, tasks=1, end_s=end)


def four_gpu_job(state: str, steps: tuple[JobStep, ...], **over: object) -> JobRecord:
    j = job(gpus=4, cpus=64, elapsed=HOURS, limit=HOURS, state=state, total_cpu=64 * 0.3 * HOURS)
    return replace(j, steps=steps, **over)  # type: ignore[arg-type]


def busy_node(last_kernel: float = END) -> object:
    gpus = [gpu(f"GPU-{i}", duty=80.0, end=END, active=(T0 + 10, last_kernel)) for i in range(4)]
    return node(gpus, end=END, host_summary=host(cores=64, busy_frac=0.3, elapsed=HOURS))


def test_timeout_job_whose_steps_slurm_killed_is_told_the_time_limit_not_failures() -> None:
    # The real case: a 10-hour TIMEOUT job, four srun steps CANCELLED 0:15 / FAILED 0:9 / exit
    # 0 / exit 127 at its end; today STEPS_FAILED said "4 of 4 failed, the first with exit code
    # 0 ... end the batch script with set -e" at critical severity.
    steps = (
        killed(0, "CANCELLED", 0, 15),
        killed(1, "FAILED", 0, 9),
        killed(2, "FAILED", 0, 0),
        killed(3, "FAILED", 127, 0),
    )
    a = analyze(four_gpu_job("TIMEOUT", steps), [busy_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    f = finding(a, Code.TIME_LIMIT_REACHED)
    assert f is not None and f.severity is Severity.WARNING and f.audience is Audience.USER
    assert f.evidence["steps_ended_by_time_limit"] == 4
    text = text_of(a, Code.TIME_LIMIT_REACHED)
    assert "time limit (10:00:00)" in text and "checkpoint" in text and "--time" in text
    assert "set -e" not in text


def test_timeout_job_with_a_step_that_failed_earlier_on_its_own_keeps_that_failure() -> None:
    steps = (
        killed(0, "FAILED", 1, 0, end=T0 + 600),  # its program exited 1 after 10 min
        killed(1, "CANCELLED", 0, 15),
    )
    a = analyze(four_gpu_job("TIMEOUT", steps), [busy_node()], S)  # type: ignore[list-item]
    f = finding(a, Code.STEPS_FAILED)
    assert f is not None and f.evidence["steps_failed"] == 1
    assert f.evidence["steps_ended_by_slurm"] == 1
    assert f.severity is Severity.WARNING  # one of two, not every step
    assert finding(a, Code.TIME_LIMIT_REACHED) is not None


def test_job_failed_with_a_node_fail_step_is_a_node_failure_with_nothing_for_the_user() -> None:
    # The real case: the job says FAILED; its step 0 NODE_FAIL, steps 1-3 killed at the end.
    steps = (
        killed(0, "NODE_FAIL", 0, 0),
        killed(1, "CANCELLED", 0, 9),
        killed(2, "FAILED", 0, 9),
        killed(3, "FAILED", 127, 0),
    )
    j = four_gpu_job("FAILED", steps)
    # The GPUs' last kernel 40 minutes before Slurm ended the job: lost to the failure.
    a = analyze(j, [busy_node(last_kernel=END - 2400)], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    f = finding(a, Code.NODE_FAILED)
    assert f is not None and f.audience is Audience.SITE and f.severity is Severity.CRITICAL
    assert f.evidence["steps_node_failed"] == 4 and f.evidence["job_state_failed"] == 1
    assert f.evidence["gpu_hours_after_progress"] == round(4 * 2400 / 3600, 3)
    text = text_of(a, Code.NODE_FAILED)
    assert "nothing in the job to fix" in text and "2.67 GPU-hours after the job's last" in text


def test_job_failed_with_a_node_down_reason_and_no_node_fail_step_is_a_node_failure() -> None:
    steps = (killed(0, "FAILED", 0, 9), killed(1, "CANCELLED", 0, 15))
    j = four_gpu_job("FAILED", steps, reason="NodeDown")
    assert node_failure(j)
    a = analyze(j, [busy_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    f = finding(a, Code.NODE_FAILED)
    assert f is not None and f.evidence["steps_node_failed"] == 2
    assert "went down" in text_of(a, Code.NODE_FAILED)


def test_steps_the_user_cancelled_are_not_failures() -> None:
    steps = (
        replace(killed(0, "CANCELLED", 0, 15, end=T0 + 900), cancelled_by_uid=1000),
        killed(1, "COMPLETED", 0, 0),
    )
    j = four_gpu_job("COMPLETED", steps)
    assert step_end(steps[0], j, False) is StepEnd.USER_CANCEL
    a = analyze(j, [busy_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    f = finding(a, Code.STEPS_ENDED_WITH_JOB)
    assert f is not None and f.severity is Severity.INFO and f.evidence["steps_cancelled"] == 1


def test_job_cancelled_by_its_user_ends_its_steps_by_that_scancel() -> None:
    steps = (killed(0, "CANCELLED", 0, 15), killed(1, "CANCELLED", 0, 9))
    j = four_gpu_job("CANCELLED", steps, cancelled_by_uid=1000)
    assert [step_end(st, j, False) for st in steps] == [StepEnd.USER_CANCEL] * 2
    a = analyze(j, [busy_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    assert "cancelled (scancel)" in text_of(a, Code.STEPS_ENDED_WITH_JOB)


def test_background_steps_running_when_the_batch_script_returned_ended_with_the_job() -> None:
    steps = (killed(0, "COMPLETED", 0, 0), killed(1, "CANCELLED", 0, 15))
    j = four_gpu_job("COMPLETED", steps)
    assert step_end(steps[1], j, False) is StepEnd.JOB_END
    a = analyze(j, [busy_node()], S)  # type: ignore[list-item]
    assert finding(a, Code.STEPS_FAILED) is None
    text = text_of(a, Code.STEPS_ENDED_WITH_JOB)
    assert "batch script returned" in text and "wait" in text


def test_segfault_and_exit_code_one_remain_the_users_failures_at_the_jobs_end() -> None:
    j = four_gpu_job("FAILED", ())
    assert step_end(killed(0, "FAILED", 0, 11), j, False) is StepEnd.OWN_FAILURE
    assert step_end(killed(1, "FAILED", 1, 0), j, False) is StepEnd.OWN_FAILURE
    assert step_end(killed(2, "OUT_OF_MEMORY", 0, 0), j, False) is StepEnd.OWN_FAILURE


def test_sacct_keeps_each_steps_task_count_end_time_and_canceller() -> None:
    j = row(JobIDRaw="700", JobID="700", State="FAILED", Reason="NodeDown")
    rows = [
        j,
        step(
            j,
            "0",
            State="CANCELLED by 1001",
            ExitCode="0:15",
            NTasks="4",
            End="1795000013",
        ),
    ]
    rec = parse_rows(rows).jobs["700"]
    (st,) = rec.steps
    assert (st.tasks, st.end_s, st.cancelled_by_uid) == (4, 1795000013.0, 1001)
    assert rec.reason == "NodeDown" and node_failure(rec)
