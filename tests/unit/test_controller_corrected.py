"""The controller's word for live jobs accounting has not seen start (``accounting.controller``).

Seen in CI: ``gpueff`` on a job ``squeue`` showed RUNNING printed ``PENDING``, ``partition n/a``,
``cpus 0``, ``gpus 0``: slurmdbd had a bare record of the job (named "allocation") and had not
heard of its start. With slurmdbd down, ``sacct`` fails outright. The controller is asked
(through an injected runner here; ``tests/integration/test_gpueff_dbd_down_cluster.py`` runs
the real ``squeue`` with slurmdbd stopped) only for the ids accounting did not show started.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_job

from slurm_gpu.accounting.controller import (
    FIELDS,
    MAX_OUTPUT_BYTES,
    ControllerCorrected,
    SqueueView,
    corrected,
    parse_squeue,
    query_delimiter,
    squeue_path_for,
)
from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import Tres

NOW = 1_795_964_900.0
#: Stands for the query's delimiter in recorded answers; ``Runner`` puts the real one in.
D = "<D>"


def _line(
    job: str,
    display: str,
    state: str,
    *,
    array: tuple[str, str] = ("", "N/A"),
    nodes: str = "vm",
    start: str = "1795964806",
    user: str = "sgtest1",
    name: str = "train",
    used: str = "1:34",
) -> str:
    array_job, task = array
    values = [
        job,
        display,
        array_job or job,
        task,
        "N/A",
        "N/A",
        state,
        nodes,
        start,
        "1795964800",
        user,
        "1001",
        "physics",
        "gpu",
        "1",
        "cpu=1,mem=100M,node=1,billing=1,gres/gpu=1,gres/gpu:a100=1",
        "2:00",
        used,
        name,
    ]
    assert len(values) == len(FIELDS)
    return "".join(v + D for v in values) + "\n"


class Runner:
    """Replays squeue's answer and keeps each argv it was given."""

    def __init__(self, stdout: str = "", returncode: int = 0, error: bool = False) -> None:
        self.stdout = stdout
        self.returncode = returncode
        self.error = error
        self.calls: list[list[str]] = []

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        max_stdout: int | None = None,
    ) -> CommandResult:
        self.calls.append(list(argv))
        assert env == {"SLURM_TIME_FORMAT": "%s"}
        if self.error:
            raise AccountingError("squeue could not run", hint="")
        delimiter = argv[-1].split(",")[0].removeprefix("--Format=JobID:0")
        return CommandResult(self.returncode, self.stdout.replace(D, delimiter).encode(), "")


def _down() -> FakeAccounting:
    acc = FakeAccounting()
    acc.fail = True  # sacct's error while slurmdbd is down
    return acc


def _placeholder(job_id: str) -> object:
    """The record sacct printed in CI: PENDING, named "allocation", no partition, no CPUs."""
    j = make_job(job_id, gpus=0, state="PENDING", end_s=None, user="sgtest1", partition="")
    return replace(j, job_name="allocation", partition=None, alloc_cpus=0, alloc_tres=Tres())


def _source(*jobs: object) -> FakeAccounting:
    acc = FakeAccounting()
    for j in jobs:
        acc.jobs[j.job_id] = j  # type: ignore[attr-defined]
    return acc


def _corrected(acc: FakeAccounting, runner: Runner) -> ControllerCorrected:
    return ControllerCorrected(acc, SqueueView(runner=runner), clock=lambda: NOW)


def test_a_placeholder_pending_record_takes_the_controllers_running_job() -> None:
    runner = Runner(_line("236", "236", "RUNNING"))
    got = _corrected(_source(_placeholder("236")), runner).get_jobs(["236"])
    job = got["236"]
    assert job.state == "RUNNING" and job.partition == "gpu" and job.nodelist == ("vm",)
    assert job.alloc_tres.gpus == 1 and job.alloc_cpus == 1
    assert job.start_s == 1795964806.0 and job.elapsed_s == 94  # TimeUsed, not now - start
    assert job.time_limit_s == 120 and job.exit_code is None and job.end_s is None
    assert job.job_name == "train"  # not the unsettled record's "allocation"
    assert len(runner.calls) == 1


