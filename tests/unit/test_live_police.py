"""``slurm-gpu police``: the live policy's decisions, its actions, its records and its
refusals to act on incomplete, stale, contradictory or misattributed data (issue 25)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.cli.admin import cli
from slurm_gpu.errors import AccountingError
from slurm_gpu.live.allocation import SlurmJob, parse_gpu_detail, parse_squeue, running_gpu_jobs
from slurm_gpu.live.localwindows import local_windows
from slurm_gpu.live.police import PoliceOptions, run_pass
from slurm_gpu.live.policy import Decision, PolicyConfig, decide
from slurm_gpu.notify.transport import DirMailer
from slurm_gpu.prometheus.client import Sample
from slurm_gpu.prometheus.windows import (
    assemble,
    detail_queries,
    read_windows,
    target_host,
    window_queries,
)
from slurm_gpu.records import GpuWindow, LiveGpu, LiveJob, PartWindow
from slurm_gpu.store import Store, migrations, schema
from slurm_gpu.store.liveactions import LiveAction, actions_for, record_actions

NOW = 10_000_000.0
HOUR = 3600.0


def gw(
    uuid: str,
    *,
    util_max: float | None = 0.0,
    points: int = 1800,
    busy_growth: float | None = 0.0,
    sampled_growth: float | None = HOUR,
    used: bool = True,
    age_s: float = 4 * HOUR,
    seen_age_s: float | None = 2.0,
    reset: bool = False,
    index: int = 0,
) -> GpuWindow:
    """A GPU over the one-hour window; by default idle over all of it by both signals.
    ``index``: the number its series name it by (``gpu_index``)."""
    return GpuWindow(
        uuid=uuid,
        util_max_pct=util_max,
        util_points=points,
        busy_growth_s=busy_growth,
        sampled_growth_s=sampled_growth,
        window_s=HOUR,
        counter_reset=reset,
        ever_used=used,
        busy_s=age_s / 2 if used else 0.0,
        sampled_s=age_s,
        seen_age_s=seen_age_s,
        gpu_index=(str(index),),
    )


def busy(uuid: str, index: int = 0) -> GpuWindow:
    return gw(uuid, util_max=93.0, busy_growth=0.93 * HOUR, index=index)


def pw(
    job_id: str,
    host: str,
    gpus: Sequence[GpuWindow],
    *,
    user: str = "alice",
    targets: tuple[str, ...] | None = None,
    scrape_job: str = "slurm-gpu",
    seen_age_s: float | None = 2.0,
    advanced: bool | None = True,
    skew_s: float | None = 0.5,
    span_s: float = 4 * HOUR,
    sources: int = 1,
) -> PartWindow:
    return PartWindow(
        job_id=job_id,
        host=host,
        user=user,
        account="physics",
        targets=(host,) if targets is None else targets,
        scrape_jobs=(scrape_job,),
        sources=sources,
        seen_age_s=seen_age_s,
        advanced=advanced,
        skew_s=skew_s,
        span_s=span_s,
        gpus=tuple(gpus),
    )


def sj(
    job_id: str,
    gpus: Mapping[str, int] | None = None,
    *,
    user: str = "alice",
    account: str = "physics",
    qos: str = "normal",
    started_ago_s: float = 4 * HOUR,
    conflict: str = "",
) -> SlurmJob:
    per_node = dict(gpus or {"n1": 1})
    return SlurmJob(
        job_id,
        user,
        account,
        "gpu",
        qos,
        tuple(per_node),
        NOW - started_ago_s,
        {n: tuple(range(k)) for n, k in per_node.items()},
        conflict,
    )


IDLE = [gw("GPU-a"), busy("GPU-b", index=1)]
NEVER = [gw("GPU-c", used=False)]
HEALTHY = [busy("GPU-d")]


def acts(decisions: Sequence[Decision]) -> dict[tuple[str, str], str]:
    return {(d.job_id, d.rule): d.action for d in decisions if d.action != "skip"}


def of(decisions: Sequence[Decision], job_id: str) -> Decision:
    [d] = [d for d in decisions if d.job_id == job_id]
    return d


def warned(
    job_id: str, rule: str, at_s: float, user: str = "alice", action: str = "warned"
) -> LiveAction:
    return LiveAction(job_id, rule, action, user, "physics", at_s, 1, 3600.0, "")


# --------------------------------------------------------------- two confirmations (item 1)


def test_an_idle_gpu_is_warned_and_a_healthy_job_is_judged_and_left_alone() -> None:
    parts = [pw("1", "n1", IDLE), pw("2", "n1", HEALTHY, user="bob")]
    jobs = {"1": sj("1", {"n1": 2}), "2": sj("2", user="bob")}
    out = decide(parts, jobs, [], PolicyConfig(), NOW)
    assert acts(out) == {("1", "idle"): "warn"}
    d = of(out, "1")
    assert d.gpus == 1 and d.user == "alice" and "GPU-a" in d.evidence[0]
    assert "at most 0 % duty cycle over the last 60 min" in d.evidence[0]
    healthy = of(out, "2")
    assert (healthy.status, healthy.reason) == ("judged", "no GPU idle over the whole window")


def test_a_never_used_gpu_is_its_own_rule() -> None:
    out = decide([pw("3", "n1", NEVER)], {"3": sj("3")}, [], PolicyConfig(), NOW)
    assert acts(out) == {("3", "never_used"): "warn"}


def test_a_busy_gpu_after_a_prometheus_restart_is_never_idle() -> None:
    """Issue 25 item 1: Prometheus answers the stale idle_since for 5 minutes after a restart
    while the utilisation says 0.93; the maximum over the window is what counts."""
    answers = {
        "last": [Sample(_labels(""), NOW - 3)],
        "span": [Sample(_labels(""), 4 * HOUR)],
        "scraped": [Sample(_labels(""), NOW - 2)],
        "changes": [Sample(_labels(""), 12.0)],
        # The GPU worked at 93 % after the restart: its maximum over the window says so. Its
        # other figures are read only for GPUs at or below the threshold (none here), and the
        # idle_since that lingers after the restart is read by no rule.
        "util_max": [Sample(_labels("", "GPU-a"), 0.93)],
        "gpu_index": [Sample({**_labels("", "GPU-a"), "gpu_index": "0"}, 1.0)],
    }
    parts = assemble(answers, NOW, HOUR, "instance")
    [p] = parts
    assert p.targets == ("n1",) and p.gpus[0].util_max_pct == pytest.approx(93.0)
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0, grace_s=0.0)
    past = [warned("1", "idle", NOW - HOUR)]
    out = decide(parts, {"1": sj("1")}, past, cfg, NOW)
    assert acts(out) == {}
    assert of(out, "1").reason == "no GPU idle over the whole window"


def _labels(name: str, uuid: str = "", job_id: str = "1", host: str = "n1") -> dict[str, str]:
    labels = {
        "job_id": job_id,
        "host": host,
        "user": "alice",
        "account": "physics",
        "instance": f"{host}.example.org:9817",
        "job": "slurm-gpu",
    }
    if name:
        labels["__name__"] = name
    if uuid:
        labels["gpu_uuid"] = uuid
    return labels


@pytest.mark.parametrize(
    ("gpu", "why"),
    [
        (gw("GPU-a", busy_growth=0.9 * HOUR), "signals disagree"),
        (gw("GPU-a", sampled_growth=0.3 * HOUR), "readings cover 1080 s of the 3600 s window"),
        (gw("GPU-a", reset=True), "counters restarted"),
        (gw("GPU-a", util_max=None, points=0), "no utilisation series"),
        (gw("GPU-a", busy_growth=None), "no busy or sampled counter"),
        (gw("GPU-a", seen_age_s=600.0), "last scraped 600 s ago"),
    ],
)
def test_a_missing_or_disagreeing_signal_is_not_judged(gpu: GpuWindow, why: str) -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    out = decide([pw("1", "n1", [gpu])], {"1": sj("1")}, [warned("1", "idle", 0.0)], cfg, NOW)
    assert acts(out) == {}
    d = of(out, "1")
    assert d.status == "not_judged" and why in d.reason, d.reason


# ------------------------------------------------- freshness by Prometheus' clock (item 3)


@pytest.mark.parametrize("skew_s", [300.0, -300.0])
def test_a_nodes_clock_5_minutes_off_is_shown_and_never_used(skew_s: float) -> None:
    """Issue 25 item 3: a node 5 minutes behind made its jobs stale forever; freshness is now
    Prometheus' scrape time, the skew is reported only."""
    out = decide([pw("1", "n1", NEVER, skew_s=skew_s)], {"1": sj("1")}, [], PolicyConfig(), NOW)
    d = of(out, "1")
    assert d.action == "warn" and d.skew_s == skew_s


