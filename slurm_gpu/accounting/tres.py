"""Parsing of Slurm trackable-resource lists and memory sizes.

``cpu=8,mem=64G,node=1,billing=8,gres/gpu=2,gres/gpu:a100=2`` becomes a ``Tres``. Slurm's memory
suffixes are binary (``K`` = 1024 bytes); a bare number in a TRES ``mem=`` is mebibytes.
"""

from __future__ import annotations

import re

from slurm_gpu.errors import AccountingError
from slurm_gpu.records import Tres

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGTP]?)(?:i?B)?\s*([cn]?)\s*$", re.IGNORECASE)

#: Slurm's fixed TRES ids (``src/common/slurmdb_defs.h``: TRES_CPU=1 … TRES_BILLING=5). Ids of
#: gres, licenses and file systems are site-specific and cannot be named without the database.
TRES_IDS = {"1": "cpu", "2": "mem", "3": "energy", "4": "node", "5": "billing"}


def parse_mem(text: str, *, default_unit: str = "") -> tuple[int, str] | None:
    """Parse a Slurm memory size into ``(bytes, per)``.

    ``per`` is ``"c"`` (per CPU) or ``"n"`` (per node) for the ``4000Mc`` / ``4000Mn`` forms
    of older ``ReqMem``, else ``""``. ``default_unit`` applies to a number without a suffix
    (``"M"`` for TRES ``mem=`` and ``ReqMem``, ``""`` for MaxRSS, which sacct prints in bytes
    when below 1 KiB). Returns ``None`` for an empty or unparsable value.
    """
    match = _MEM_RE.match(text)
    if not match:
        return None
    number, unit, per = match.groups()
    unit = unit.upper() or default_unit.upper()
    return int(float(number) * _UNITS[unit]), per.lower()


def mem_bytes(text: str, *, default_unit: str = "") -> int | None:
    """Bytes of a memory size without a per-CPU/per-node suffix; ``None`` when unparsable."""
    parsed = parse_mem(text, default_unit=default_unit)
    return parsed[0] if parsed else None


def parse_tres(text: str | None) -> Tres:
    """Parse a TRES list. An empty or missing list gives an all-``None`` ``Tres``.

    Unknown entries (``energy``, ``fs/disk``, licenses) are kept only in ``raw``. Numeric TRES
    ids (as libslurm hands them out) are translated for the fixed ids Slurm defines.
    Raises ``AccountingError`` for an entry that is not ``name=value``.
    """
    raw = (text or "").strip()
    if raw in ("", "(null)"):
        return Tres(raw="")
    # Canonical order, so that equal lists compare equal whatever order the source used
    # (sacct 22.05 sorts by name, libslurm by TRES id).
    raw = ",".join(sorted(e.strip() for e in raw.split(",") if e.strip()))
    cpus = nodes = gpus = billing = mem = None
    typed: dict[str, int] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        if not sep:
            raise AccountingError(f"bad TRES entry {entry!r} in {raw!r}")
        name = TRES_IDS.get(name, name)
        if name == "mem":
            mem = mem_bytes(value, default_unit="M")
            continue
        count = _count(value)
        if name == "cpu":
            cpus = count
        elif name == "node":
            nodes = count
        elif name == "billing":
            billing = count
        elif name == "gres/gpu":
            gpus = count
        elif name.startswith("gres/gpu:") and count is not None:
            gpu_type = name.split(":", 1)[1]
            typed[gpu_type] = typed.get(gpu_type, 0) + count
    if gpus is None and typed:
        # Some sites track only typed GPUs (AccountingStorageTRES=gres/gpu:a100).
        gpus = sum(typed.values())
    return Tres(
        cpus=cpus,
        mem_bytes=mem,
        nodes=nodes,
        gpus=gpus,
        gpu_types=tuple(sorted(typed.items())),
        billing=billing,
        raw=raw,
    )


def _count(value: str) -> int | None:
    """A TRES count; ``None`` when not a whole number (Slurm writes ``18446744073709551614``
    for NO_VAL only in broken records, which we treat as unknown too)."""
    value = value.strip()
    if not value.isdigit():
        parsed = mem_bytes(value)  # counts such as ``billing=1K`` are rare but legal
        return parsed
    number = int(value)
    if number >= 2**63:
        return None
    return number