def test_a_job_accounting_shows_started_asks_no_controller() -> None:
    runner = Runner(_line("236", "236", "RUNNING"))
    running = make_job("236", state="RUNNING", end_s=None)
    got = _corrected(_source(running, make_job("237")), runner).get_jobs(["236", "237"])
    assert got["236"] is running and runner.calls == []


def test_a_job_the_controller_shows_pending_or_ended_is_left_to_accounting() -> None:
    placeholder = _placeholder("236")
    for state in ("PENDING", "COMPLETED", "CANCELLED", "TIMEOUT"):
        runner = Runner(_line("236", "236", state))
        got = _corrected(_source(placeholder), runner).get_jobs(["236"])
        assert got["236"] is placeholder, state


def test_a_job_accounting_has_not_heard_of_is_built_from_the_controller() -> None:
    runner = Runner(_line("240", "240", "RUNNING"))
    got = _corrected(_source(), runner).get_jobs(["240"])
    job = got["240"]
    assert job.state == "RUNNING" and job.user == "sgtest1" and job.uid == 1001
    assert job.account == "physics" and job.req_tres.gpus == 1 and job.job_name == "train"


def test_array_tasks_are_matched_by_their_own_ids() -> None:
    out = "".join(
        [
            _line("314", "314_[4-6]", "PENDING", array=("314", "4-6"), nodes="", start="0"),
            _line("315", "314_1", "RUNNING", array=("314", "1")),
            _line("316", "314_2", "RUNNING", array=("314", "2")),
        ]
    )
    got = _corrected(_source(), Runner(out)).get_jobs(["314_2"])
    assert list(got) == ["316"]
    assert got["316"].job_id_display == "314_2" and got["316"].array_task_id == "2"
    whole = _corrected(_source(), Runner(out)).get_jobs(["314"])
    # Accounting has no record of the array yet: its running tasks and its pending rest, as
    # accounting will list them once it hears of them.
    assert sorted(whole) == ["314", "315", "316"]
    assert whole["314"].state == "PENDING" and whole["314"].job_id_display == "314_[4-6]"
    # Once accounting knows the array, its record of the pending rest is the one kept.
    rest = make_job("314", state="PENDING", end_s=None)
    known = _corrected(_source(rest), Runner(out)).get_jobs(["314"])
    assert known["314"] is rest


def test_with_accounting_down_the_controller_answers_only_when_it_shows_every_id() -> None:
    runner = Runner(_line("236", "236", "RUNNING"))
    got = _corrected(_down(), runner).get_jobs(["236"])
    assert got["236"].state == "RUNNING"
    # An ended job only accounting knows: accounting's error stands.
    with pytest.raises(AccountingError, match="slurmdbd unreachable"):
        _corrected(_down(), runner).get_jobs(["236", "12"])
    with pytest.raises(AccountingError, match="slurmdbd unreachable"):
        _corrected(_down(), Runner("", returncode=1)).get_jobs(["236"])


def test_a_controller_that_cannot_answer_leaves_accountings_answer() -> None:
    placeholder = _placeholder("236")
    for runner in (Runner(returncode=1), Runner(error=True), Runner("x" * (MAX_OUTPUT_BYTES + 1))):
        got = _corrected(_source(placeholder), runner).get_jobs(["236"])
        assert got["236"] is placeholder


def _parse(text: str) -> list[str]:
    delimiter = query_delimiter()
    return [j.job_id for j in parse_squeue(text.replace(D, delimiter), delimiter)]


def test_answers_of_another_shape_are_dropped() -> None:
    good = _line("236", "236", "RUNNING")
    assert _parse(good) == ["236"]
    assert _parse(good + _line("237", "237", "RUNNING")) == ["236", "237"]
    assert _parse(good + "extra" + D) == []
    assert _parse(good.replace(D, "", 1)) == []
    assert _parse(good.rstrip("\n") + _line("237", "237", "RUNNING")) == []
    assert _parse(_line("236", "236", "RUNNING", nodes="vm[1-")) == []
    assert _parse("slurm_load_jobs error: Invalid job id specified\n") == []
    assert _parse("") == []


