"""gpueff's owner fast path: the caller's own settled job in the store is reported without
asking accounting; every other case asks accounting exactly as before."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner, Result

from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import JobNotFoundError
from slurm_gpu.jobreport import service
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.records import JobRecord, Tres
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

SGTEST1, SGTEST2 = 1001, 1002


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, Any]
    subject: str | None = None


class NeverAsked:
    """An accounting source that must not be used: the test fails if it is."""

    name = "never"

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.calls.append(list(job_ids))
        pytest.fail(f"accounting was asked about {list(job_ids)}")

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        self.calls.append((start_s, end_s, users))
        pytest.fail("accounting was asked for a listing")


class AsCaller:
    """Answers like sacct under PrivateData=jobs for the caller ``uid``: only their jobs."""

    name = "fake"

    def __init__(self, jobs: Sequence[JobRecord], uid: int) -> None:
        self.jobs = list(jobs)
        self.uid = uid
        self.asked: list[list[str]] = []

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.asked.append(list(job_ids))
        return {
            j.job_id: j
            for j in self.jobs
            if j.uid == self.uid and (j.job_id in job_ids or j.job_id_display in job_ids)
        }

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return [j for j in self.jobs if j.uid == self.uid]


def _settings(state_dir: Path) -> Any:
    return parse_settings(
        {
            "paths": {"state_dir": str(state_dir), "spool_dir": str(state_dir / "spool")},
            "gpueff": {"min_elapsed_s": 30},
        },
        path=None,
    )


def _store(state_dir: Path, *jobs: JobRecord) -> None:
    bundles = [
        JobBundle(
            job,
            (dataclasses.replace(F.node_record(), job_id=job.job_id),),
            TELEMETRY_COMPLETE,
            findings=(_Finding("GPU_UNUSED", "critical", 6, {}, "GPU-node1-0001"),),
            analysis_version="1",
        )
        for job in jobs
    ]
    with Store.open(_settings(state_dir).store_url) as store:
        store.write_batch(bundles, collected_at_s=1.0)


def _gpueff(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    accounting: Any,
    caller_uid: int,
    *args: str,
) -> Result:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpueff]\nmin_elapsed_s = 30\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    reader = StoreAndSpoolReader(_settings(tmp_path))
    return CliRunner().invoke(
        cli,
        ["--no-color", *args],
        obj={BACKENDS_KEY: (accounting, reader), CALLER_UID_KEY: caller_uid},
        catch_exceptions=False,
    )


# ----------------------------------------------------------------- (a) the owner path


@pytest.mark.parametrize("as_json", [False, True])
def test_own_settled_stored_job_is_reported_without_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    _store(tmp_path, F.job())
    accounting = NeverAsked()
    args = ("--json", "1001") if as_json else ("1001",)
    res = _gpueff(tmp_path, monkeypatch, accounting, SGTEST1, *args)
    assert res.exit_code == 0, res.output
    assert accounting.calls == []
    if as_json:
        (job,) = json.loads(res.output)["jobs"]
        assert job["job_id"] == "1001" and job["telemetry"] == "final" and len(job["gpus"]) == 2
    else:
        assert 'Job 1001 "train-resnet"' in res.output
        assert "(final, from the job's sealed record)" in res.output
        assert res.output.count("% busy") == 2


def test_own_array_task_and_het_component_are_answered_from_the_store(tmp_path: Path) -> None:
    task = F.job(job_id="1010", job_id_display="1007_3", array_job_id="1007", array_task_id="3")
    comp = F.job(job_id="1021", job_id_display="1020+1", het_job_id="1020", het_job_offset=1)
    _store(tmp_path, task, comp)
    accounting = NeverAsked()
    found = service.lookup(
        ["1007_3", "1020+1"],
        accounting,
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=SGTEST1,
    )
    assert accounting.calls == []
    assert [(typed, [r.job_id for r in reports]) for typed, reports in found.groups] == [
        ("1007_3", ["1010"]),
        ("1020+1", ["1021"]),
    ]


def test_the_store_answers_exactly_what_accounting_would(tmp_path: Path) -> None:
    """Same job, same reader: the report built from the stored accounting equals the one
    built from accounting's answer."""
    job = F.job()
    _store(tmp_path, job)
    from_store = service.lookup(
        ["1001"],
        NeverAsked(),
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=SGTEST1,
    )
    from_accounting = service.lookup(
        ["1001"],
        AsCaller([job], SGTEST1),
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=None,
    )
    assert from_store == from_accounting


# ----------------------------------------------------------------- (b) someone else's job


@pytest.mark.parametrize("as_json", [False, True])
def test_another_users_stored_job_asks_accounting_and_shows_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    _store(tmp_path, F.job(job_name="secret-project-x"))
    accounting = AsCaller([F.job(job_name="secret-project-x")], uid=SGTEST2)
    args = ("--json", "1001") if as_json else ("1001",)
    res = _gpueff(tmp_path, monkeypatch, accounting, SGTEST2, *args)
    assert accounting.asked == [["1001"]]
    assert res.exit_code == JobNotFoundError.exit_code, res.output
    assert "not found" in res.output
    for secret in ("secret-project-x", "sgtest1", "GPU-node1", "busy", "research"):
        assert secret not in res.output


