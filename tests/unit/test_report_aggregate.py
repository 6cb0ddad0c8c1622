"""Every number of the weekly report, checked against an independent computation.

The store is filled with known rows (a small hand-made set that exercises each rule, and a
generated week), on SQLite and on the real PostgreSQL; ``report_oracle`` recomputes each
section in plain Python from the same rows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gen_week
import store_fixtures
from report_oracle import WEEK_S, Oracle

from slurm_gpu.store.store import Store
from slurm_gpu.weekly.aggregate import ReportOptions, build_report, last_full_week
from slurm_gpu.weekly.model import Period, WeeklyReport

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url

SINCE = gen_week.DEFAULT_SINCE_S  # Monday 2026-11-16 00:00 UTC
PERIOD = Period(SINCE, SINCE + WEEK_S)
H = 3600.0


def approx(x: float | None) -> Any:
    return None if x is None else pytest.approx(x, rel=1e-9, abs=1e-9)


# --------------------------------------------------------------------------- hand-made data


def _job(
    job_id: str, user: str, end_s: float, elapsed_s: int, gpus: int, **kw: Any
) -> dict[str, Any]:
    row = {
        "job_id": job_id,
        "job_id_display": kw.pop("display", job_id),
        "user": user,
        "account": kw.pop("account", "acct-" + user),
        "partition": kw.pop("partition", "gpu"),
        "job_name": "j",
        "nodelist": "n1",
        "node_count": 1,
        "state": "COMPLETED",
        "alloc_tres": f"gres/gpu={gpus}",
        "req_tres": f"gres/gpu={gpus}",
        "alloc_gpus": gpus,
        "elapsed_s": elapsed_s,
        "start_s": end_s - elapsed_s,
        "end_s": end_s,
        "restarts": 0,
        "telemetry": "complete",
        "missing_hosts": "",
        "gpu_hours": gpus * elapsed_s / 3600.0 if gpus else None,
        "collected_at_s": end_s,
    }
    row.update(kw)
    return row


def _gpu(job_id: str, host: str, n: int, util: float | None, **kw: Any) -> dict[str, Any]:
    row = {
        "job_id": job_id,
        "host": host,
        "uuid": f"GPU-{job_id}-{n}",
        "position": n,
        "model": "NVIDIA A100-SXM4-80GB",
        "samples": 100,
        "samples_available": 100,
        "util_mean_pct": util,
        "idle_samples": 0,
        "idle_fraction": None if util is None else max(0.0, (100 - util) / 200),
        "idle_head_s": 10.0,
        "idle_tail_s": 10.0,
        "active_first_time_s": None if util is None or util <= 1 else 1.0,
        "active_last_time_s": None if util is None or util <= 1 else 2.0,
        "energy_j": None if util is None else 1000.0 * (1 + util),
        "throttle_power_s": 0.0,
        "throttle_thermal_s": 0.0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "xid_events": "",
        "process_seen": util is not None and util > 0,
        "max_processes": 1,
        "pids": "",
    }
    row.update(kw)
    return row


def _f(job_id: str, seq: int, cause: int | None, code: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "seq": seq,
        "code": code,
        "severity": "warning",
        "cause": cause,
        "evidence": "{}",
        "analysis_version": "t",
    }


def hand_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    t = SINCE
    jobs = [
        # alice: a 2-GPU job, one GPU busy, one never used (no process, 0 %).
        _job("101", "alice", t + 1 * H, 4 * 3600, 2, partition="gpu"),
        # alice: a healthy job with a long idle head on its only GPU.
        _job("102", "alice", t + 30 * H, 10 * 3600, 1, partition="gpu-long"),
        # bob: low duty, findings whose first one names no cause.
        _job("103", "bob", t + 50 * H, 8 * 3600, 4, account=None, partition="gpu"),
        # bob: no telemetry at all.
        _job("104", "bob", t + 60 * H, 2 * 3600, 2, telemetry="missing"),
        # an HTML-looking user name (must be escaped on the page).
        _job("105", "<script>alert(1)</script>", t + 70 * H, 3600, 1, partition="debug"),
        # carol: a process was seen but the GPU stayed at 0.5 %: unused by the analysis's rule.
        _job("106", "carol", t + 80 * H, 6 * 3600, 1, partition="gpu"),
        # carol: ends exactly at the period's start (in), and one exactly at its end (out).
        _job("107", "carol", t, 3600, 1),
        # exactly at the unused threshold (1 %): unused.
        _job("110", "carol", t + 90 * H, 2 * 3600, 1),
        _job("108", "carol", t + WEEK_S, 3600, 8),
        # a CPU-only job: not counted.
        _job("109", "dave", t + 5 * H, 3600, 0, gpu_hours=None),
        # previous week and earlier weeks, for the comparison and the trend.
        _job("201", "alice", t - 2 * H, 5 * 3600, 2),
        _job("202", "bob", t - 3 * 86400, 3600, 1),
        _job("301", "alice", t - WEEK_S - H, 7200, 4),
        _job("401", "erin", t - 5 * WEEK_S + H, 7200, 1),
        # still running (no end): not counted.
        {**_job("501", "erin", t + H, 600, 1), "end_s": None},
    ]
    gpus = [
        _gpu("101", "n1", 0, 80.0, throttle_power_s=120.0),
        _gpu("101", "n1", 1, 0.0, process_seen=False, idle_head_s=4 * 3600.0, idle_tail_s=0.0),
        _gpu("102", "n2", 0, 95.0, idle_head_s=1800.0, idle_tail_s=60.0, xid_events="79"),
        _gpu("103", "n2", 0, 20.0, ecc_corrected=3, xid_events="48,63", idle_head_s=620.0),
        _gpu("103", "n2", 1, 25.0, idle_head_s=700.0, idle_tail_s=900.0),
        _gpu("103", "n2", 2, 30.0, idle_head_s=650.0, idle_tail_s=5.0),
        _gpu("103", "n2", 3, 35.0, idle_head_s=900.0, idle_tail_s=0.0, model="Tesla V100"),
        # bob's job on a second node: an unused GPU there, throttled (one job, two nodes).
        _gpu("103", "n3", 0, 0.0, process_seen=True, throttle_power_s=15.0, model="Tesla V100"),
        _gpu("105", "n3", 0, 55.5, model=None, ecc_uncorrected=1),
        _gpu("106", "n3", 0, 0.5, process_seen=True, throttle_thermal_s=30.0),
        _gpu("107", "n1", 0, 60.0),
        _gpu("110", "n3", 0, 1.0, process_seen=True),
        _gpu("108", "n1", 0, 10.0),
        _gpu("201", "n1", 0, 40.0),
        _gpu("201", "n1", 1, 42.0),
        _gpu("202", "n1", 0, 90.0),
        _gpu("301", "n4", 0, 15.0),
        _gpu("401", "n4", 0, 5.0),
        # a GPU that could not be read, with no process seen: never used.
        _gpu("104", "n5", 0, None, process_seen=False, active_first_time_s=None),
    ]
    findings = [
        _f("101", 0, 6, "GPU_UNUSED"),
        _f("101", 1, 1, "SMALL_BATCH"),
        _f("103", 0, None, "JOB_TOO_SHORT_INFO"),
        _f("103", 1, 2, "DATA_LOADER_BOUND"),
        _f("103", 2, 5, "COMM_BOUND"),
        _f("106", 0, 4, "MEMORY_UNDERUSED"),
        _f("201", 0, 3, "NO_MIXED_PRECISION"),
    ]
    return jobs, gpus, findings


# --------------------------------------------------------------------------- comparison


def check_report(rep: WeeklyReport, oracle: Oracle, period: Period, opts: ReportOptions) -> None:
    s, u = period.since_s, period.until_s
    prev = (s - (u - s), s)
    for got, (ps, pu) in ((rep.headline, (s, u)), (rep.previous_headline, prev)):
        want = oracle.headline(ps, pu)
        for key, value in want.items():
            assert getattr(got, key) == (approx(value) if isinstance(value, float) else value), key

    assert [(b.jobs, b.gpu_hours_allocated) for b in rep.histogram] == [
        (n, approx(h)) for n, h in oracle.histogram(s, u)
    ]
    assert [b.lo_pct for b in rep.histogram] == [10.0 * i for i in range(10)]

    for got_groups, key, limit in (
        (rep.by_partition, "partition", None),
        (rep.top_users, "user", opts.top_n),
        (rep.top_accounts, "account", opts.top_n),
    ):
        want = oracle.groups(s, u, key)
        if key == "partition":
            order = sorted(want, key=lambda k: (-want[k]["alloc"], k))
        else:
            order = oracle.top(s, u, key, limit or 10**9)
        assert [g.key for g in got_groups] == order, key
        for g in got_groups:
            w = want[g.key]
            assert g.jobs == w["jobs"]
            assert g.gpu_hours_allocated == approx(w["alloc"])
            assert g.gpu_hours_active == approx(w["active"])
            assert g.gpu_hours_wasted == approx(w["wasted"])
            assert g.duty_cycle_weighted_pct == approx(w["duty"])
            assert g.main_cause == w["main_cause"], (key, g.key)
            assert g.main_cause_gpu_hours == approx(w["main_cause_gh"])

    want_models = oracle.by_model(s, u)
    assert [m.key for m in rep.by_gpu_model] == sorted(
        want_models, key=lambda k: (-want_models[k]["alloc"], k)
    )
    for m in rep.by_gpu_model:
        w = want_models[m.key]
        assert (m.jobs, m.gpu_hours_allocated, m.gpu_hours_active, m.gpu_hours_wasted) == (
            w["jobs"],
            approx(w["alloc"]),
            approx(w["active"]),
            approx(w["wasted"]),
        )
        assert m.duty_cycle_weighted_pct == approx(w["duty"])
        # Seen in a weekly report: every model's main cause was null (0.0 GPU-hours) while
        # its partition, with the same jobs, named cause 6.
        assert m.main_cause == w["main_cause"], m.key
        assert m.main_cause_gpu_hours == approx(w["main_cause_gh"])

    want_causes = oracle.causes(s, u)
    assert [(c.cause or 0, c.jobs, c.gpu_hours_wasted) for c in rep.causes] == [
        (c, want_causes[c][0], approx(want_causes[c][1])) for c in (1, 2, 3, 4, 5, 6, 7, 0)
    ]
    assert sum(c.gpu_hours_wasted for c in rep.causes) == pytest.approx(
        rep.headline.gpu_hours_wasted
    )

    n_gpus, n_jobs, gh, listed = oracle.never_used(s, u)
    nu = rep.never_used
    assert (nu.gpus, nu.jobs, nu.gpu_hours) == (n_gpus, n_jobs, approx(gh))
    assert [(g.job_id, g.hostname, g.gpu_uuid) for g in nu.worst] == listed[: opts.table_rows]

    edges = oracle.idle_edges(s, u)
    assert rep.idle_edges.jobs == len(edges)
    assert rep.idle_edges.gpu_hours_idle == approx(sum(e[2] for e in edges.values()))
    assert [j.job_id for j in rep.idle_edges.worst] == sorted(
        edges, key=lambda k: (-edges[k][2], k)
    )[: opts.table_rows]
    for j in rep.idle_edges.worst:
        assert (j.idle_head_s, j.idle_tail_s, j.gpu_hours_idle) == tuple(
            approx(x) for x in edges[j.job_id]
        )

    hw = oracle.hardware(s, u)
    assert {n.hostname for n in rep.hardware} == set(hw)
    for n in rep.hardware:
        w = hw[n.hostname]
        assert (n.jobs, n.ecc_corrected, n.ecc_uncorrected, n.xid_codes) == (
            w["jobs"],
            w["ecc_c"],
            w["ecc_u"],
            w["xid"],
        )
        assert n.throttle_power_h == approx(w["power_h"])
        assert n.throttle_thermal_h == approx(w["thermal_h"])

    want_trend = oracle.trend(u, opts.trend_weeks)
    assert len(rep.trend) == opts.trend_weeks
    for got_w, w in zip(rep.trend, want_trend, strict=True):
        assert got_w.since_s == w["since"]
        assert got_w.jobs == w["jobs"]
        assert got_w.gpu_hours_allocated == approx(w["alloc"])
        assert got_w.gpu_hours_active == approx(w["active"])
        assert got_w.gpu_hours_wasted == approx(w["wasted"])
        assert got_w.duty_cycle_weighted_pct == approx(w["duty"])

    assert [w.user for w in rep.worst_jobs] == [g.key for g in rep.top_users]
    for n, w in enumerate(rep.worst_jobs):
        assert w.anchor == f"user-{n + 1}"
        assert [j.job_id for j in w.jobs] == oracle.worst(s, u, w.user, opts.worst_jobs_per_user)
        for j in w.jobs:
            assert (j.cause, j.finding_code) == oracle.cause(
                next(x for x in oracle.jobs if x["job_id"] == j.job_id)
            )


def test_hand_made_store_matches_the_oracle(store_url: str) -> None:
    jobs, gpus, findings = hand_rows()
    opts = ReportOptions(trend_weeks=6, top_n=3, worst_jobs_per_user=2, table_rows=10)
    with Store.open(store_url) as store:
        gen_week.insert_dicts(store.engine, jobs, gpus, findings)
        rep = build_report(store.engine, PERIOD, opts, now_s=SINCE + WEEK_S + 1)
    oracle = Oracle(jobs, gpus, findings)
    check_report(rep, oracle, PERIOD, opts)

    # The rules this data was written to exercise, spelled out.
    h = rep.headline
    assert h.jobs == 8  # 101–107, 110; 108 ends at `until`, 109 has no GPU, 501 is running
    assert h.jobs_measured == 7  # 104 has no readable GPU
    assert h.gpu_hours_unmeasured == pytest.approx(4.0)
    assert h.jobs_with_findings == 3  # 101, 103 (its second finding), 106
    # 101: GPU 1 unused (0 %) counts whole: 4 h; GPU 0 (80 %) 10 % idle readings: 0.4 h.
    # 106: 0.5 % with a process seen is still unused: 6 h, cause 4.
    assert {c.cause: c.gpu_hours_wasted for c in rep.causes}[4] == pytest.approx(6.0)
    assert {c.cause: c.jobs for c in rep.causes}[2] == 1  # 103's cause is its seq-1 finding
    # 101/1, 103's GPU on n3, 106/0, 110/0 and the unreadable 104/0; 103 counted once.
    assert (rep.never_used.gpus, rep.never_used.jobs) == (5, 5)
    # 103: a head of at least 600 s on all four GPUs; 101's unused GPU is not "active".
    assert [j.job_id for j in rep.idle_edges.worst] == ["103", "102"]
    assert rep.hardware[0].hostname == "n3"  # the uncorrected ECC error first
    # Jobs with trouble per node: 103 on both of its nodes, once on each.
    assert {n.hostname: n.jobs for n in rep.hardware} == {"n1": 1, "n2": 2, "n3": 3}
    assert {n.hostname: n.xid_codes for n in rep.hardware}["n2"] == (48, 63, 79)
    assert rep.previous_headline.jobs == 2
    assert [w.jobs for w in rep.trend] == [1, 0, 0, 1, 2, 8]


def test_generated_weeks_match_the_oracle(store_url: str) -> None:
    frames = [
        gen_week.frames(1500, SINCE, seed=3, id_offset=0),
        gen_week.frames(900, SINCE - WEEK_S, seed=4, id_offset=100_000),
        gen_week.frames(400, SINCE - 3 * WEEK_S, seed=5, id_offset=200_000),
    ]
    opts = ReportOptions(trend_weeks=5, table_rows=15)
    rows: tuple[list[dict[str, Any]], ...] = ([], [], [])
    with Store.open(store_url) as store:
        for f in frames:
            gen_week.insert(store.engine, *f)
            for acc, df in zip(rows, f, strict=True):
                acc += [
                    {k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                    for r in df.to_dict("records")
                ]
        rep = build_report(store.engine, PERIOD, opts)
    check_report(rep, Oracle(*rows), PERIOD, opts)
    assert rep.headline.jobs == 1500 and rep.previous_headline.jobs == 900
    assert rep.never_used.gpus > 0 and rep.idle_edges.jobs > 0 and rep.hardware


def test_empty_store_gives_an_empty_report(store_url: str) -> None:
    with Store.open(store_url) as store:
        rep = build_report(store.engine, PERIOD)
    assert rep.headline.jobs == 0
    assert rep.headline.duty_cycle_median_pct is None
    assert rep.headline.energy_kwh is None
    assert rep.top_users == () and rep.by_gpu_model == () and rep.hardware == ()
    assert all(c.gpu_hours_wasted == 0 for c in rep.causes)
    assert all(w.duty_cycle_weighted_pct is None for w in rep.trend)


def test_last_full_week_is_monday_to_monday_utc() -> None:
    # Saturday 2026-11-21 10:00 UTC -> Monday 2026-11-09 .. Monday 2026-11-16.
    p = last_full_week(1795255200.0)
    assert (p.since_s, p.until_s) == (SINCE - WEEK_S, SINCE)
    # On a Monday at 00:00 the week that just ended is the last full one.
    assert last_full_week(SINCE) == Period(SINCE - WEEK_S, SINCE)
