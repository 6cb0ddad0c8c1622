"""What ``sacct``'s failure says: the line that names the cause, and a hint for it.

Seen from outside with munged stopped on the test cluster: ``gpueff`` printed "sacct failed
(exit 1): sacct: error: If munged is up, restart with --num-threads=10" with the hint "run
the sacct command by hand": the first of sacct's six lines, a consequence, while the second
names the cause ("Munge encode failed: Failed to access …: No such file or directory (Did
you start munged?)").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.errors import AccountingError

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
#: sacct 22.05.8's stderr with munged stopped (test cluster, 2026-11-30).
MUNGED_DOWN = (DATA / "munged_down.stderr").read_text()
#: With slurmdbd stopped (munged up).
DBD_DOWN = (DATA / "slurmdbd_down.stderr").read_text()


class Failing:
    def __init__(self, stderr: str) -> None:
        self.stderr = stderr

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        return CommandResult(1, b"", self.stderr)


def _error(stderr: str) -> AccountingError:
    with pytest.raises(AccountingError) as got:
        SacctSource(runner=Failing(stderr)).get_jobs(["7"])
    return got.value


def test_munged_down_names_munge_and_says_what_to_do() -> None:
    err = _error(MUNGED_DOWN)
    assert err.message.startswith("sacct failed (exit 1): Munge encode failed: Failed to access")
    assert "(Did you start munged?)" in err.message
    assert err.hint is not None and "munged" in err.hint and "by hand" not in err.hint
    assert "sacct: error:" not in err.message  # the command's own prefix is not repeated
    assert "\n" not in err.message


def test_slurmdbd_down_keeps_its_hint() -> None:
    err = _error(DBD_DOWN)
    assert "Connection refused" in err.message
    assert err.hint is not None and "slurmdbd" in err.hint


def test_an_unknown_message_is_its_first_line() -> None:
    err = _error("sacct: error: something new\nsacct: error: and more\n")
    assert err.message == "sacct failed (exit 1): something new"
    assert err.hint == "run the sacct command by hand to see what is wrong"