def test_a_job_inside_its_grace_by_slurms_start_is_not_judged_whatever_the_node_says() -> None:
    # The node claims 4 h of readings; Slurm started the job 10 minutes ago.
    out = decide(
        [pw("1", "n1", NEVER)], {"1": sj("1", started_ago_s=600.0)}, [], PolicyConfig(), NOW
    )
    assert acts(out) == {} and of(out, "1").status == "grace"


@pytest.mark.parametrize(
    ("part", "status", "why"),
    [
        (pw("1", "n1", IDLE, seen_age_s=600.0), "stale", "last scraped 600 s ago"),
        (pw("1", "n1", IDLE, seen_age_s=None), "stale", "last scraped never"),
        (pw("1", "n1", IDLE, advanced=False), "stale", "frozen data"),
        (
            pw("1", "n1", [dataclasses.replace(IDLE[0], sampled_s=HOUR), IDLE[1]]),
            "not_judged",
            "gaps",
        ),
    ],
)
def test_police_never_acts_on_stale_frozen_or_gappy_data(
    part: PartWindow, status: str, why: str
) -> None:
    out = decide([part], {"1": sj("1", {"n1": 2})}, [], PolicyConfig(cancel=True), NOW)
    assert acts(out) == {}
    d = of(out, "1")
    assert d.status == status and why in d.reason, d.reason


