"""One contract, two sources: SacctSource (recorded sacct 22.05 output through the injected
runner) and PyslurmSource (a fake ``pyslurm.db`` of 25.11's shape) must give equal JobRecords
for the same jobs, and both must satisfy the AccountingSource protocol's promises."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from fake_pyslurm import Job, JobStatistics, make_module, tres

from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.accounting.pyslurm_source import PyslurmSource
from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import FIELDS, TEXT_FIELDS, SacctSource, split_records
from slurm_gpu.errors import AccountingError
from slurm_gpu.textsafe import REPLACEMENT

RECORDED = Path(__file__).resolve().parent.parent / "data" / "sacct" / "contract_jobs.txt"
UIDS = {"sgtest1": 1001, "root": 0}
COMMON = dict(
    account="physics",
    partition="gpu",
    qos="normal",
    user_name="sgtest1",
    user_id=1001,
    working_directory="/tmp/sgacct",
    nodelist="vm",
    submit_time=1795255433,
)

#: The same jobs as recorded in contract_jobs.txt, as pyslurm 25.11 would describe them.
PYSLURM_JOBS = [
    Job(
        id=2,
        name="gpu1",
        elapsed_time=3,
        time_limit=5,
        start_time=1795255434,
        end_time=1795255437,
        cpus=1,
        memory=500,
        allocated_tres=tres(1, 500, 1, 1, 1, "a100"),
        requested_tres=tres(1, 500, 1, 1, 1),
        stats=JobStatistics(96596 * 1024, 3.08),
        **COMMON,
    ),
    Job(
        id=4,
        name="a|b\nc é",
        comment="note|x",
        elapsed_time=1,
        time_limit=5,
        start_time=1795255434,
        end_time=1795255435,
        cpus=1,
        memory=512,
        allocated_tres=tres(1, 512, 1, 1, 1, "a100"),
        requested_tres=tres(1, 512, 1, 1, 1),
        stats=JobStatistics(3228 * 1024, 0.002),
        **COMMON,
    ),
    Job(
        id=6,
        name="fail",
        state="FAILED",
        exit_code=3,
        elapsed_time=0,
        time_limit=5,
        start_time=1795255434,
        end_time=1795255434,
        cpus=1,
        memory=512,
        allocated_tres=tres(1, 512, 1, 1),
        requested_tres=tres(1, 512, 1, 1),
        stats=JobStatistics(None, 0.001),
        **COMMON,
    ),
    Job(
        id=8,
        name="canc",
        state="CANCELLED",
        cancelled_by="sgtest1",
        elapsed_time=17,
        time_limit=5,
        start_time=1795255434,
        end_time=1795255451,
        cpus=1,
        memory=512,
        allocated_tres=tres(1, 512, 1, 1),
        requested_tres=tres(1, 512, 1, 1),
        stats=JobStatistics(3080 * 1024, 0.002),
        **COMMON,
    ),
    # A het component cancelled (by root) before it ever started.
    Job(
        id=12,
        name="het",
        state="CANCELLED",
        cancelled_by="root",
        heterogeneous_id=11,
        heterogeneous_offset=1,
        time_limit=5,
        end_time=1795255598,
        cpus=1,
        memory=512,
        requested_tres=tres(1, 512, 1, 1),
        stats=JobStatistics(None, 0),
        **{**COMMON, "nodelist": "None assigned"},
    ),
    Job(
        id=14,
        name="arr",
        array_id=5,
        array_task_id=2,
        elapsed_time=4,
        time_limit=5,
        start_time=1795255438,
        end_time=1795255442,
        cpus=1,
        memory=512,
        allocated_tres=tres(1, 512, 1, 1),
        requested_tres=tres(1, 512, 1, 1),
        stats=JobStatistics(3056 * 1024, 0.003),
        **COMMON,
    ),
    # Requeued by an admin while running: accounting shows the new, pending run.
    Job(
        id=17,
        name="rq2",
        state="PENDING",
        requeue_count=1,
        time_limit=5,
        cpus=1,
        memory=512,
        requested_tres=tres(1, 512, 1, 1),
        stats=JobStatistics(None, 0),
        **{**COMMON, "nodelist": "None assigned", "submit_time": 1795255602},
    ),
]
IDS = ["2", "4", "6", "8", "5_2", "11+1", "17"]


#: The recorded file's fields: one query, user strings included (tests/data/sacct/README.md).
RECORDED_FIELDS = (
    *FIELDS[: FIELDS.index("AdminComment")],
    "JobName",
    "Comment",
    "AdminComment",
    "WorkDir",
    "JobIDRaw",
)
#: Fields asked for since the file was recorded (``NTasks``, ``Reason``): empty, as unknown.
LATER_FIELDS = dict.fromkeys([f for f in (*FIELDS, *TEXT_FIELDS) if f not in RECORDED_FIELDS], "")


class Replay:
    """Answers each sacct call with the recorded jobs in the fields, delimiter and lines
    (``--allocations``) that the call asks for, as sacct would."""

    def __init__(self, stdout: bytes, returncode: int = 0, stderr: str = "") -> None:
        records, _ = split_records(stdout.decode(), RECORDED_FIELDS)
        self.rows = [
            {**LATER_FIELDS, **dict(zip(RECORDED_FIELDS, r, strict=True))} for r in records
        ]
        self.returncode, self.stderr = returncode, stderr
        self.calls = 0

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls += 1
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        fields, delim = opts["--format"].split(","), opts["--delimiter"]
        rows = [r for r in self.rows if "--allocations" not in argv or "." not in r["JobIDRaw"]]
        out = "".join(delim.join(r[f] for f in fields) + "\n" for r in rows)
        return CommandResult(self.returncode, out.encode(), self.stderr)


def sacct_source(fail: bool = False) -> AccountingSource:
    if fail:
        return SacctSource(
            runner=Replay(
                b"", 1, "sacct: error: Problem talking to the database: Connection refused"
            )
        )
    return SacctSource(runner=Replay(RECORDED.read_bytes()))


def pyslurm_source(fail: bool = False) -> AccountingSource:
    return PyslurmSource(module=make_module(PYSLURM_JOBS, fail=fail), uid_of=UIDS.get)


SOURCES: dict[str, Callable[..., AccountingSource]] = {
    "sacct": sacct_source,
    "pyslurm": pyslurm_source,
}


@pytest.fixture(params=list(SOURCES))
def make(request: pytest.FixtureRequest) -> Callable[..., AccountingSource]:
    return SOURCES[request.param]


def test_is_an_accounting_source(make: Callable[..., AccountingSource]) -> None:
    assert isinstance(make(), AccountingSource)


def test_completed_gpu_job(make: Callable[..., AccountingSource]) -> None:
    rec = make().get_jobs(["2"])["2"]
    assert rec.state == "COMPLETED" and rec.exit_code == 0
    assert rec.alloc_tres.gpus == 1 and rec.alloc_tres.gpu_types == (("a100", 1),)
    assert rec.req_mem_bytes == 500 * 1024**2
    assert rec.max_rss_bytes == 96596 * 1024
    assert rec.total_cpu_s == pytest.approx(3.08)
    assert (rec.elapsed_s, rec.time_limit_s) == (3, 300)
    assert rec.nodelist == ("vm",) and rec.uid == 1001


def test_free_text_survives(make: Callable[..., AccountingSource]) -> None:
    rec = make().get_jobs(["4"])["4"]
    # The newline is a control character, replaced where the name enters (both backends).
    assert rec.job_name == f"a|b{REPLACEMENT}c é" and rec.comment == "note|x"


def test_failed_and_cancelled(make: Callable[..., AccountingSource]) -> None:
    jobs = make().get_jobs(["6", "8"])
    assert (jobs["6"].state, jobs["6"].exit_code) == ("FAILED", 3)
    assert (jobs["8"].state, jobs["8"].cancelled_by_uid) == ("CANCELLED", 1001)


def test_array_task(make: Callable[..., AccountingSource]) -> None:
    rec = make().get_jobs(["5_2"])["14"]
    assert (rec.job_id_display, rec.array_job_id, rec.array_task_id) == ("5_2", "5", "2")


def test_het_component(make: Callable[..., AccountingSource]) -> None:
    rec = make().get_jobs(["11+1"])["12"]
    assert (rec.het_job_id, rec.het_job_offset, rec.job_id_display) == ("11", 1, "11+1")
    assert (rec.state, rec.cancelled_by_uid, rec.start_s, rec.nodelist) == (
        "CANCELLED",
        0,
        None,
        (),
    )


def test_requeued_job_is_its_last_run(make: Callable[..., AccountingSource]) -> None:
    rec = make().get_jobs(["17"])["17"]
    assert (rec.restarts, rec.state, rec.start_s, rec.submit_s) == (
        1,
        "PENDING",
        None,
        1795255602.0,
    )


def test_unknown_job_is_absent(make: Callable[..., AccountingSource]) -> None:
    assert "999" not in make().get_jobs(["999"])


def test_unreachable_database_is_accounting_error(make: Callable[..., AccountingSource]) -> None:
    with pytest.raises(AccountingError):
        make(fail=True).get_jobs(["2"])


def test_both_sources_give_equal_records() -> None:
    via_sacct = sacct_source().get_jobs(IDS)
    via_pyslurm = pyslurm_source().get_jobs(IDS)
    assert sorted(via_sacct) == sorted(via_pyslurm)
    for job_id, record in via_sacct.items():
        # Steps come from sacct only (the pyslurm source does not read them yet).
        assert replace(record, steps=()) == via_pyslurm[job_id], job_id


def test_pyslurm_batches_by_base_id() -> None:
    module = make_module(PYSLURM_JOBS)
    PyslurmSource(module=module, uid_of=UIDS.get, batch_size=2).get_jobs(IDS)
    assert [sorted(f.ids) for f in module.calls] == [[2, 4], [6, 8], [5, 11], [17]]