def test_a_job_name_cannot_forge_a_field_or_a_job() -> None:
    # A name written before the query cannot hold its random delimiter: a name that tries an
    # old one, newlines and a whole second record stays one cleaned name of one job.
    forged = "x\x1f0000000000000000\x1f\n999\x1f" + "\x1f".join(["RUNNING"] * 17)
    delimiter = query_delimiter()
    text = _line("236", "236", "RUNNING", name=forged + "\x1b[31m").replace(D, delimiter)
    (job,) = parse_squeue(text, delimiter)
    assert job.job_id == "236" and job.state == "RUNNING"
    assert "\x1b" not in job.job_name and "\n" not in job.job_name
    assert job.job_name.startswith("x") and job.job_name.endswith("[31m")
    assert query_delimiter() != query_delimiter()


def test_squeue_is_asked_for_no_field_a_user_can_type() -> None:
    argv = SqueueView().argv(["236", "314_2"], "\x1fD\x1f")
    assert argv[:4] == ["squeue", "--noheader", "--states=all", "--jobs=236,314_2"]
    fmt = argv[4].removeprefix("--Format=")
    assert fmt.split(",")[0] == "JobID:0\x1fD\x1f"
    asked = {f.split(":")[0].lower() for f in fmt.split(",")}
    # The name (framed by the random delimiter, cleaned) is the only text a user chose.
    assert not asked & {"comment", "workdir", "command", "stdout", "stderr", "reason"}
    assert "name" in asked
    assert squeue_path_for("/opt/slurm/bin/sacct") == "/opt/slurm/bin/squeue"
    assert squeue_path_for("sacct") == "squeue"


def test_corrected_keeps_the_request_accounting_has() -> None:
    pending = make_job("236", gpus=2, state="PENDING", end_s=None)
    delimiter = query_delimiter()
    live = parse_squeue(_line("236", "236", "RUNNING").replace(D, delimiter), delimiter)[0]
    assert corrected(pending, live, NOW).req_tres.gpus == 2


def _first(acc: FakeAccounting, runner: Runner) -> ControllerCorrected:
    return ControllerCorrected(
        acc, SqueueView(runner=runner), controller_first=True, clock=lambda: NOW
    )


def test_controller_first_answers_a_running_job_without_accounting() -> None:
    acc = _source(make_job("236", state="RUNNING", end_s=None))
    runner = Runner(
        _line("236", "236", "RUNNING") + _line("316", "314_2", "RUNNING", array=("314", "2"))
    )
    got = _first(acc, runner).get_jobs(["236", "314_2"])
    assert sorted(got) == ["236", "316"] and got["236"].state == "RUNNING"
    assert acc.get_calls == [] and len(runner.calls) == 1


def test_controller_first_leaves_ended_jobs_and_whole_arrays_to_accounting() -> None:
    ended = make_job("12")
    running = make_job("236", state="RUNNING", end_s=None)
    # An ended job: accounting answers, and the controller's answer is not asked again.
    acc = _source(ended, running)
    runner = Runner(_line("236", "236", "RUNNING"), returncode=0)
    got = _first(acc, runner).get_jobs(["236", "12"])
    assert got["12"] is ended and got["236"] is running
    assert acc.get_calls == [["236", "12"]] and len(runner.calls) == 1
    # A whole array whose tasks run: its ended tasks are accounting's.
    out = _line("315", "314_1", "RUNNING", array=("314", "1"))
    acc = _source()
    _first(acc, Runner(out)).get_jobs(["314"])
    assert acc.get_calls == [["314"]]
    # A range of tasks, even all running.
    acc = _source()
    _first(acc, Runner(out)).get_jobs(["314_[1-1]"])
    assert acc.get_calls == [["314_[1-1]"]]


def test_controller_first_asks_accounting_when_the_controller_cannot_answer() -> None:
    ended = make_job("12")
    for runner in (
        Runner(returncode=1),
        Runner(error=True),
        Runner(_line("12", "12", "COMPLETED")),
    ):
        acc = _source(ended)
        assert _first(acc, runner).get_jobs(["12"]) == {"12": ended}
        assert acc.get_calls == [["12"]]


