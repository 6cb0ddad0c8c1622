"""gpueff asks sacct without QOS (not in the report; naming it costs a slurmdbd table request):
``SacctSource(omit=...)`` leaves fields out of the query and parses what was asked."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from sacct_fixtures import render, row

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import DELIM, FIELDS, TEXT_FIELDS, SacctSource, fields_without
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport.readers import LazyAccounting
from slurm_gpu.textsafe import clean_user_text


class FormatRunner:
    """Answers with ``rows`` rendered in exactly the ``--format`` fields of the call."""

    def __init__(self, rows: Sequence[Mapping[str, str]]) -> None:
        self.rows = rows
        self.formats: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        fmt = next(a for a in argv if a.startswith("--format=")).removeprefix("--format=")
        fields = fmt.split(",")
        self.formats.append(fields)
        delim = next(a for a in argv if a.startswith("--delimiter=")).split("=", 1)[1]
        text = "".join(delim.join(r[f] for f in fields) + "\n" for r in self.rows)
        return CommandResult(returncode=0, stdout=text.encode(), stderr="")


def test_omitting_qos_asks_without_it_and_parses_the_rest_identically() -> None:
    rows = [row(), row(JobIDRaw="102", JobID="102", JobName=f"a{DELIM}b", QOS="high")]
    full = SacctSource(runner=FormatRunner(rows)).get_jobs(["101", "102"])
    runner = FormatRunner(rows)
    lean = SacctSource(runner=runner, omit=("QOS",)).get_jobs(["101", "102"])
    assert runner.formats == [[f for f in FIELDS if f != "QOS"], list(TEXT_FIELDS)]
    assert full["102"].qos == "high" and full["102"].job_name == clean_user_text(f"a{DELIM}b")
    assert {k: dataclasses.replace(j, qos=None) for k, j in full.items()} == lean


def test_listings_omit_it_too() -> None:
    runner = FormatRunner([row()])
    (job,) = SacctSource(runner=runner, omit=("QOS",)).jobs_between(0.0, 2e9, ["sgtest1"])
    assert "QOS" not in runner.formats[0] and job.qos is None and job.user == "sgtest1"


def test_output_in_other_fields_than_asked_is_skipped_not_misread() -> None:
    # Output with QOS still in it, read as the lean field list: one field too many. It must
    # not shift into the wrong columns (QOS read as AllocCPUS, and so on): it is skipped.
    full_output = render([row()]).encode()
    source = SacctSource(runner=lambda *a, **k: CommandResult(0, full_output, ""), omit=("QOS",))
    assert source.get_jobs(["101"]) == {}
    assert source.last_skipped == 1


def test_only_omittable_fields_can_be_left_out() -> None:
    with pytest.raises(ValueError, match="AllocTRES"):
        fields_without(["AllocTRES"])
    with pytest.raises(ValueError):
        SacctSource(omit=("JobIDRaw",))
    assert fields_without() == FIELDS


def test_gpueffs_accounting_runs_sacct_without_qos(tmp_path: Path) -> None:
    argv_file = tmp_path / "argv"
    sacct = tmp_path / "sacct"
    # One file per call: gpueff runs the accounting and the text query at once.
    sacct.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(argv_file))}.$$\n')
    sacct.chmod(0o755)
    settings = parse_settings({"accounting": {"sacct_path": str(sacct)}}, path=None)
    assert LazyAccounting(settings).get_jobs(["101"]) == {}
    calls = [p.read_text().splitlines() for p in tmp_path.glob("argv.*")]
    (accounting,) = [c for c in calls if "--allocations" not in c]
    fmt = next(a for a in accounting if a.startswith("--format="))
    assert fmt.removeprefix("--format=").split(",") == [f for f in FIELDS if f != "QOS"]
