"""The diagnosis with stack samples (``docs/stacks.md``): a data-loading finding confirmed or
withdrawn, idle phases explained, collective waits per rank, and the STACK_PROFILE note;
nothing changes without them or with too few."""

from __future__ import annotations

from dataclasses import replace

import jinja2
import pytest

from slurm_gpu.analysis import Code, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.traces import Trace, generate
from slurm_gpu.records import StackProcess, StackSummary
from slurm_gpu.resources import data_path

S = AnalysisSettings()
CLASSES = (
    "collective",
    "input_wait",
    "checkpoint_io",
    "evaluation",
    "h2d_copy",
    "compute",
    "sleep_idle",
    "other",
)


def summary(
    shares: dict[str, int],
    *,
    idle: dict[str, int] | None = None,
    ranks: tuple[dict[str, int], ...] = (),
    start: float = 1.7e9,
) -> StackSummary:
    counts = tuple(shares.get(c, 0) for c in CLASSES)
    procs = tuple(
        StackProcess(100 + i, sum(r.values()), tuple(r.get(c, 0) for c in CLASSES))
        for i, r in enumerate(ranks)
    )
    return StackSummary(
        classes=CLASSES,
        counts=counts,
        idle_counts=tuple((idle or {}).get(c, 0) for c in CLASSES),
        deciding=tuple(("dataloader.__next__",) if c == "input_wait" else () for c in CLASSES),
        interval_s=300.0,
        bursts=20,
        bursts_failed=0,
        first_s=start + 60,
        last_s=start + 3000,
        processes=procs,
    )


def with_stacks(trace: Trace, st: StackSummary) -> tuple[Trace, list]:  # type: ignore[type-arg]
    nodes = [replace(n, stacks=st) for n in trace.nodes]
    return trace, nodes


def codes(trace: Trace, nodes: list) -> dict[Code, dict]:  # type: ignore[type-arg]
    return {f.code: dict(f.evidence) for f in analyze(trace.job, nodes, S).findings}


DATALOADER = generate("dataloader", 1)


def test_without_stacks_nothing_changes() -> None:
    got = codes(DATALOADER, list(DATALOADER.nodes))
    assert Code.DATALOADER_BOUND in got and Code.STACK_PROFILE not in got
    assert not any(k.startswith("stacks_") for k in got[Code.DATALOADER_BOUND])


def test_the_stacks_confirm_the_data_loading_finding() -> None:
    st = summary({"input_wait": 41, "compute": 50, "sleep_idle": 9})
    got = codes(*with_stacks(DATALOADER, st))
    ev = got[Code.DATALOADER_BOUND]
    assert ev["stacks_input_wait_pct"] == 41.0 and ev["stacks_confirmed"] == 1
    assert ev["stacks_samples"] == 100 * len(DATALOADER.nodes)
    assert got[Code.STACK_PROFILE]["input_wait_pct"] == 41.0
    assert "withdrew_DATALOADER_BOUND" not in got[Code.STACK_PROFILE]


def test_the_stacks_withdraw_the_data_loading_finding() -> None:
    st = summary({"input_wait": 2, "compute": 90, "other": 8})
    got = codes(*with_stacks(DATALOADER, st))
    assert Code.DATALOADER_BOUND not in got
    assert got[Code.STACK_PROFILE]["withdrew_DATALOADER_BOUND"] == 1
    assert got[Code.STACK_PROFILE]["compute_pct"] == 90.0


def test_a_withdrawal_takes_the_too_few_cores_finding_and_its_advice_with_it() -> None:
    """Seen on the test cluster: a job writing checkpoints on its one saturated core had
    DATALOADER_BOUND withdrawn but kept TOO_FEW_CPUS_PER_GPU ("the site recommends at least 4
    for input pipelines") and its --cpus-per-gpu advice, which rest on the same guess."""
    assert Code.TOO_FEW_CPUS_PER_GPU in codes(DATALOADER, list(DATALOADER.nodes))
    st = summary({"input_wait": 0, "checkpoint_io": 92, "sleep_idle": 8})
    result = analyze(DATALOADER.job, with_stacks(DATALOADER, st)[1], S)
    got = {f.code for f in result.findings}
    assert Code.DATALOADER_BOUND not in got and Code.TOO_FEW_CPUS_PER_GPU not in got
    assert not [r for r in result.recommendations if "cpus-per-gpu" in " ".join(r.sbatch_lines)]


def test_in_between_the_finding_stands_with_the_share_quoted() -> None:
    st = summary({"input_wait": 10, "compute": 90})
    ev = codes(*with_stacks(DATALOADER, st))[Code.DATALOADER_BOUND]
    assert ev["stacks_input_wait_pct"] == 10.0 and ev["stacks_confirmed"] == 0


def test_too_few_samples_change_nothing() -> None:
    st = summary({"input_wait": 1, "compute": 5})  # 6 samples per node, under 30
    got = codes(*with_stacks(DATALOADER, st))
    assert Code.DATALOADER_BOUND in got and Code.STACK_PROFILE not in got


def unread(*notes: str, bursts_failed: int = 12) -> StackSummary:
    """What a node records when stack sampling was on and read nothing, with its reasons."""
    return replace(
        summary({}), bursts=0, bursts_failed=bursts_failed, first_s=None, last_s=None, notes=notes
    )