# ------------------------------------------------------ bound to Slurm's allocation (item 2)


@pytest.mark.parametrize(
    ("parts", "jobs", "why"),
    [
        ([pw("1", "n1", NEVER, targets=("n7",))], {"1": sj("1")}, "came from target(s) n7"),
        ([pw("1", "n1", NEVER, targets=("",))], {"1": sj("1")}, "no target label"),
        ([pw("1", "n1", NEVER, targets=("n1", "n7"))], {"1": sj("1")}, "target(s) n1, n7"),
        ([pw("1", "n1", NEVER, scrape_job="other")], {"1": sj("1")}, "scrape job(s) other"),
        ([pw("1", "n2", NEVER)], {"1": sj("1")}, "where Slurm allocated the job no GPU"),
        ([pw("1", "n1", [*NEVER, gw("GPU-x")])], {"1": sj("1")}, "2 GPU series on n1"),
        ([pw("1", "n1", NEVER)], {"1": sj("1", conflict="contradicts")}, "contradicts"),
    ],
)
def test_series_not_bound_to_slurms_allocation_are_a_mismatch(
    parts: list[PartWindow], jobs: dict[str, SlurmJob], why: str
) -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    out = decide(parts, jobs, [warned("1", "never_used", 0.0)], cfg, NOW)
    assert acts(out) == {}
    d = of(out, "1")
    assert d.status == "mismatch" and why in d.reason, d.reason


def test_a_forged_series_for_another_jobs_gpu_makes_both_a_mismatch() -> None:
    """Issue 25 item 2: a target serving a 'never used' GPU under another user's job id."""
    real = pw("1", "n1", HEALTHY, user="bob")
    forged = pw("2", "n1", [gw("GPU-d", used=False)])  # bob's GPU under alice's job 2
    out = decide([real, forged], {"1": sj("1", user="bob"), "2": sj("2")}, [], PolicyConfig(), NOW)
    assert acts(out) == {}
    assert {of(out, j).status for j in "12"} == {"mismatch"}


def test_an_ended_jobs_lingering_series_claim_no_gpu() -> None:
    # After a Prometheus restart an ended job's series stay 5 minutes, stale; the GPU's new
    # job is judged as usual.
    lingering = pw("1", "n1", [gw("GPU-c")], seen_age_s=200.0)
    out = decide([lingering, pw("2", "n1", NEVER)], {"2": sj("2")}, [], PolicyConfig(), NOW)
    assert acts(out) == {("2", "never_used"): "warn"}


def test_the_target_host_is_read_from_the_target_label() -> None:
    assert target_host("gpu-01.example.org:9817") == "gpu-01"
    assert target_host("gpu-01") == "gpu-01"
    assert target_host("10.0.0.7:9817") == "10.0.0.7"
    assert target_host("[fe80::1]:9817") == "fe80::1"
    assert target_host("") == ""


def test_two_targets_serving_one_job_and_host_are_kept_apart() -> None:
    answers = {
        "scraped": [
            Sample(_labels(""), NOW - 2),
            Sample({**_labels(""), "instance": "n9:9817"}, NOW - 2),
        ]
    }
    [p] = assemble(answers, NOW, HOUR, "instance")
    assert p.targets == ("n1", "n9") and p.sources == 2
    # The same node claimed by a second target (the target label forged under honor_labels)
    both = {"scraped": [*answers["scraped"], Sample({**_labels(""), "node": "n1"}, NOW - 2)]}
    [q] = assemble(both, NOW, HOUR, "node")
    assert q.sources == 3
    out = decide([pw("1", "n1", NEVER, sources=2)], {"1": sj("1")}, [], PolicyConfig(), NOW)
    assert of(out, "1").status == "mismatch" and "2 scrape targets" in of(out, "1").reason


