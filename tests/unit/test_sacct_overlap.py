"""``SacctSource(overlap_text=True)`` runs the text query while the accounting query runs (two
sacct processes at once, one slurmdbd round trip of wall time instead of two), with the same
answer and the same errors as the sequential pair."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import pytest
from sacct_fixtures import FormatRunner, row

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.errors import AccountingError

#: How long the accounting query waits for the text query to start, in seconds: only reached
#: when the two run one after the other.
WAIT_S = 5.0


class MeetingRunner(FormatRunner):
    """The accounting query answers only once the text query has started: run one after the
    other, the accounting query reports that it waited in vain."""

    def __init__(self, rows: Sequence[Mapping[str, str]]) -> None:
        super().__init__(rows)
        self.text_started = threading.Event()
        self.waited_in_vain = False

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        if "--allocations" in argv:
            self.text_started.set()
        elif not self.text_started.wait(WAIT_S):
            self.waited_in_vain = True
        return super().__call__(argv, env=env, timeout_s=timeout_s)


def test_the_text_query_runs_while_the_accounting_query_runs() -> None:
    runner = MeetingRunner([row(JobIDRaw="7", JobID="7", JobName="train")])
    jobs = SacctSource(runner=runner, overlap_text=True).get_jobs(["7"])
    assert not runner.waited_in_vain
    assert jobs["7"].job_name == "train"
    assert len(runner.calls) == 2


def test_the_same_answer_as_the_pair_run_in_turn() -> None:
    rows = [row(JobIDRaw=str(i), JobID=str(i), JobName=f"job {i}") for i in range(1, 30)]
    ids = [str(i) for i in range(1, 30)]
    apart = SacctSource(runner=FormatRunner(rows)).get_jobs(ids)
    together = SacctSource(runner=FormatRunner(rows), overlap_text=True).get_jobs(ids)
    assert together == apart


def test_by_default_the_text_query_waits_for_the_accounting_query() -> None:
    """The collector's default: an empty answer costs one sacct process, not two."""
    runner = FormatRunner([])
    assert SacctSource(runner=runner).get_jobs(["7"]) == {}
    assert len(runner.calls) == 1


def test_a_failing_text_query_is_the_same_error() -> None:
    class TextFails(FormatRunner):
        def __call__(
            self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
        ) -> CommandResult:
            if "--allocations" in argv:
                return CommandResult(1, b"", "sacct: error: Problem talking to the database")
            return super().__call__(argv, env=env, timeout_s=timeout_s)

    for overlap in (False, True):
        source = SacctSource(runner=TextFails([row()]), overlap_text=overlap)
        with pytest.raises(AccountingError, match="sacct failed"):
            source.get_jobs(["1234"])
