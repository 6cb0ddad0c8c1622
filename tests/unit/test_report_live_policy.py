"""The weekly report's "Live policy" section, tied to the stored actions: jobs warned and
cancelled per rule, and the GPU-hours stopped from being wasted, the number ``gpueff`` shows
for each job, summed (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import make_job, make_node

from slurm_gpu.jobreport.adapter import live_action_views
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.liveactions import LiveAction, record_actions
from slurm_gpu.weekly.aggregate import build_report
from slurm_gpu.weekly.model import Period
from slurm_gpu.weekly.render import render_html, render_text

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url

START = 1_700_000_000.0
PERIOD = Period(since_s=START, until_s=START + 7 * 86400)


def _job(job_id: str, *, gpus: int, elapsed_s: int, limit_s: int | None, end: bool) -> JobRecord:
    j = make_job(job_id, gpus=gpus, state="CANCELLED", end_s=START + 60 + elapsed_s)
    j = dataclasses.replace(j, start_s=START + 60, elapsed_s=elapsed_s, time_limit_s=limit_s)
    if not end:  # ended after the period: its actions belong to the next report
        j = dataclasses.replace(j, end_s=PERIOD.until_s + 10, start_s=PERIOD.until_s - 100)
    return j


def _act(j: JobRecord, action: str, rule: str, after_s: float, gpus: int) -> LiveAction:
    assert j.start_s is not None
    return LiveAction(
        j.job_id, rule, action, j.user, j.account or "", j.start_s + after_s, gpus, 1.0, ""
    )


def test_the_weekly_numbers_are_the_stored_actions_summed_as_gpueff_shows_them(
    store_url: str,
) -> None:
    cancelled = _job("11", gpus=4, elapsed_s=7200, limit_s=86400, end=True)
    twice = _job("12", gpus=2, elapsed_s=3600, limit_s=4 * 3600, end=True)
    warned = _job("13", gpus=1, elapsed_s=3600, limit_s=7200, end=True)
    no_limit = _job("14", gpus=1, elapsed_s=3600, limit_s=None, end=True)
    dry = _job("15", gpus=2, elapsed_s=3600, limit_s=7200, end=True)
    later = _job("16", gpus=8, elapsed_s=100, limit_s=86400, end=False)
    actions = {
        cancelled.job_id: [
            _act(cancelled, "warned", "idle", 1800, 3),
            _act(cancelled, "cancelled", "idle", 7200, 3),
        ],
        # Asked to stop twice (it had not ended by the next pass): credited once.
        twice.job_id: [
            _act(twice, "warned", "never_used", 900, 1),
            _act(twice, "cancelled", "never_used", 3000, 1),
            _act(twice, "cancelled", "never_used", 3300, 1),
        ],
        warned.job_id: [_act(warned, "warned", "never_used", 600, 1)],
        no_limit.job_id: [_act(no_limit, "cancelled", "idle", 3000, 1)],
        dry.job_id: [
            _act(dry, "would_warn", "idle", 600, 2),
            _act(dry, "would_cancel", "idle", 3000, 2),
        ],
        later.job_id: [_act(later, "cancelled", "idle", 50, 8)],
    }
    jobs = [cancelled, twice, warned, no_limit, dry, later]
    with Store.open(store_url) as store:
        record_actions(store.engine, [a for acts in actions.values() for a in acts])
        store.write_batch(
            [JobBundle(j, (make_node(j.job_id, "node1"),), TELEMETRY_COMPLETE) for j in jobs],
            collected_at_s=1.0,
        )
        rep = build_report(store.engine, PERIOD, now_s=PERIOD.until_s)
        stored = {s.job.job_id: s for s in store.jobs_between(PERIOD.since_s, PERIOD.until_s)}
    lp = rep.live_policy
    # What gpueff shows for each job of the period, from the same stored actions.
    views = {i: live_action_views(s.job, s.live_actions) for i, s in stored.items()}
    shown = [v for vs in views.values() for v in vs]
    assert lp.gpu_hours_stopped == pytest.approx(sum(v.stopped_gpu_hours or 0.0 for v in shown))
    assert lp.jobs_warned == len(
        {i for i, vs in views.items() if any(v.action == "warned" for v in vs)}
    )
    assert lp.jobs_cancelled == len(
        {i for i, vs in views.items() if any(v.action == "cancelled" for v in vs)}
    )
    # And spelled out from the definition: idle GPUs × the time left until the limit.
    assert cancelled.time_limit_s is not None and twice.time_limit_s is not None
    expected = {
        "idle": 3 * (cancelled.time_limit_s - 7200) / 3600,
        "never_used": 1 * (twice.time_limit_s - 3000) / 3600,
    }
    assert {r.rule: r.gpu_hours_stopped for r in lp.rules} == pytest.approx(expected)
    assert lp.gpu_hours_stopped == pytest.approx(sum(expected.values()))
    by_rule = {r.rule: r for r in lp.rules}
    assert (by_rule["idle"].jobs_warned, by_rule["idle"].jobs_cancelled) == (1, 2)
    assert (by_rule["never_used"].jobs_warned, by_rule["never_used"].jobs_cancelled) == (2, 1)
    assert (by_rule["idle"].jobs_would_warn, by_rule["idle"].jobs_would_cancel) == (1, 1)
    assert lp.cancelled_without_limit == 1
    assert not any(v.action.startswith("would") for v in shown)

    html = render_html(rep)
    assert 'id="live-policy"' in html
    assert "GPU-hours stopped from being wasted by the live policy" in html
    text = render_text(rep)
    assert f"{lp.jobs_warned} jobs warned, {lp.jobs_cancelled} cancelled" in text


def test_a_week_without_actions_shows_zero(store_url: str) -> None:
    with Store.open(store_url) as store:
        rep = build_report(store.engine, PERIOD, now_s=PERIOD.until_s)
    assert rep.live_policy.rules == () and rep.live_policy.gpu_hours_stopped == 0.0
    assert "0 jobs warned, 0 cancelled" in render_text(rep)