def test_an_idle_gpu_is_read_whole_from_the_window_answers() -> None:
    gpu = _labels("", "GPU-c")
    answers = {
        "last": [Sample(_labels(""), NOW - 3)],
        "span": [Sample(_labels(""), 4 * HOUR)],
        "scraped": [Sample(_labels(""), NOW - 2)],
        "changes": [Sample(_labels(""), 12.0)],
        "util_max": [Sample(gpu, 0.0)],
        "util_scraped": [Sample(gpu, NOW - 2)],
        "util_points": [Sample(gpu, 1800.0)],
        "busy_growth": [Sample(gpu, 0.0)],
        "sampled_growth": [Sample(gpu, HOUR - 10)],
        "resets": [Sample(gpu, 0.0)],
        "busy_s": [Sample(gpu, 0.0)],
        "sampled_s": [Sample(gpu, 4 * HOUR)],
        "gpu_index": [Sample({**gpu, "gpu_index": "0"}, 1.0)],
    }
    [p] = assemble(answers, NOW, HOUR, "instance")
    assert p.user == "alice" and p.skew_s == pytest.approx(1.0) and p.span_s == 4 * HOUR
    [g] = p.gpus
    assert g.ever_used is False and g.seen_age_s == 2.0 and g.window_s == HOUR
    assert g.gpu_index == ("0",)
    out = decide([p], {"1": sj("1")}, [], PolicyConfig(), NOW)
    assert acts(out) == {("1", "never_used"): "warn"}
    # Without the "first_active" answer it was never used; with it, the rule is "idle".
    answers["first_active"] = [Sample(gpu, NOW - 3 * HOUR)]
    [p] = assemble(answers, NOW, HOUR, "instance")
    assert acts(decide([p], {"1": sj("1")}, [], PolicyConfig(), NOW)) == {("1", "idle"): "warn"}


def test_the_window_queries_read_the_whole_window_at_scrape_resolution() -> None:
    q = window_queries(3600.0, 120.0, 1.0, "node")
    part = "job_id, host, job, instance, node"
    assert q["util_max"] == (
        f"max by ({part}, gpu_uuid) (max_over_time(slurm_gpu_gpu_utilization_ratio[3600s]))"
    )
    assert q["scraped"] == (
        f"max by ({part}) (timestamp(slurm_gpu_job_last_sample_timestamp_seconds))"
    )
    assert "changes(slurm_gpu_job_last_sample_timestamp_seconds[120s])" in q["changes"]
    d = detail_queries(["12", "7"], 3600.0, "node")
    sel = 'job_id=~"7|12"'
    assert d["busy_growth"] == (
        f"max by ({part}, gpu_uuid) (max_over_time(slurm_gpu_gpu_busy_seconds_total{{{sel}}}"
        f"[3600s]) - min_over_time(slurm_gpu_gpu_busy_seconds_total{{{sel}}}[3600s]))"
    )
    assert "idle_since" not in " ".join([*q.values(), *d.values()])
    with pytest.raises(ValueError):
        window_queries(3600.0, 120.0, 1.0, 'x"}) or vector(1')
    with pytest.raises(ValueError):
        detail_queries(['1"} or vector(1)'], 3600.0)


SCONTROL = b"""JobId=1 JobName=train
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=n[1-2]
   JOB_GRES=gpu:a100:3
     Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0-1)
     Nodes=n2 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:1(IDX:3)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0

JobId=2 JobName=cpu
   NodeList=n1
     Nodes=n1 CPU_IDs=4 Mem=0 GRES=
JobId=3 JobName=x
     Nodes=n3 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)
     Nodes=n3 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:1)
"""


def test_slurms_gpu_indices_per_node_are_read_from_scontrol() -> None:
    alloc, conflicts = parse_gpu_detail(SCONTROL.decode())
    assert alloc["1"] == {"n1": (0, 1), "n2": (3,)}
    assert alloc["2"] == {"n1": ()}
    assert conflicts == {"3"}
    jobs = parse_squeue("1|alice|physics|gpu|normal|1700000000|n[1-2]\nbad line\n")
    assert jobs["1"].nodes == ("n1", "n2") and jobs["1"].start_s == 1700000000.0


# ------------------------------------------------------ every job accounted for (item 3)


def test_every_running_gpu_job_gets_a_decision_with_its_reason() -> None:
    parts = [pw("1", "n1", IDLE), pw("2", "n1", HEALTHY), pw("9", "n1", NEVER)]
    jobs = {
        "1": sj("1", {"n1": 2}),
        "2": sj("2"),
        "3": sj("3", {"n5": 1}),  # its node's exporter is down
        "4": sj("4", {"n1": 0, "n6": 1}),  # one node with GPUs sends nothing
    }
    jobs["4"] = dataclasses.replace(jobs["4"], gpu_idx={"n6": (0,)})
    out = decide(parts, jobs, [], PolicyConfig(), NOW)
    status = {d.job_id: d.status for d in out}
    assert status == {
        "1": "judged",
        "2": "judged",
        "3": "no_data",
        "4": "no_data",
        "9": "not_running",
    }
    assert "no live data from n5" in of(out, "3").reason
    partial = decide(
        [pw("5", "n1", HEALTHY)], {"5": sj("5", {"n1": 1, "n2": 1})}, [], PolicyConfig(), NOW
    )
    assert of(partial, "5").status == "partial"