def test_with_accounting_down_and_no_squeue_accountings_error_is_shown() -> None:
    for first in (False, True):
        source = ControllerCorrected(
            _down(), SqueueView(runner=Runner(error=True)), controller_first=first
        )
        with pytest.raises(AccountingError, match="slurmdbd unreachable"):
            source.get_jobs(["236"])


def test_without_slurms_run_time_elapsed_counts_from_the_start() -> None:
    runner = Runner(_line("236", "236", "RUNNING", used="N/A"))
    job = _corrected(_source(_placeholder("236")), runner).get_jobs(["236"])["236"]
    assert job.elapsed_s == int(NOW - 1795964806)


# A controller that does not answer: seen from outside, ``gpueff`` on a running job took 18 s
# with slurmctld stopped (``squeue`` retries its connection that long) and 20 s with it hung,
# though accounting answered at once. With ``hedge_s``, accounting is asked too once the
# controller has been silent that long.


class SilentRunner(Runner):
    """A controller that answers only once ``release`` is set (stopped, hung, restarting)."""

    def __init__(self, stdout: str = "") -> None:
        super().__init__(stdout)
        self.release = threading.Event()

    def __call__(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        # Bounded, so that a caller that waited for this answer fails here instead of hanging.
        if not self.release.wait(10):
            raise AssertionError("the controller was waited for")
        return super().__call__(argv, **kw)


class ReleasingAccounting(FakeAccounting):
    """Accounting that lets the silent controller answer once it has answered itself."""

    def __init__(self, runner: SilentRunner, *jobs: object) -> None:
        super().__init__({j.job_id: j for j in jobs})  # type: ignore[attr-defined]
        self.runner = runner

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Any]:
        try:
            return super().get_jobs(job_ids)
        finally:
            self.runner.release.set()


def _hedged(acc: FakeAccounting, runner: Runner, hedge_s: float = 0.05) -> ControllerCorrected:
    return ControllerCorrected(
        acc, SqueueView(runner=runner), controller_first=True, hedge_s=hedge_s, clock=lambda: NOW
    )


def _while_silent(acc: FakeAccounting, runner: SilentRunner, ids: list[str]) -> dict[str, Any]:
    """``get_jobs(ids)``, checked to answer before the controller is let answer."""
    try:
        got = _hedged(acc, runner).get_jobs(ids)
        assert not runner.release.is_set(), "the controller was waited for"
    finally:
        runner.release.set()
    return got


def test_a_silent_controller_leaves_jobs_accounting_shows_started_to_accounting() -> None:
    running = make_job("236", state="RUNNING", end_s=None)
    ended = make_job("12")
    runner = SilentRunner(_line("236", "236", "RUNNING"))
    acc = _source(running, ended)
    assert _while_silent(acc, runner, ["236", "12"]) == {"236": running, "12": ended}
    assert acc.get_calls == [["236", "12"]] and runner.calls == []


def test_a_silent_controller_is_waited_for_when_accounting_has_not_seen_the_start() -> None:
    runner = SilentRunner(_line("236", "236", "RUNNING"))
    acc = ReleasingAccounting(runner, _placeholder("236"))
    got = _hedged(acc, runner).get_jobs(["236"])
    assert got["236"].state == "RUNNING" and got["236"].partition == "gpu"
    assert acc.get_calls == [["236"]] and len(runner.calls) == 1


def test_a_silent_controller_is_waited_for_when_accounting_fails() -> None:
    runner = SilentRunner(_line("236", "236", "RUNNING"))
    acc = ReleasingAccounting(runner)
    acc.fail = True
    got = _hedged(acc, runner).get_jobs(["236"])
    assert got["236"].state == "RUNNING" and len(runner.calls) == 1
    # Accounting down and the controller silent until it gives up: accounting's error.
    acc = _down()
    source = _hedged(acc, Runner(error=True))
    with pytest.raises(AccountingError, match="slurmdbd unreachable"):
        source.get_jobs(["236"])