def test_stack_sampling_that_read_nothing_says_why() -> None:
    """Seen on a proctrack/linuxproc site: the user opted in, got no stacks and no word why."""
    got = codes(*with_stacks(DATALOADER, unread("no_cgroup")))
    ev = got[Code.STACK_PROFILE]
    assert ev["stacks_unread"] == 1 and ev["stacks_note_no_cgroup"] == 1
    assert ev["stacks_samples"] == 0 and ev["stacks_bursts_failed"] == 12 * len(DATALOADER.nodes)
    # Nothing was measured from inside: the data-loading finding stands unconfirmed.
    assert "stacks_confirmed" not in got[Code.DATALOADER_BOUND]
    env = environment(jinja2.FileSystemLoader(f"{data_path('templates')}/findings"))
    found = analyze(DATALOADER.job, with_stacks(DATALOADER, unread("no_cgroup"))[1], S).findings
    title, text = wording(env, next(f for f in found if f.code is Code.STACK_PROFILE))
    assert "read nothing" in title
    assert "no cgroup" in text and "proctrack/cgroup" in text


def test_every_reason_a_node_can_give_is_worded() -> None:
    env = environment(jinja2.FileSystemLoader(f"{data_path('templates')}/findings"))
    reasons = (
        "no_cgroup",
        "no_python_process",
        "ptrace_disabled",
        "ptrace_scope_needs_capability",
        "permission_denied",
        "timeout",
        "too_large",
        "not_python",
        "failed",
        "reader_missing",
    )
    for reason in reasons:
        found = analyze(DATALOADER.job, with_stacks(DATALOADER, unread(reason))[1], S).findings
        _, text = wording(env, next(f for f in found if f.code is Code.STACK_PROFILE))
        assert "because" in text and "not worded" not in text, (reason, text)


def test_a_short_job_with_no_reason_gets_no_note() -> None:
    got = codes(*with_stacks(DATALOADER, unread(bursts_failed=0)))
    assert Code.STACK_PROFILE not in got


def test_idle_phases_are_explained_by_what_the_process_did_while_the_gpus_idled() -> None:
    trace = generate("task-farm", 1)  # IDLE_PHASES among its findings
    assert Code.IDLE_PHASES in codes(trace, list(trace.nodes))
    st = summary(
        {"compute": 60, "checkpoint_io": 35, "sleep_idle": 5},
        idle={"checkpoint_io": 35, "sleep_idle": 5},
    )
    got = codes(*with_stacks(trace, st))
    ev = got[Code.IDLE_PHASES]
    assert ev["stacks_idle_checkpoint_io_pct"] == pytest.approx(87.5)
    assert ev["stacks_idle_sleep_idle_pct"] == pytest.approx(12.5)


def test_collective_waits_per_rank() -> None:
    # An imbalance trace on the imbalanced side of its ground-truth line (the generator draws
    # on both sides).
    trace = next(t for i in range(1, 40) if (t := generate("imbalance", i)).labels)
    fast = {"collective": 60, "compute": 40}
    slow = {"collective": 5, "compute": 95}
    got = codes(
        *with_stacks(trace, summary({"collective": 65, "compute": 135}, ranks=(fast, slow)))
    )
    ev = got[Code.GPU_IMBALANCE]
    assert ev["stacks_ranks"] == 2 * len(trace.nodes)
    assert ev["stacks_collective_max_pct"] == 60.0 and ev["stacks_collective_min_pct"] == 5.0


def test_the_words_state_the_share_and_the_coverage() -> None:
    env = environment(jinja2.FileSystemLoader(f"{data_path('templates')}/findings"))
    st = summary({"input_wait": 41, "compute": 50, "sleep_idle": 9})
    found = analyze(DATALOADER.job, with_stacks(DATALOADER, st)[1], S).findings
    texts = {f.code: wording(env, f)[1] for f in found}
    assert (
        "the main process waited for the next batch 41 % of the time"
        in texts[Code.DATALOADER_BOUND]
    )
    note = texts[Code.STACK_PROFILE]
    assert "41 % waiting for input data" in note and "in 20 bursts" in note
    assert "Deciding frames: input_wait: dataloader.__next__" in note
    withdrawn = summary({"input_wait": 2, "compute": 90, "other": 8})
    found = analyze(DATALOADER.job, with_stacks(DATALOADER, withdrawn)[1], S).findings
    note = {f.code: wording(env, f)[1] for f in found}[Code.STACK_PROFILE]
    assert "The data-loading finding was withdrawn" in note


def test_gpueff_shows_the_stack_evidence_of_a_stored_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gpueff_factory as F
    from test_gpueff_store import WithRecommendation, _settings

    from slurm_gpu.jobreport.readers import StoreAndSpoolReader
    from slurm_gpu.jobreport.service import report_for
    from slurm_gpu.jobreport.terminal import TerminalRenderer
    from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

    job = F.job()
    record = replace(
        F.node_record(),
        stacks=summary({"input_wait": 41, "compute": 50, "sleep_idle": 9}, start=job.start_s or 0),
    )
    settings = _settings(tmp_path)
    analysis = analyze(job, [record], settings.analysis)
    findings = tuple(
        WithRecommendation(f.code, f.severity, f.cause, f.evidence, f.subject)
        for f in analysis.findings
    )
    with Store.open(settings.store_url) as store:
        store.write_batch(
            [
                JobBundle(
                    job, (record,), TELEMETRY_COMPLETE, findings=findings, analysis_version="1"
                )
            ],
            collected_at_s=1.0,
        )
    reader = StoreAndSpoolReader(settings)
    text = TerminalRenderer(colour=False).report(report_for(job, reader, min_elapsed_s=30))
    reader.close()
    text = " ".join(text.split())  # the terminal wraps lines
    assert "Where the job's Python time went (stack samples)" in text
    assert "41 % waiting for input data" in text
    assert "Deciding frames: input_wait: dataloader.__next__" in text