def test_this_nodes_live_files_give_windows_from_the_samplers_own_signals() -> None:
    never = LiveGpu(
        "GPU-c",
        True,
        0.0,
        0.0,
        0.0,
        300.0,
        0.0,
        4 * HOUR,
        NOW - 4 * HOUR,
        None,
        None,
        None,
        None,
        None,
        None,
        gpu_index=0,
    )
    working = dataclasses.replace(
        never,
        uuid="GPU-d",
        gpu_index=1,
        utilization_pct=90.0,
        utilization_recent_pct=90.0,
        idle_since_s=None,
        active_first_s=NOW - HOUR,
    )
    job = LiveJob(
        "1",
        "n1",
        "alice",
        "physics",
        "gpu",
        1000,
        NOW - 4 * HOUR,
        NOW - 5,
        1.0,
        None,
        None,
        None,
        (never, working),
    )
    [p] = local_windows([job], NOW, HOUR, 120.0)
    cfg = PolicyConfig(scrape_job="")
    out = decide([p], {"1": sj("1", {"n1": 2})}, [], cfg, NOW)
    d = of(out, "1")
    assert (d.action, d.rule, d.gpus) == ("warn", "never_used", 1)


# ------------------------------------------------------------------- warnings, cancellation


def test_one_warning_per_job_and_rule_when_cancellation_is_off() -> None:
    past = [warned("1", "idle", NOW - 10 * HOUR)]
    out = decide([pw("1", "n1", IDLE)], {"1": sj("1", {"n1": 2})}, past, PolicyConfig(), NOW)
    assert acts(out) == {} and of(out, "1").reason == "already warned; cancellation is off"


def test_a_user_warned_in_an_earlier_pass_waits_for_the_interval() -> None:
    parts = [pw("1", "n1", IDLE), pw("2", "n1", NEVER)]
    jobs = {"1": sj("1", {"n1": 2}), "2": sj("2")}
    # One pass: both of alice's jobs are warned (police sends them as one mail).
    assert acts(decide(parts, jobs, [], PolicyConfig(), NOW)) == {
        ("1", "idle"): "warn",
        ("2", "never_used"): "warn",
    }
    later = decide(parts[:1], jobs, [warned("2", "never_used", NOW - 600)], PolicyConfig(), NOW)
    assert acts(later) == {}
    assert of(later, "1").reason.startswith("user warned recently")
    after = decide(
        parts[:1], jobs, [warned("2", "never_used", NOW - 2 * HOUR)], PolicyConfig(), NOW
    )
    assert acts(after) == {("1", "idle"): "warn"}


def test_cancellation_comes_after_n_warnings_and_the_grace_period() -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=2, cancel_grace_s=HOUR)
    parts, jobs = [pw("1", "n1", IDLE)], {"1": sj("1", {"n1": 2})}
    first = [warned("1", "idle", NOW - 0.5 * HOUR)]
    assert of(decide(parts, jobs, first, cfg, NOW), "1").reason.startswith("in the grace period")
    first = [warned("1", "idle", NOW - 2 * HOUR)]
    assert acts(decide(parts, jobs, first, cfg, NOW)) == {("1", "idle"): "warn"}  # 2 of 2
    both = [*first, warned("1", "idle", NOW - 1.5 * HOUR)]
    assert acts(decide(parts, jobs, both, cfg, NOW)) == {("1", "idle"): "cancel"}


def test_an_exempt_account_is_warned_but_never_cancelled() -> None:
    cfg = PolicyConfig(
        cancel=True,
        cancel_after_warnings=1,
        cancel_grace_s=0.0,
        exempt_accounts=frozenset({"physics"}),
    )
    parts, jobs = [pw("1", "n1", IDLE)], {"1": sj("1", {"n1": 2})}
    assert acts(decide(parts, jobs, [], cfg, NOW)) == {("1", "idle"): "warn"}
    out = decide(parts, jobs, [warned("1", "idle", NOW - HOUR)], cfg, NOW)
    assert acts(out) == {} and "exempt account physics" in of(out, "1").reason


def test_cancellations_per_pass_are_capped_worst_first() -> None:
    cfg = PolicyConfig(
        cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0, max_cancels_per_pass=1
    )
    parts = [pw("1", "n1", IDLE), pw("2", "n2", NEVER, user="bob")]
    jobs = {"1": sj("1", {"n1": 2}), "2": sj("2", {"n2": 1}, user="bob")}
    past = [warned("1", "idle", NOW - HOUR), warned("2", "never_used", NOW - HOUR, user="bob")]
    out = decide(parts, jobs, past, cfg, NOW)
    assert acts(out) == {("2", "never_used"): "cancel"}
    assert of(out, "1").reason == "cancellation cap of this pass reached"


def test_dry_run_records_do_not_count_as_real_warnings() -> None:
    past = [warned("1", "idle", NOW - HOUR, action="would_warn")]
    out = decide([pw("1", "n1", IDLE)], {"1": sj("1", {"n1": 2})}, past, PolicyConfig(), NOW)
    assert acts(out) == {("1", "idle"): "warn"}


