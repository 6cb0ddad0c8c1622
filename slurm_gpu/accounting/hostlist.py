"""Slurm host-list expressions: ``gpu[01-03,07],login1`` -> ``gpu01 gpu02 gpu03 gpu07 login1``.

Zero padding is kept (``[01-03]`` gives ``01``); several bracket groups in one name expand as a
product (``r[1-2]n[1-2]`` gives four names). Slurm's "no node" spellings (``None assigned``,
``(null)``, the empty string) expand to nothing.

Expansion is bounded: the number of names a list would give is counted from the ranges before
any name is built, so ``n[0-9999][0-9999]`` (10^8 names) is refused in microseconds instead of
exhausting memory.
"""

from __future__ import annotations

import itertools

from slurm_gpu.errors import AccountingError

_EMPTY = frozenset({"", "None assigned", "(null)", "None", "Unknown"})
#: A host list naming more hosts than this is refused (``AccountingError``). The largest Slurm
#: clusters have some tens of thousands of nodes; a list beyond this is a typo or an attack and
#: must not exhaust the collector's memory.
MAX_HOSTS = 65_536
#: An array-task range body expanding to more task ids than this is refused.
MAX_ARRAY_TASKS = 1_000_000


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm host list into host names, in order, duplicates kept.

    Raises ``AccountingError`` for an unbalanced bracket or a bad range.
    """
    expr = expr.strip()
    if expr in _EMPTY:
        return ()
    if "[" not in expr and "]" not in expr:
        # Plain names (a job on one node, most of them): what the general path gives them,
        # without its walk over every character.
        names = [name for item in expr.split(",") if (name := item.strip())]
        if len(names) > MAX_HOSTS:
            raise AccountingError(f"host list {_shown(expr)} names more than {MAX_HOSTS} hosts")
        return tuple(names)
    out: list[str] = []
    for item in _split_top_level(expr):
        parts = _parse_one(item, expr)
        count = 1
        for part in parts:
            count *= len(part)
            if len(out) + count > MAX_HOSTS:
                raise AccountingError(f"host list {_shown(expr)} names more than {MAX_HOSTS} hosts")
        out.extend("".join(combo) for combo in itertools.product(*parts))
    return tuple(out)


def _shown(expr: str) -> str:
    """``expr`` for an error message: quoted, at most 80 characters."""
    return repr(expr if len(expr) <= 80 else expr[:77] + "...")


def _digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts ``²``, which ``int`` refuses."""
    return text.isascii() and text.isdigit()


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise AccountingError(f"nested brackets in host list {_shown(expr)}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise AccountingError(f"unbalanced ']' in host list {_shown(expr)}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise AccountingError(f"unbalanced '[' in host list {_shown(expr)}")
    items.append(expr[start:])
    return [item.strip() for item in items if item.strip()]


def _parse_one(item: str, whole: str) -> list[list[str]]:
    """The pieces of one name that may hold several ``[...]`` groups: its names are the
    product of the pieces, which the caller counts before it builds them."""
    parts: list[list[str]] = []
    pos = 0
    while pos < len(item):
        open_at = item.find("[", pos)
        if open_at < 0:
            parts.append([item[pos:]])
            break
        close_at = item.index("]", open_at)
        if open_at > pos:
            parts.append([item[pos:open_at]])
        parts.append(_expand_ranges(item[open_at + 1 : close_at], whole))
        pos = close_at + 1
    return parts


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for rng in body.split(","):
        if len(values) > MAX_HOSTS:
            raise AccountingError(f"host list {_shown(whole)} names more than {MAX_HOSTS} hosts")
        rng = rng.strip()
        lo, sep, hi = rng.partition("-")
        if not _digits(lo) or (sep and not _digits(hi)):
            raise AccountingError(f"bad range {rng[:40]!r} in host list {_shown(whole)}")
        if not sep:
            values.append(lo)
            continue
        start, end = int(lo), int(hi)
        if end < start:
            raise AccountingError(f"descending range {rng[:40]!r} in host list {_shown(whole)}")
        if len(values) + end - start >= MAX_HOSTS:
            raise AccountingError(f"host list {_shown(whole)} names more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(start, end + 1))
    return values


def expand_id_ranges(body: str) -> list[int]:
    """Expand an array-task range body such as ``1-5,7,9-11:2%4`` into task ids.

    The ``%N`` throttle is dropped; ``:S`` steps are honoured. Raises ``AccountingError`` for a
    malformed body.
    """
    body = body.split("%", 1)[0]
    out: list[int] = []
    for rng in body.split(","):
        rng = rng.strip()
        if not rng:
            continue
        rng, _, step_text = rng.partition(":")
        lo, sep, hi = rng.partition("-")
        if not _digits(lo) or (sep and not _digits(hi)) or (step_text and not _digits(step_text)):
            raise AccountingError(f"bad array range {rng!r}")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise AccountingError(f"bad array step in {rng!r}")
        end = int(hi) if sep else int(lo)
        if len(out) + (end - int(lo)) // step >= MAX_ARRAY_TASKS:
            raise AccountingError(f"array range {rng[:40]!r} is too large")
        out.extend(range(int(lo), end + 1, step))
    return out
