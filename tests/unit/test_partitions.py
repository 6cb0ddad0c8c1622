"""Exclusive partitions read from Slurm (``scontrol show partition --oneliner``) and merged into
``[analysis] exclusive_partitions`` by the collector, once per pass."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_gpu.accounting.partitions import (
    MAX_OUTPUT_BYTES,
    exclusive_partitions,
    parse_exclusive,
    scontrol_path_for,
)
from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.cli.collect_cmd import with_slurm_partitions
from slurm_gpu.config import Settings
from slurm_gpu.errors import AccountingError

#: Recorded on the local Slurm 22.05 test cluster (partitions gpu, debug, excl).
RECORDED = Path(__file__).resolve().parents[1] / "data" / "scontrol" / "partitions-22.05.txt"


class Replay:
    """A command runner that answers with one recorded result and remembers the calls."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        return self.result


def test_the_recorded_cluster_has_one_exclusive_partition() -> None:
    assert parse_exclusive(RECORDED.read_text()) == {"excl"}


def test_only_exclusive_counts_and_odd_names_are_ignored() -> None:
    text = "\n".join(
        [
            "PartitionName=shared OverSubscribe=FORCE:4 State=UP",
            "PartitionName=yes OverSubscribe=YES:4",
            "PartitionName=whole OverSubscribe=EXCLUSIVE ExclusiveUser=NO",
            "PartitionName=users OverSubscribe=NO ExclusiveUser=YES",
            "PartitionName=bad/name OverSubscribe=EXCLUSIVE",
            "garbage without fields",
            "",
        ]
    )
    assert parse_exclusive(text) == {"whole"}


def test_scontrol_is_asked_once_with_oneliner() -> None:
    run = Replay(CommandResult(0, RECORDED.read_bytes(), ""))
    assert exclusive_partitions("/opt/slurm/bin/scontrol", runner=run) == {"excl"}
    assert run.calls == [["/opt/slurm/bin/scontrol", "show", "partition", "--oneliner"]]


@pytest.mark.parametrize(
    "result",
    [
        CommandResult(1, b"", "slurm_load_partitions: Unable to contact slurm controller"),
        CommandResult(0, b"x" * (MAX_OUTPUT_BYTES + 1), ""),
    ],
)
def test_a_failing_or_runaway_scontrol_is_an_accounting_error(result: CommandResult) -> None:
    with pytest.raises(AccountingError) as err:
        exclusive_partitions(runner=Replay(result))
    assert err.value.hint


def test_scontrol_beside_an_absolute_sacct() -> None:
    assert scontrol_path_for("/opt/slurm/bin/sacct") == "/opt/slurm/bin/scontrol"
    assert scontrol_path_for("sacct") == "scontrol"


def _settings(**analysis: object) -> Settings:
    s = Settings()
    return dataclasses.replace(s, analysis=dataclasses.replace(s.analysis, **analysis))


def test_the_collector_adds_slurms_exclusive_partitions_to_the_configured() -> None:
    run = Replay(CommandResult(0, RECORDED.read_bytes(), ""))
    merged = with_slurm_partitions(_settings(exclusive_partitions=("big",)), runner=run)
    assert merged.analysis.exclusive_partitions == ("big", "excl")
    assert len(run.calls) == 1


def test_turned_off_scontrol_is_not_run() -> None:
    run = Replay(CommandResult(0, RECORDED.read_bytes(), ""))
    s = _settings(exclusive_partitions_from_slurm=False)
    assert with_slurm_partitions(s, runner=run) is s
    assert run.calls == []


def test_when_scontrol_fails_the_configured_list_stands(caplog: pytest.LogCaptureFixture) -> None:
    run = Replay(CommandResult(1, b"", "Unable to contact slurm controller"))
    s = _settings(exclusive_partitions=("big",))
    with caplog.at_level(logging.WARNING, logger="slurm_gpu.collector"):
        assert with_slurm_partitions(s, runner=run) is s
    assert "exclusive partitions not read from Slurm" in caplog.text
