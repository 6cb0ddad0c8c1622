"""The command-runner seam: how the accounting adapters run ``sacct`` and ``sacctmgr``.

Tests inject a runner that replays recorded output; production uses ``SubprocessRunner``.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import tempfile
import time
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
    ``max_stdout``: read at most this many bytes of standard output and stop the command
    there (output a user wrote, such as a batch script); ``None``: read it all.
    """

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        max_stdout: int | None = None,
    ) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands with ``subprocess``, adding ``env`` to the current environment."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        max_stdout: int | None = None,
    ) -> CommandResult:
        full_env = {**os.environ, **env}
        if max_stdout is not None:
            return _bounded(list(argv), full_env, timeout_s, max_stdout)
        try:
            done = subprocess.run(
                list(argv),
                env=full_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except OSError as exc:
            raise _not_started(argv[0], exc) from None
        except subprocess.TimeoutExpired as exc:
            stderr = (exc.stderr or b"").decode("utf-8", "replace")
            raise _timed_out(argv[0], timeout_s, stderr) from None
        return CommandResult(
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr.decode("utf-8", "replace"),
        )


def _not_started(command: str, exc: OSError) -> AccountingError | OSError:
    """The error for a command that could not be started: missing or not executable; any
    other ``OSError`` is returned as it is."""
    if isinstance(exc, FileNotFoundError):
        return AccountingError(
            f"{command}: command not found",
            hint="install the Slurm client commands or set accounting.sacct_path "
            "to the absolute path of sacct",
        )
    if isinstance(exc, PermissionError):
        return AccountingError(f"{command}: permission denied", hint="check the path and its mode")
    return exc


def _timed_out(command: str, timeout_s: float, stderr: str) -> AccountingError:
    """The error for a command that ran past ``timeout_s``."""
    return AccountingError(
        f"{command} did not answer within {timeout_s:g} s",
        stderr=stderr,
        hint="slurmdbd may be overloaded or down; raise accounting.timeout_s "
        "or lower accounting.batch_size",
    )


def _bounded(argv: list[str], env: dict[str, str], timeout_s: float, limit: int) -> CommandResult:
    """Run ``argv``, reading at most ``limit`` bytes of its output; past that the command is
    killed and what was read is returned with exit 0 (the caller reads only the head). Its
    standard error goes to a temporary file, so neither pipe can fill and stall it."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        except OSError as exc:
            raise _not_started(argv[0], exc) from None
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        chunks: list[bytes] = []
        size = 0
        cut = False
        with proc:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        proc.kill()
                        raise _timed_out(argv[0], timeout_s, "")
                    if not sel.select(left):
                        continue
                    data = os.read(proc.stdout.fileno(), 65536)
                    if not data:
                        break
                    chunks.append(data[: limit - size])
                    size += len(chunks[-1])
                    if size >= limit:
                        cut = True
                        proc.kill()
                        break
            code = proc.wait()
        err.seek(0)
        stderr = err.read(65536).decode("utf-8", "replace")
    return CommandResult(returncode=0 if cut else code, stdout=b"".join(chunks), stderr=stderr)
