"""``--since`` and ``--until``: one meaning in every command.

Each takes a time before now (``30m``, ``12h``, ``3d``, ``2w``) or a date (``2026-11-01``,
``2026-11-01T08:00``, ``2026-11-01 08:00:00``, with or without a UTC offset). A date without
an offset is in the command's zone: local time for ``gpueff`` (what its users read on their
clocks), UTC for the admin commands (``report weekly``, ``store export``), whose periods are
days in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from slurm_gpu.errors import UsageError

#: Seconds per unit of a relative time.
UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

#: The forms, for help texts and hints.
FORMS = "3d, 12h, 30m, 2w (before now) or YYYY-MM-DD[THH:MM[:SS]]"


def parse_when(text: str, *, now_s: float, utc: bool, option: str = "--since") -> float:
    """``text`` as seconds since the epoch; raises ``UsageError`` (exit 2) with a hint."""
    value = text.strip()
    if value[:-1].isdigit() and value[-1:] in UNITS:
        return now_s - int(value[:-1]) * UNITS[value[-1]]
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"{option} {text!r} is not a date or a time before now", hint=f"use {FORMS}"
        ) from None
    if when.tzinfo is None and utc:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def deprecated(old: str, new: str) -> str:
    """The one line said on standard error when an old spelling is used."""
    return f"slurm-gpu: {old} is deprecated; use {new}"
