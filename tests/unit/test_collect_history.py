"""History for recommendations at collect time: one store query per accounting batch, the
user's jobs of the same name as ``PastJob``, and recommendations stored with their findings."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.analysis import analyze
from slurm_gpu.cli.collect_cmd import _analyse_hook, _HistoryPrefetch, storable_findings
from slurm_gpu.config import Settings
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url


def _job(job_id: str, user: str, name: str, end_s: float) -> JobRecord:
    return dataclasses.replace(make_job(job_id, user=user, end_s=end_s), job_name=name)


def _store(store: Store, jobs: Sequence[JobRecord]) -> None:
    store.write_batch(
        [
            JobBundle(
                job=j,
                nodes=(make_node(j.job_id, ended_s=j.end_s or 0.0),),
                telemetry=TELEMETRY_COMPLETE,
            )
            for j in jobs
        ],
        collected_at_s=1_700_001_000.0,
    )


def test_similar_jobs_are_the_newest_per_user_and_name(store_url: str) -> None:
    with Store.open(store_url) as store:
        _store(
            store,
            [_job(str(10 + i), "alice", "train", 1_700_000_000.0 + i) for i in range(5)]
            + [
                _job("20", "alice", "eval", 1_700_000_000.0),
                _job("21", "bob", "train", 1_700_000_000.0),
            ],
        )
        got = store.similar_jobs([("alice", "train"), ("bob", "train")], per_key=3)
    assert [s.job.job_id for s in got] == ["14", "13", "12", "21"]


def test_no_keys_no_query(store_url: str) -> None:
    with Store.open(store_url) as store:
        assert store.similar_jobs([]) == []


class _CountingStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def similar_jobs(self, keys: object) -> object:
        self.calls += 1
        return self.store.similar_jobs(keys)  # type: ignore[arg-type]


def test_one_history_query_per_batch_and_the_analysis_gets_it(store_url: str) -> None:
    past = [_job(str(10 + i), "alice", "train", 1_700_000_000.0 + i) for i in range(3)]
    new = [_job(str(30 + i), "alice", "train", 1_700_010_000.0 + i) for i in range(4)]
    with Store.open(store_url) as store:
        _store(store, past)
        counting = _CountingStore(store)
        prefetch = _HistoryPrefetch(
            FakeAccounting({j.job_id: j for j in new}), counting, Settings()
        )
        jobs = prefetch.get_jobs([j.job_id for j in new])
    assert counting.calls == 1 and len(jobs) == 4
    history = prefetch.history[("alice", "train")]
    assert sorted(p.job_id for p in history) == ["10", "11", "12"]
    assert all(p.gpus_allocated == 1 for p in history)
    # The hook analyses with that history: the same as calling analyze with it directly.
    analyse, version = _analyse_hook(Settings(), prefetch)
    assert version is not None
    job = new[0]
    nodes = (make_node(job.job_id, ended_s=job.end_s or 0.0),)
    direct = analyze(job, nodes, Settings().analysis, history=history)
    assert direct.similar_jobs == 3
    stored = analyse(job, nodes)
    assert [f.code for f in stored] == [f.code for f in direct.findings]
    assert [f.recommendation for f in stored if f.recommendation] == [
        f.recommendation for f in storable_findings(direct) if f.recommendation
    ]


@pytest.mark.parametrize(
    ("pattern", "seed"), [("small-batch", 0), ("dataloader", 1), ("idle-gpu", 0)]
)
def test_each_recommendation_is_stored_with_its_finding(pattern: str, seed: int) -> None:
    # Jobs of the evaluation corpus with recommendations and findings (the store fixtures'
    # job is too short for either, which would leave the loop below nothing to check).
    from slurm_gpu.evaluation.traces import generate

    trace = generate(pattern, seed)
    analysis = analyze(trace.job, trace.nodes, Settings().analysis)
    assert analysis.recommendations and analysis.findings
    stored = storable_findings(analysis)
    assert len(stored) == len(analysis.findings)
    placed = [f.recommendation for f in stored if f.recommendation is not None]
    assert len(placed) == min(len(analysis.recommendations), len(analysis.findings))
    codes = {x.code.value for x in analysis.findings}
    checked = 0
    for f in stored:
        rec = f.recommendation
        if rec is not None and rec["finding"] is not None and rec["finding"] in codes:
            checked += 1
            assert rec["finding"] == f.code.value
    assert checked  # a recommendation with its finding was placed and compared
