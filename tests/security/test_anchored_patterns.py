"""Patterns that decide what privileged code accepts must match the whole string.

Python's ``$`` also matches before a final newline, so ``re.match(r"^[0-9]+$", "42\\n")``
succeeds: a job id, host name or recipient with a trailing newline once passed checks that
guard spool paths, log lines, accounting framing and the mail program's argv. Every such
check now uses ``fullmatch`` (and the recipient check refuses every control character).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.capture import spoolpaths
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.hooks.common import check_sluid
from slurm_gpu.notify.slurmcall import job_environment, valid_recipient

TRAILING = ["\n", "\r", "\x00", "\t", "\x1b", "\x85"]


@pytest.mark.parametrize("tail", TRAILING)
def test_recipient_with_a_trailing_control_character_is_refused(tail: str) -> None:
    assert valid_recipient("user1")
    assert not valid_recipient("user1" + tail)
    assert not valid_recipient("user1" + tail + ",user2")
    assert not valid_recipient("user1,user2" + tail)


def test_slurm_variable_name_with_a_trailing_newline_is_dropped() -> None:
    kept = job_environment({"SLURM_JOB_ID": "1", "SLURM_JOB_ID\n": "2"})
    assert kept["SLURM_JOB_ID"] == "1"
    assert "SLURM_JOB_ID\n" not in kept


def test_job_id_with_a_trailing_newline_is_not_a_spool_name() -> None:
    assert spoolpaths.check_job_id("42") == "42"
    with pytest.raises(SpoolFormatError):
        spoolpaths.check_job_id("42\n")
    with pytest.raises(SpoolFormatError):
        spoolpaths.check_hostname("node1\n")


def test_sluid_with_a_trailing_newline_is_refused() -> None:
    assert check_sluid("sBR1JB8J1YM400") == "sBR1JB8J1YM400"
    assert check_sluid("sBR1JB8J1YM400\n") is None


def test_a_job_id_with_a_trailing_newline_never_reaches_a_promql_query() -> None:
    from slurm_gpu.prometheus.livejobs import job_queries

    with pytest.raises(ValueError):
        job_queries("123\n")
    assert 'job_id="123"' in job_queries("123")[0]


def test_a_live_summary_directory_with_a_trailing_newline_is_not_a_job(tmp_path: Path) -> None:
    """``<spool>-live/123\\n/`` is not job 123's: the node exposes nothing of it."""
    from slurm_gpu.live.snapshot import read_node

    live = tmp_path / "spool-live"
    (live / "123\n").mkdir(parents=True)
    (live / "123\n" / "node1.json").write_text("{}")
    snap = read_node(str(tmp_path / "spool"), now_s=0.0, stale_after_s=60.0)
    assert snap.jobs == () and snap.unreadable == 0