# --------------------------------------------------------------------------- the pass


def scontrol_for(jobs: Mapping[str, Mapping[str, int]]) -> bytes:
    out = []
    for job_id, per_node in jobs.items():
        out.append(f"JobId={job_id} JobName=j\n   NodeList=x")
        for node, n in per_node.items():
            idx = f"0-{n - 1}" if n > 1 else "0"
            out.append(f"     Nodes={node} CPU_IDs=0 Mem=0 GRES=gpu:{n}(IDX:{idx})")
        out.append("")
    return "\n".join(out).encode()


class Runner:
    """The command-runner seam: fixed squeue and scontrol answers; records every command.
    ``ended``: jobs that end before an action (scontrol update and scancel fail)."""

    def __init__(
        self,
        jobs: Mapping[str, tuple[str, Mapping[str, int]]],
        rc: int = 0,
        ended: frozenset[str] = frozenset(),
    ) -> None:
        self.squeue = "".join(
            f"{j}|{user}|physics|gpu|normal|{NOW - 4 * HOUR:.0f}|{','.join(nodes)}\n"
            for j, (user, nodes) in jobs.items()
        ).encode()
        self.scontrol = scontrol_for({j: nodes for j, (_u, nodes) in jobs.items()})
        self.rc, self.ended = rc, ended
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0].endswith("squeue") and "-j" in argv:
            job = argv[argv.index("-j") + 1]
            if job in self.ended:
                return CommandResult(1, b"", "slurm_load_jobs error: Invalid job id specified")
            return CommandResult(0, f"{job}\n".encode(), "")
        if argv[0].endswith("squeue"):
            return CommandResult(self.rc, self.squeue, "slurmctld down" if self.rc else "")
        if argv[0].endswith("scontrol") and argv[1] == "-d":
            return CommandResult(0, self.scontrol, "")
        acting = argv[1:2] == ["update"] or argv[0].endswith("scancel")
        if acting and self.ended and any(a.endswith(tuple(self.ended)) for a in argv[1:3]):
            return CommandResult(1, b"", "Job has already finished")
        return CommandResult(0, b"", "")


OPTS = PoliceOptions("/usr/bin", 10.0, "example.org", "slurm-gpu@example.org", ("ops@example.org",))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path}/store.db")


def test_a_pass_mails_one_warning_records_it_and_does_not_repeat(
    store: Store, tmp_path: Path
) -> None:
    parts = [pw("1", "n1", IDLE), pw("2", "n1", HEALTHY, user="bob")]
    runner = Runner({"1": ("alice", {"n1": 2}), "2": ("bob", {"n1": 1})})
    mailer = DirMailer(str(tmp_path / "mail"))
    result = run_pass(lambda: parts, runner, store.engine, mailer, PolicyConfig(), OPTS, NOW)
    assert [(a.job_id, a.action, a.rule) for a in result.done] == [("1", "warned", "idle")]
    (warning, to), (digest, admins) = mailer.sent
    assert to == ("alice@example.org",) and admins == ("ops@example.org",)
    body = warning.get_content()
    assert "scancel 1" in body and "gpueff 1" in body and "GPU-a" in body
    assert "1 warned, 0 cancelled" in digest["Subject"]
    again = run_pass(lambda: parts, runner, store.engine, mailer, PolicyConfig(), OPTS, NOW + 600)
    assert again.done == () and len(mailer.sent) == 2
    assert [a.action for a in actions_for(store.engine, ["1"], [], 0.0)] == ["warned"]


def test_mails_carry_date_and_message_id_and_the_digest_a_to(store: Store, tmp_path: Path) -> None:
    mailer = DirMailer(str(tmp_path / "mail"))
    runner = Runner({"1": ("alice", {"n1": 2})})
    run_pass(lambda: [pw("1", "n1", IDLE)], runner, store.engine, mailer, PolicyConfig(), OPTS, NOW)
    (warning, _), (digest, _) = mailer.sent
    for msg in (warning, digest):
        assert msg["Date"] and msg["Message-ID"].endswith("@example.org>")
    assert digest["To"] == "ops@example.org"
    assert warning["Message-ID"] != digest["Message-ID"]


def test_fifty_idle_array_tasks_are_one_mail_per_user_and_pass(
    store: Store, tmp_path: Path
) -> None:
    """Issue 25 item 6: with police_user_interval_s = 0, a 50-task array got 50 mails."""
    ids = [str(1000 + i) for i in range(50)]
    parts = [pw(j, "n1", [gw(f"GPU-{j}", used=False)]) for j in ids]
    runner = Runner({j: ("alice", {"n1": 1}) for j in ids})
    mailer = DirMailer(str(tmp_path / "mail"))
    cfg = PolicyConfig(user_interval_s=0.0)
    result = run_pass(lambda: parts, runner, store.engine, mailer, cfg, OPTS, NOW)
    user_mails = [m for m, to in mailer.sent if to == ("alice@example.org",)]
    assert len(user_mails) == 1
    body = user_mails[0].get_content()
    assert all(f"Job {j}:" in body for j in ids)
    assert len([a for a in result.done if a.action == "warned"]) == 50
    again = run_pass(lambda: parts, runner, store.engine, mailer, cfg, OPTS, NOW + 300)
    assert [m for m, to in mailer.sent if to == ("alice@example.org",)] == user_mails
    assert again.done == ()


