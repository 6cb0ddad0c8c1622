"""Slurm host-list expressions: ``gpu[01-03,07],login1`` -> ``gpu01 gpu02 gpu03 gpu07 login1``.

Zero padding is kept (``[01-03]`` gives ``01``); several bracket groups in one name expand as a
product (``r[1-2]n[1-2]`` gives four names). Slurm's "no node" spellings (``None assigned``,
``(null)``, the empty string) expand to nothing.
"""

from __future__ import annotations

import itertools

from slurm_gpu.errors import AccountingError

_EMPTY = frozenset({"", "None assigned", "(null)", "None", "Unknown"})
#: A list naming more hosts than this is refused: a typo such as ``n[1-99999999]`` must not
#: exhaust memory.
MAX_HOSTS = 1_000_000


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm host list into host names, in order, duplicates kept.

    Raises ``AccountingError`` for an unbalanced bracket or a bad range.
    """
    expr = expr.strip()
    if expr in _EMPTY:
        return ()
    out: list[str] = []
    for item in _split_top_level(expr):
        out.extend(_expand_one(item, expr))
        if len(out) > MAX_HOSTS:
            raise AccountingError(f"host list {expr!r} names more than {MAX_HOSTS} hosts")
    return tuple(out)


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise AccountingError(f"nested brackets in host list {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise AccountingError(f"unbalanced ']' in host list {expr!r}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise AccountingError(f"unbalanced '[' in host list {expr!r}")
    items.append(expr[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    """Expand one name that may hold several ``[...]`` groups."""
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
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for rng in body.split(","):
        rng = rng.strip()
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise AccountingError(f"bad range {rng!r} in host list {whole!r}")
        if not sep:
            values.append(lo)
            continue
        start, end = int(lo), int(hi)
        if end < start:
            raise AccountingError(f"descending range {rng!r} in host list {whole!r}")
        if end - start > MAX_HOSTS:
            raise AccountingError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
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
        if (
            not lo.isdigit()
            or (sep and not hi.isdigit())
            or (step_text and not step_text.isdigit())
        ):
            raise AccountingError(f"bad array range {rng!r}")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise AccountingError(f"bad array step in {rng!r}")
        end = int(hi) if sep else int(lo)
        if end - int(lo) > MAX_HOSTS:
            raise AccountingError(f"array range {rng!r} is too large")
        out.extend(range(int(lo), end + 1, step))
    return out
