"""The live policy's recorded actions shown after the job: read back with the job from the
store (both back ends), worded in ``gpueff`` (text and JSON) and in the mail after the job,
rendered into the cached report at collection, and that cache invalidated by a late action."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import gpueff_factory as F
import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from test_gpueff_owner import NeverAsked, _gpueff, _settings, _store

from slurm_gpu.config import load_settings
from slurm_gpu.jobreport import fmt, jsonout
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.readers import StoreAndSpoolReader, telemetry_from_dict
from slurm_gpu.jobreport.reportcache import read_cached, render_key
from slurm_gpu.jobreport.service import report_for
from slurm_gpu.notify.message import MailContext, MessageBuilder
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.actionrows import stopped_gpu_hours
from slurm_gpu.store.liveactions import LiveAction, record_actions
from slurm_gpu.store.sqlite_reader import SqliteReader, sqlite_path

SGTEST1 = 1001

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url


def _action(job: JobRecord, action: str, *, after_s: float, gpus: int, rule: str) -> LiveAction:
    assert job.start_s is not None
    return LiveAction(
        job_id=job.job_id,
        rule=rule,
        action=action,
        user=job.user,
        account=job.account or "",
        at_s=job.start_s + after_s,
        gpus=gpus,
        idle_gpu_s=gpus * after_s,
        detail="test",
    )


def _record(state_dir: Path, actions: list[LiveAction]) -> None:
    with Store.open(_settings(state_dir).store_url) as store:
        record_actions(store.engine, actions)


def _report(state_dir: Path, job: JobRecord) -> Any:
    reader = StoreAndSpoolReader(_settings(state_dir))
    try:
        return report_for(job, reader, min_elapsed_s=30)
    finally:
        reader.close()


# ------------------------------------------------------------------ the store reads them


def test_a_stored_jobs_actions_read_back_with_it_on_both_back_ends(
    store_url: str,
) -> None:
    job, other = F.job(), F.job(job_id="1002", job_id_display="1002")
    with Store.open(store_url) as store:
        # Recorded while the jobs ran, before they were collected (as the policy does).
        warned = _action(job, "warned", after_s=1800, gpus=1, rule="never_used")
        cancelled = _action(job, "cancelled", after_s=3000, gpus=1, rule="never_used")
        elsewhere = _action(other, "would_warn", after_s=600, gpus=2, rule="idle")
        record_actions(store.engine, [cancelled, warned, elsewhere])
        store.write_batch(
            [
                JobBundle(j, (dataclasses.replace(F.node_record(), job_id=j.job_id),), "complete")
                for j in (job, other)
            ],
            collected_at_s=1.0,
        )
        got = store.get_job(job.job_id)
        assert got is not None
        assert got.live_actions == (warned, cancelled)
        both = store.jobs_between(0, 2e9)
        assert {s.job.job_id: s.live_actions for s in both} == {
            job.job_id: (warned, cancelled),
            other.job_id: (elsewhere,),
        }
    path = sqlite_path(store_url)
    if path is not None:  # gpueff's standard-library reader sees the same
        with SqliteReader.open(path) as reader:
            (sq,) = reader.jobs_for_ids([job.job_id])
            assert sq.live_actions == (warned, cancelled)


def test_the_sqlite_reader_reads_a_batchs_actions_in_one_query(tmp_path: Path) -> None:
    jobs = [F.job(job_id=str(1000 + i), job_id_display=str(1000 + i)) for i in range(1, 41)]
    _store(tmp_path, *jobs)
    _record(tmp_path, [_action(j, "warned", after_s=900, gpus=1, rule="never_used") for j in jobs])
    path = sqlite_path(_settings(tmp_path).store_url)
    assert path is not None
    seen: list[str] = []
    with SqliteReader.open(path) as reader:
        reader._conn.set_trace_callback(seen.append)
        stored = reader.jobs_for_ids([j.job_id for j in jobs])
    assert all(len(s.live_actions) == 1 for s in stored) and len(stored) == len(jobs)
    assert sum("live_actions" in q for q in seen) == 1


# ------------------------------------------------------------------ what gpueff shows


def test_gpueff_words_one_warning_on_one_gpu_in_the_singular(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = F.job()
    _store(tmp_path, job)
    _record(tmp_path, [_action(job, "warned", after_s=1800, gpus=1, rule="never_used")])
    out = _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, job.job_id).output
    assert "Live policy" in out
    line = f"warned after {fmt.duration(1800)}: 1 GPU never used, {fmt.hours(0.5)} idle GPU-hours"
    assert line in out
    assert "1 GPUs" not in out and "stopped from being wasted" not in out


def test_gpueff_words_a_cancellation_with_the_gpu_hours_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = F.job(state="CANCELLED")
    _store(tmp_path, job)
    after = 3600.0
    _record(tmp_path, [_action(job, "cancelled", after_s=after, gpus=2, rule="idle")])
    out = _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, job.job_id).output
    assert job.time_limit_s is not None
    stopped = 2 * (job.time_limit_s - after) / 3600
    assert f"cancelled after {fmt.duration(after)}: 2 GPUs idle, {fmt.hours(2.0)} idle" in out
    assert f"at most {fmt.hours(stopped)} GPU-hours stopped from being wasted" in out


def test_dry_run_actions_are_not_shown_to_the_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = F.job()
    _store(tmp_path, job)
    _record(
        tmp_path,
        [
            _action(job, "would_warn", after_s=600, gpus=1, rule="idle"),
            _action(job, "would_cancel", after_s=1200, gpus=1, rule="idle"),
        ],
    )
    out = _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, job.job_id).output
    assert "Live policy" not in out and "would" not in out
    assert _report(tmp_path, job).live_actions == ()


def test_a_job_without_actions_shows_no_live_policy_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = F.job()
    _store(tmp_path, job)
    out = _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, job.job_id).output
    assert "Live policy" not in out
    doc = json.loads(
        _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, "--json", job.job_id).output
    )
    assert doc["jobs"][0]["live_actions"] == []


def test_gpueff_json_lists_the_actions_under_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = F.job(state="CANCELLED")
    _store(tmp_path, job)
    warned = _action(job, "warned", after_s=1800, gpus=1, rule="never_used")
    cancelled = _action(job, "cancelled", after_s=2700, gpus=1, rule="never_used")
    _record(tmp_path, [warned, cancelled])
    doc = json.loads(
        _gpueff(tmp_path, monkeypatch, NeverAsked(), SGTEST1, "--json", job.job_id).output
    )
    jsonschema.validate(doc, jsonout.SCHEMA)
    assert job.start_s is not None and job.time_limit_s is not None
    assert doc["jobs"][0]["live_actions"] == [
        {
            "at_s": a.at_s,
            "after_start_s": a.at_s - job.start_s,
            "rule": a.rule,
            "action": a.action,
            "gpus": a.gpus,
            "idle_gpu_hours": pytest.approx(a.idle_gpu_s / 3600),
            "stopped_gpu_hours": pytest.approx(
                stopped_gpu_hours(a.action, a.gpus, a.at_s, job.start_s, job.time_limit_s)
            ),
        }
        for a in (warned, cancelled)
    ]
    assert doc["jobs"][0]["live_actions"][0]["stopped_gpu_hours"] == 0.0


def test_a_cancellation_without_a_time_limit_credits_no_gpu_hours(tmp_path: Path) -> None:
    job = F.job(state="CANCELLED", time_limit_s=None)
    _store(tmp_path, job)
    _record(tmp_path, [_action(job, "cancelled", after_s=600, gpus=1, rule="idle")])
    (view,) = _report(tmp_path, job).live_actions
    assert view.stopped_gpu_hours is None
    assert "not known (no time limit)" in fmt.live_action(view)


def test_a_cancellation_after_the_time_limit_credits_nothing() -> None:
    assert stopped_gpu_hours("cancelled", 4, 1000.0 + 7200, 1000.0, 3600) == 0.0
    assert stopped_gpu_hours("warned", 4, 1000.0, 1000.0, 3600) == 0.0


# ------------------------------------------------------------------ the mail after the job


def test_the_mail_after_the_job_lists_the_actions(tmp_path: Path) -> None:
    job = F.job(state="CANCELLED")
    _store(tmp_path, job)
    _record(
        tmp_path,
        [
            _action(job, "warned", after_s=1800, gpus=1, rule="never_used"),
            _action(job, "cancelled", after_s=2700, gpus=1, rule="never_used"),
        ],
    )
    report = _report(tmp_path, job)
    msg = MessageBuilder(
        from_address="slurm@example.org", context=MailContext(site_name="test")
    ).build([report], to="sgtest1@example.org", now_s=1.0)
    text = msg.get_body(("plain",))
    html = msg.get_body(("html",))
    assert text is not None and html is not None
    plain, markup = text.get_content(), html.get_content()
    for view in report.live_actions:
        line = fmt.live_action(view)
        assert f"* {line}" in plain
        assert f"<li>{line}</li>" in markup
    assert "The live policy, while the job ran" in plain
    assert "1 GPU never used" in plain


# ------------------------------------------------------------------ rendered at collection


def _config(state_dir: Path) -> Path:
    cfg = state_dir / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{state_dir}"\n[gpueff]\nmin_elapsed_s = 30\n')
    return cfg


def test_the_report_rendered_at_collection_holds_the_actions_and_a_late_one_invalidates_it(
    tmp_path: Path,
) -> None:
    job = F.job()
    early = _action(job, "warned", after_s=1800, gpus=1, rule="never_used")
    settings = load_settings(str(_config(tmp_path)))
    with Store.open(settings.store_url) as store:
        record_actions(store.engine, [early])
    _store(tmp_path, job)
    with Store.open(settings.store_url) as store:
        assert ReportPrerenderer(settings, store).refresh() == (1, 1)
    path = sqlite_path(settings.store_url)
    assert path is not None
    key = render_key(settings.gpueff)
    (cached,) = read_cached(path, [job.job_id_display], SGTEST1, key, colour=False) or [""]
    assert fmt.live_action(_report(tmp_path, job).live_actions[0]) in cached
    # An action recorded after the job was collected (it ended during the policy's pass):
    # its stored report goes, and rendering again shows both actions.
    late = _action(job, "cancelled", after_s=3500, gpus=1, rule="never_used")
    _record(tmp_path, [late])
    assert read_cached(path, [job.job_id_display], SGTEST1, key, colour=False) is None
    with Store.open(settings.store_url) as store:
        assert ReportPrerenderer(settings, store).refresh() == (1, 1)
    (again,) = read_cached(path, [job.job_id_display], SGTEST1, key, colour=False) or [""]
    views = _report(tmp_path, job).live_actions
    assert len(views) == 2
    for view in views:
        assert fmt.live_action(view) in again
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM job_reports").fetchone() == (1,)


def test_the_owners_report_file_keeps_the_actions() -> None:
    job = F.job()
    view = dataclasses.asdict(
        _report_from_actions(job, [_action(job, "warned", after_s=60, gpus=1, rule="idle")])
    )
    back = telemetry_from_dict(json.loads(json.dumps(view)))
    assert back.live_actions and back.live_actions[0].action == "warned"


def _report_from_actions(job: JobRecord, actions: list[LiveAction]) -> Any:
    from slurm_gpu.jobreport import adapter
    from slurm_gpu.store.rows import StoredJob

    stored = StoredJob(
        job=job,
        telemetry=TELEMETRY_COMPLETE,
        telemetry_source=None,
        interval_s=None,
        missing_hosts=(),
        nodes=(F.node_record(),),
        findings=(),
        analysis_version=None,
        gpu_hours=None,
        collected_at_s=1.0,
        live_actions=tuple(actions),
    )
    return adapter.telemetry_from_stored(stored)