def test_a_cancellation_writes_the_reason_where_sacct_shows_it_then_scancels(
    store: Store, tmp_path: Path
) -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    record_actions(store.engine, [warned("1", "idle", NOW - HOUR)])
    runner = Runner({"1": ("alice", {"n1": 2})})
    result = run_pass(
        lambda: [pw("1", "n1", IDLE)],
        runner,
        store.engine,
        DirMailer(str(tmp_path / "m")),
        cfg,
        OPTS,
        NOW,
    )
    assert [a.action for a in result.done] == ["cancelled"]
    update, cancel = runner.calls[2:]
    assert update[:3] == ["/usr/bin/scontrol", "update", "JobId=1"]
    assert update[3].startswith("AdminComment=slurm-gpu police: cancelled")
    assert cancel == ["/usr/bin/scancel", "1"]


def test_a_job_that_ended_before_its_cancellation_is_not_a_failure(
    store: Store, tmp_path: Path
) -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    record_actions(store.engine, [warned("1", "idle", NOW - HOUR)])
    runner = Runner({"1": ("alice", {"n1": 2})}, ended=frozenset({"1"}))
    result = run_pass(lambda: [pw("1", "n1", IDLE)], runner, store.engine, None, cfg, OPTS, NOW)
    assert result.failed == () and result.gone == ("1",) and result.done == ()


def test_dry_run_records_would_warn_and_sends_nothing_not_even_the_digest(
    store: Store, tmp_path: Path
) -> None:
    """Issue 25 item 4: a dry run mailed the admin digest."""
    runner = Runner({"1": ("alice", {"n1": 2})})
    result = run_pass(
        lambda: [pw("1", "n1", IDLE)],
        runner,
        store.engine,
        None,  # what police hands a dry run without --mail-dir
        PolicyConfig(dry_run=True),
        OPTS,
        NOW,
    )
    assert [a.action for a in result.done] == ["would_warn"]
    preview = DirMailer(str(tmp_path / "preview"))
    cfg = PolicyConfig(dry_run=True, cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    run_pass(lambda: [pw("1", "n1", IDLE)], runner, store.engine, preview, cfg, OPTS, NOW + 1)
    [(digest, _)] = preview.sent  # would_cancel: no user mail; the digest says would
    assert "would warn 0, would cancel 1" in digest["Subject"]
    assert "cancelled" not in digest["Subject"].replace("would cancel", "")


def test_a_dry_runs_preview_mail_says_would(store: Store, tmp_path: Path) -> None:
    preview = DirMailer(str(tmp_path / "preview"))
    runner = Runner({"1": ("alice", {"n1": 2})})
    opts = dataclasses.replace(OPTS, admin_emails=())
    run_pass(
        lambda: [pw("1", "n1", IDLE)],
        runner,
        store.engine,
        preview,
        PolicyConfig(dry_run=True, cancel=True),
        opts,
        NOW,
    )
    [(msg, _)] = preview.sent
    assert msg["Subject"].startswith("[dry run, not sent] Would warn")
    body = msg.get_content()
    assert "DRY RUN" in body and "would be cancelled" in body


def test_squeue_failing_ends_the_pass_before_any_action(store: Store, tmp_path: Path) -> None:
    mailer = DirMailer(str(tmp_path / "mail"))
    with pytest.raises(AccountingError):
        run_pass(
            lambda: [pw("1", "n1", IDLE)],
            Runner({"1": ("alice", {"n1": 2})}, rc=1),
            store.engine,
            mailer,
            PolicyConfig(),
            OPTS,
            NOW,
        )
    assert mailer.sent == [] and actions_for(store.engine, ["1"], ["alice"], 0.0) == []


def test_running_gpu_jobs_leaves_out_cpu_jobs_and_keeps_indices() -> None:
    runner = Runner({"1": ("alice", {"n1": 2}), "2": ("bob", {"n1": 1})})
    runner.scontrol = SCONTROL
    jobs = running_gpu_jobs(runner, "", 5.0)
    assert set(jobs) == {"1"}  # job 2 holds no GPU in scontrol's detail
    assert jobs["1"].gpu_idx == {"n1": (0, 1), "n2": (3,)}
    assert "outside the job's node list" in jobs["1"].conflict  # squeue said n1 only


def test_police_with_an_unusable_config_file_exits_3(tmp_path: Path) -> None:
    """Issue 25 item 8: ``police --config`` exited 2 with a usage message."""
    for path in (tmp_path / "missing.toml", tmp_path / "bad.toml"):
        if path.name == "bad.toml":
            path.write_text("not toml at all\n")
        result = CliRunner().invoke(cli, ["police", "--config", str(path)])
        assert result.exit_code == 3, result.output


def test_police_exits_7_and_acts_on_nothing_when_prometheus_is_unreachable(
    store: Store, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/store.db"\n'
        f'[live]\nprometheus_url = "http://127.0.0.1:{port}"\nprometheus_timeout_s = 2\n'
    )
    result = CliRunner().invoke(
        cli, ["--config", str(cfg), "police", "--mail-dir", str(tmp_path / "mail")]
    )
    assert result.exit_code == 7, result.output
    assert not (tmp_path / "mail").exists()


def test_police_exits_6_when_the_store_is_not_migrated(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(cfg), "police"])
    assert result.exit_code == 6 and "store migrate" in result.output