def test_a_coordinator_sees_another_users_job_through_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Accounting returns the job to a coordinator of its account: shown, as before.
    _store(tmp_path, F.job())

    class Coordinator(AsCaller):
        def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
            self.asked.append(list(job_ids))
            return {j.job_id: j for j in self.jobs if j.job_id in job_ids}

    accounting = Coordinator([F.job()], uid=SGTEST2)
    res = _gpueff(tmp_path, monkeypatch, accounting, SGTEST2, "1001")
    assert accounting.asked == [["1001"]]
    assert res.exit_code == 0, res.output
    assert "(final, from the job's sealed record)" in res.output


def test_root_is_answered_from_the_store_for_any_settled_job(tmp_path: Path) -> None:
    """Slurm shows root every job, so for a settled stored job accounting adds nothing."""
    _store(tmp_path, F.job(), F.job(job_id="1002", job_id_display="1002", state="RUNNING"))

    class AsRoot(AsCaller):  # every job, whoever owns it
        def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
            self.asked.append(list(job_ids))
            return {j.job_id: j for j in self.jobs if j.job_id in job_ids}

    accounting = AsRoot([F.job(), F.job(job_id="1002", job_id_display="1002")], uid=0)
    found = service.lookup(
        ["1001", "1002"],
        accounting,
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=0,
    )
    assert accounting.asked == [["1002"]]  # the unsettled one only
    assert [typed for typed, _ in found.groups] == ["1001", "1002"]


# ----------------------------------------------------------------- (c) accounting needed


def test_own_job_not_in_the_store_asks_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path, F.job(job_id="999", job_id_display="999"))
    accounting = AsCaller([F.job()], uid=SGTEST1)
    res = _gpueff(tmp_path, monkeypatch, accounting, SGTEST1, "1001")
    assert accounting.asked == [["1001"]]
    assert res.exit_code == 0, res.output
    assert "has not been collected yet" in res.output


def test_own_running_job_asks_accounting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = F.job(state="RUNNING", end_s=None)
    accounting = AsCaller([running], uid=SGTEST1)
    res = _gpueff(tmp_path, monkeypatch, accounting, SGTEST1, "1001")
    assert accounting.asked == [["1001"]]
    assert res.exit_code == 0, res.output
    assert "RUNNING" in res.output


def test_only_the_ids_the_store_cannot_answer_go_to_accounting(tmp_path: Path) -> None:
    _store(tmp_path, F.job())
    accounting = AsCaller([F.job(), F.job(job_id="1002", job_id_display="1002")], SGTEST1)
    found = service.lookup(
        ["1002", "1001", "77"],
        accounting,
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=SGTEST1,
    )
    assert accounting.asked == [["1002", "77"]]
    assert [typed for typed, _ in found.groups] == ["1002", "1001"]
    assert found.missing == ("77",)


UNSETTLED = {
    "still running (stored as it was)": {"state": "RUNNING", "end_s": None},
    "requeued": {"state": "REQUEUED"},
    "TRES not recorded yet": {
        "req_tres": Tres(cpus=8, mem_bytes=None, nodes=1, gpus=2, raw=""),
    },
}


@pytest.mark.parametrize("change", UNSETTLED.values(), ids=UNSETTLED.keys())
def test_a_stored_job_that_is_not_settled_asks_accounting(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    _store(tmp_path, F.job(**change))
    accounting = AsCaller([F.job()], SGTEST1)
    service.lookup(
        ["1001"],
        accounting,
        StoreAndSpoolReader(_settings(tmp_path)),
        min_elapsed_s=30,
        caller_uid=SGTEST1,
    )
    assert accounting.asked == [["1001"]]


# ----------------------------------------------------------------- the rule itself


def _task(task: str, job_id: str) -> JobRecord:
    return F.job(
        job_id=job_id, job_id_display=f"500_{task}", array_job_id="500", array_task_id=task
    )


@pytest.mark.parametrize(
    ("typed", "stored", "caller", "answered"),
    [
        ("1001", [F.job()], SGTEST1, "1001"),
        ("1001.batch", [F.job()], SGTEST1, "1001"),
        ("1001", [F.job()], SGTEST2, None),  # not the caller's
        ("1001", [F.job(uid=None)], SGTEST1, None),  # owner unknown
        ("1001", [F.job(uid=0, user="root")], 0, "1001"),  # root sees every job
        ("1001", [F.job()], 0, "1001"),
        ("1001", [F.job(state="RUNNING", end_s=None)], 0, None),  # not settled
        ("1001", [F.job()], None, None),  # caller unknown
        ("1001", [], SGTEST1, None),  # not stored
        ("1001", [F.job(state="CANCELLED")], SGTEST1, "1001"),  # final, not only COMPLETED
        ("1001", [F.job(state="PENDING", end_s=None)], SGTEST1, None),
        # A whole array: the store holds only the collected GPU tasks.
        ("500", [_task("0", "501"), _task("1", "500")], SGTEST1, None),
        ("500", [_task("1", "500")], SGTEST1, None),
        ("500_1", [_task("0", "501"), _task("1", "500")], SGTEST1, "500"),
        ("500_[0-1]", [_task("0", "501"), _task("1", "500")], SGTEST1, None),
        # A whole het job: only accounting knows all its components.
        ("700", [F.job(job_id="700", het_job_id="700", het_job_offset=0)], SGTEST1, None),
    ],
)
def test_answer_from_store(
    typed: str, stored: list[JobRecord], caller: int | None, answered: str | None
) -> None:
    job = service.answer_from_store(typed, stored, caller)
    assert (job.job_id if job is not None else None) == answered
