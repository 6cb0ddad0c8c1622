"""The command-runner seam: how the accounting adapters run ``sacct`` and ``sacctmgr``.

Tests inject a runner that replays recorded output; production uses ``SubprocessRunner``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_gpu.errors import AccountingError


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command left behind. ``stdout`` stays bytes: sacct prints whatever bytes a
    user put into a job name, and decoding is the parser's business."""

    returncode: int
    stdout: bytes
    stderr: str


class CommandRunner(Protocol):
    """Runs one command to completion.

    Raises ``AccountingError`` when the command cannot be started (missing binary,
    permission) or runs past ``timeout_s``; a non-zero exit is returned, not raised.
    """

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands with ``subprocess``, adding ``env`` to the current environment."""

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        full_env = {**os.environ, **env}
        try:
            done = subprocess.run(
                list(argv),
                env=full_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise AccountingError(
                f"{argv[0]}: command not found",
                hint="install the Slurm client commands or set accounting.sacct_path "
                "to the absolute path of sacct",
            ) from None
        except PermissionError:
            raise AccountingError(
                f"{argv[0]}: permission denied", hint="check the path and its mode"
            ) from None
        except subprocess.TimeoutExpired as exc:
            stderr = (exc.stderr or b"").decode("utf-8", "replace")
            raise AccountingError(
                f"{argv[0]} did not answer within {timeout_s:g} s",
                stderr=stderr,
                hint="slurmdbd may be overloaded or down; raise accounting.timeout_s "
                "or lower accounting.batch_size",
            ) from None
        return CommandResult(
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr.decode("utf-8", "replace"),
        )
