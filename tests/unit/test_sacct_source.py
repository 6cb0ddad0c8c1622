"""SacctSource through an injected runner: one call per batch, errors typed, ids accepted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from sacct_fixtures import DATA, FormatRunner, ReplayRunner, render, row

from slurm_gpu.accounting import is_settled, open_accounting
from slurm_gpu.accounting.runner import SubprocessRunner
from slurm_gpu.accounting.sacct import DELIM, FIELDS, SacctSource
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import AccountingError, UsageError


def test_many_jobs_one_call() -> None:
    runner = FormatRunner([row(JobIDRaw=str(i), JobID=str(i)) for i in range(1, 51)])
    source = SacctSource(runner=runner, batch_size=500)
    jobs = source.get_jobs([str(i) for i in range(1, 51)])
    assert len(jobs) == 50
    assert len(runner.accounting_calls) == 1 and len(runner.calls) == 2  # + the text query
    argv = runner.calls[0]
    assert "--jobs=" + ",".join(str(i) for i in range(1, 51)) in argv
    assert f"--delimiter={DELIM}" in argv and "--parsable2" in argv and "--noheader" in argv
    assert "--format=" + ",".join(FIELDS) in argv
    assert runner.envs[0]["SLURM_TIME_FORMAT"] == "%s"


def test_batches_are_chunked() -> None:
    runner = FormatRunner([row()])
    SacctSource(runner=runner, batch_size=20).get_jobs([str(i) for i in range(1, 46)])
    assert len(runner.accounting_calls) == 3
    assert [
        len(next(a for a in c if a.startswith("--jobs=")).split(","))
        for c in runner.accounting_calls
    ] == [20, 20, 5]


def test_user_typed_ids_are_passed_in_sacct_form_and_deduplicated() -> None:
    runner = ReplayRunner(render([row()]))
    SacctSource(runner=runner).get_jobs(["1234", "1234_7", "1234+0", "1234.batch", "1234"])
    assert "--jobs=1234,1234_7,1234+0" in runner.calls[0]


def test_bad_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        SacctSource(runner=ReplayRunner()).get_jobs(["12;rm -rf"])


def test_missing_job_is_absent() -> None:
    assert SacctSource(runner=ReplayRunner(b"")).get_jobs(["999"]) == {}


def test_slurmdbd_down_is_accounting_error_with_stderr_and_hint() -> None:
    stderr = (DATA / "slurmdbd_down.stderr").read_text()
    source = SacctSource(runner=ReplayRunner(returncode=1, stderr=stderr))
    with pytest.raises(AccountingError) as info:
        source.get_jobs(["1"])
    assert "Connection refused" in info.value.stderr
    assert info.value.hint and "slurmdbd" in info.value.hint


def test_missing_binary_is_accounting_error(tmp_path: Path) -> None:
    source = SacctSource(sacct_path=str(tmp_path / "no-sacct"))
    with pytest.raises(AccountingError, match="not found"):
        source.get_jobs(["1"])


def test_timeout_is_accounting_error(tmp_path: Path) -> None:
    slow = tmp_path / "sacct"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    with pytest.raises(AccountingError, match="did not answer"):
        SubprocessRunner()([str(slow)], env={}, timeout_s=0.2)


def test_real_subprocess_runner_returns_bytes_and_exit(tmp_path: Path) -> None:
    script = tmp_path / "sacct"
    script.write_text("#!/bin/sh\nprintf 'out'\necho err >&2\nexit 3\n")
    script.chmod(0o755)
    done = SubprocessRunner()([str(script)], env={"X": "1"}, timeout_s=5)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (3, b"out", "err")


def test_jobs_between_asks_all_users_or_named_ones() -> None:
    runner = FormatRunner([row(JobIDRaw="2", JobID="2", Submit="2"), row(Submit="1")])
    source = SacctSource(runner=runner)
    jobs = source.jobs_between(1795000000, 1795003600)
    assert [j.job_id for j in jobs] == ["101", "2"]
    assert all("--allusers" in c for c in runner.calls)
    assert any(a.startswith("--starttime=") for a in runner.calls[0])
    source.jobs_between(0, 1, users=["sgtest1"])
    last = runner.accounting_calls[1]
    assert "--user=sgtest1" in last and "--allusers" not in last


def test_open_accounting_picks_backend() -> None:
    settings = parse_settings(
        {"accounting": {"sacct_path": "/usr/bin/sacct", "batch_size": 7}}, path=None
    )
    source = open_accounting(settings)
    assert isinstance(source, SacctSource)
    assert source.sacct_path == "/usr/bin/sacct" and source.batch_size == 7


def test_pyslurm_backend_without_pyslurm_is_a_clear_error() -> None:
    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("pyslurm is installed here")
    settings = parse_settings({"accounting": {"backend": "pyslurm"}}, path=None)
    source = open_accounting(settings)
    with pytest.raises(AccountingError) as info:
        source.get_jobs(["1"])
    assert info.value.hint and "sacct" in info.value.hint


def test_is_settled() -> None:
    jobs = SacctSource(
        runner=ReplayRunner(
            render(
                [
                    row(JobIDRaw="1", JobID="1"),
                    row(JobIDRaw="2", JobID="2", State="RUNNING", End="Unknown"),
                    row(JobIDRaw="3", JobID="3", ReqTRES="", AllocTRES=""),
                    row(
                        JobIDRaw="4",
                        JobID="4",
                        State="CANCELLED by 0",
                        Start="Unknown",
                        AllocTRES="",
                    ),
                ]
            )
        )
    ).get_jobs(["1", "2", "3", "4"])
    assert [is_settled(jobs[i]) for i in "1234"] == [True, False, False, True]