def test_a_version_6_store_migrates_to_the_live_actions_table(store: Store) -> None:
    with migrations.write_transaction(store.engine) as conn:
        schema.live_actions.drop(conn)
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version > 6))
    applied = migrations.migrate(store.engine)
    assert applied[0].version == 7  # then the later ones
    assert actions_for(store.engine, ["1"], [], 0.0) == []


class FakePrometheus:
    """The client seam: answers by query text, records the queries."""

    def __init__(self, answers: Mapping[str, list[Sample]]) -> None:
        self.answers, self.asked = answers, []  # type: ignore[var-annotated]

    def query(self, promql: str, at_s: float | None = None) -> list[Sample]:
        self.asked.append(promql)
        for key, samples in self.answers.items():
            if promql.startswith(key):
                return samples
        return []


def test_the_second_signal_is_read_only_for_jobs_with_a_gpu_under_the_threshold() -> None:
    idle, busy_gpu = _labels("", "GPU-a", job_id="1"), _labels("", "GPU-b", job_id="2", host="n2")
    util = "max by (job_id, host, job, instance, gpu_uuid) (max_over_time("
    client = FakePrometheus({util: [Sample(idle, 0.0), Sample(busy_gpu, 0.9)]})
    read_windows(client, HOUR, 120.0, NOW)  # type: ignore[arg-type]
    details = [q for q in client.asked if "job_id=~" in q]
    assert details and all('job_id=~"1"' in q for q in details), details


def test_every_decision_is_logged_with_its_status_and_skew(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    parts = [pw("1", "n1", IDLE, skew_s=300.0), pw("2", "n1", HEALTHY, targets=("n9",))]
    runner = Runner({"1": ("alice", {"n1": 2}), "2": ("bob", {"n1": 1}), "3": ("c", {"n4": 1})})
    with caplog.at_level("INFO", logger="slurm_gpu.live.police"):
        run_pass(lambda: parts, runner, store.engine, None, PolicyConfig(dry_run=True), OPTS, NOW)
    text = caplog.text
    assert "job 1: warn (idle: first warning for this rule), node clock skew +300 s" in text
    assert "job 2: not acted on [mismatch]: series naming host n1 came from target(s) n9" in text
    assert "job 3: not acted on [no_data]: no live data from n4" in text


def test_a_target_that_stopped_serving_a_job_is_no_data_not_a_second_source() -> None:
    """The exporter killed or hung: its series' window answers linger for the window's length;
    with no current last-sample series they stand for nothing."""
    old_gpu = _labels("", "GPU-c")
    lingering = {"util_max": [Sample(old_gpu, 0.0)], "changes": [Sample(_labels(""), 3.0)]}
    assert assemble(lingering, NOW, HOUR, "instance") == []
    out = decide([], {"1": sj("1")}, [], PolicyConfig(), NOW)
    assert of(out, "1").status == "no_data"
    # A new target serves the job now (the node's exporter replaced): the old one's lingering
    # answers are not a second source.
    new = {**_labels(""), "instance": "n1.example.org:9818"}
    now_served = {
        **lingering,
        "scraped": [Sample(new, NOW - 2)],
        "util_max": [Sample(old_gpu, 0.0), Sample({**new, "gpu_uuid": "GPU-c"}, 0.5)],
    }
    [p] = assemble(now_served, NOW, HOUR, "instance")
    assert p.sources == 1 and p.gpus[0].util_max_pct == 50.0


def test_a_target_label_with_a_trailing_newline_is_refused() -> None:
    """``re.match`` with ``$`` let ``"instance\\n"`` through into the PromQL ``by`` clause."""
    from slurm_gpu.prometheus.windows import _groups

    assert _groups("node")[0].endswith("node")
    for bad in ("instance\n", "in stance", "1host", ""):
        with pytest.raises(ValueError):
            _groups(bad)