def test_a_controller_that_answers_in_time_is_asked_alone() -> None:
    acc = _source(make_job("236", state="RUNNING", end_s=None))
    runner = Runner(_line("236", "236", "RUNNING"))
    got = _hedged(acc, runner, hedge_s=30.0).get_jobs(["236"])
    assert got["236"].state == "RUNNING" and acc.get_calls == [] and len(runner.calls) == 1


def test_a_controller_still_silent_after_the_grace_leaves_accountings_answer() -> None:
    placeholder = _placeholder("236")
    runner = SilentRunner(_line("236", "236", "RUNNING") + _line("240", "240", "RUNNING"))
    # As when squeue cannot run: accounting's word stands.
    assert _while_silent(_source(placeholder), runner, ["236", "240"]) == {"236": placeholder}


# Seen from outside with munged hung (SIGSTOP): every Slurm command waits for it. ``gpueff`` on
# a running job took 121 s: ``squeue`` ran to its 60 s timeout, ``sacct`` to its own, and the
# controller, having failed, was asked a second time for another 60 s.


class FailingRunner(Runner):
    """A controller that cannot be asked (squeue timed out); counts the tries."""

    def __init__(self) -> None:
        super().__init__(error=True)


@pytest.mark.parametrize("hedge_s", [None, 0.0, 30.0])
def test_a_controller_that_failed_is_not_asked_again_when_accounting_fails(
    hedge_s: float | None,
) -> None:
    runner = FailingRunner()
    source = ControllerCorrected(
        _down(), SqueueView(runner=runner), controller_first=True, hedge_s=hedge_s
    )
    with pytest.raises(AccountingError):
        source.get_jobs(["236"])
    assert len(runner.calls) == 1


def test_a_controller_that_failed_is_not_asked_again_for_a_job_not_seen_started() -> None:
    runner = FailingRunner()
    acc = _source(_placeholder("236"))
    got = _first(acc, runner).get_jobs(["236"])
    assert got["236"].state == "PENDING" and len(runner.calls) == 1


def test_when_both_fail_the_error_says_the_controller_did_not_answer_either() -> None:
    for first in (False, True):
        source = ControllerCorrected(
            _down(), SqueueView(runner=FailingRunner()), controller_first=first
        )
        with pytest.raises(AccountingError, match="slurmdbd unreachable") as got:
            source.get_jobs(["236"])
        assert "squeue did not answer either" in got.value.hint, got.value.hint
        assert "munge" in got.value.hint


def test_a_pending_job_accounting_has_not_heard_of_is_the_controllers() -> None:
    """Seen on the test cluster: ``gpueff`` on a job submitted a few seconds before, which
    ``squeue`` showed PENDING, said "job 178 not found" (and hinted at a wrong id): slurmdbd
    had no record of it yet (it had one 15 s later). The controller's pending job answers,
    built from what it shows (a pending job's TRES is its request)."""
    pending = _line("178", "178", "PENDING", start="0", nodes="", used="0:00")
    for first in (False, True):
        acc = _source()
        got = (_first if first else _corrected)(acc, Runner(pending)).get_jobs(["178"])
        job = got["178"]
        assert job.state == "PENDING" and job.partition == "gpu" and job.job_name == "train"
        assert job.req_tres.gpus == 1 and job.start_s is None and job.end_s is None
        assert job.exit_code is None and job.user == "sgtest1"
        assert acc.get_calls == [["178"]], "accounting is still asked first"


def test_a_pending_job_accounting_knows_stays_accountings() -> None:
    """Accounting's record of a waiting job (a requeued job's earlier runs, its comment) is
    never replaced by the controller's."""
    waiting = make_job("236", state="PENDING", end_s=None)
    pending = _line("236", "236", "PENDING", start="0", nodes="", used="0:00")
    for first in (False, True):
        got = (_first if first else _corrected)(_source(waiting), Runner(pending)).get_jobs(["236"])
        assert got["236"] is waiting


def test_with_accounting_down_a_pending_job_is_the_controllers() -> None:
    pending = _line("178", "178", "PENDING", start="0", nodes="", used="0:00")
    for first in (False, True):
        source = ControllerCorrected(
            _down(), SqueueView(runner=Runner(pending)), controller_first=first, clock=lambda: NOW
        )
        assert source.get_jobs(["178"])["178"].state == "PENDING"
