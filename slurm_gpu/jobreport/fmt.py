"""Small formatters shared by the terminal and e-mail renderers.

Each takes ``None`` for "not known" and returns ``n/a`` for it, never a misleading zero.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_gpu.analysis.energy import energy_text

NA = "n/a"
_SPARK = "▁▂▃▄▅▆▇█"


def duration(seconds: float | None) -> str:
    """``1-02:03:04`` / ``02:03:04`` / ``03:04`` like Slurm prints elapsed times."""
    if seconds is None:
        return NA
    s = round(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{hours:02d}:{minutes:02d}:{s:02d}"


def size(n_bytes: float | None) -> str:
    """Bytes in binary units with three significant digits (``12.3 GiB``)."""
    if n_bytes is None:
        return NA
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    return NA  # pragma: no cover - loop always returns


def pct(value: float | None, digits: int = 0) -> str:
    """``42 %``; ``n/a`` for unknown."""
    if value is None:
        return NA
    return f"{value:.{digits}f} %"


def watts(value: float | None) -> str:
    """``250 W``."""
    return NA if value is None else f"{value:.0f} W"


#: Joules per energy unit.
_ENERGY_UNITS = {"J": 1.0, "Wh": 3600.0, "kWh": 3.6e6}


def energy_unit(values: Iterable[float | None], *, total: bool = False) -> str:
    """The one unit for a column of energies, joules: the unit of its largest value (``kWh``
    from 1 kWh, ``Wh`` from 1 Wh, else ``J``), so that a column never mixes units. A
    ``total`` is never in joules (a job's energy reads as ``0.895 Wh``, not ``3223 J``)."""
    top = max((abs(v) for v in values if v is not None), default=0.0)
    if top >= _ENERGY_UNITS["kWh"]:
        return "kWh"
    if top >= _ENERGY_UNITS["Wh"] or total:
        return "Wh"
    return "J"


def _three_digits(value: float) -> str:
    """Three significant digits in fixed point (``0.611``, ``3.87``, ``45.6``, ``2200``)."""
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value else "0"


def energy_total(joules: float | None) -> str:
    """A job's (or a group's) total energy in ``Wh`` or ``kWh``."""
    if joules is None:
        return NA
    return energy(joules, energy_unit([joules], total=True))


def energy(joules: float | None, unit: str | None = None) -> str:
    """Energy in ``unit`` (``J``, ``Wh``, ``kWh``: the column's, from ``energy_unit``), or
    without one in the largest unit that reads well (``1.23 kWh``, ``45.6 Wh``), as every
    report writes it (``analysis.energy.energy_text``)."""
    if joules is None:
        return NA
    if unit in _ENERGY_UNITS:
        value = joules / _ENERGY_UNITS[unit]
        if 0 < value < 0.001:
            return f"< 0.001 {unit}"  # as ``energy_text``: three decimals would print 0.000
        return f"{_three_digits(value)} {unit}"
    # The one form every report uses alone (``analysis.energy.energy_text``).
    return energy_text(joules)


def hours(value: float | None) -> str:
    """GPU-hours with sensible precision."""
    if value is None:
        return NA
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def bar(value_pct: float | None, width: int = 20) -> str:
    """A text bar ``[#######.............]``; unknown is drawn as ``[  n/a  ]`` blanks."""
    if value_pct is None:
        return "[" + NA.center(width) + "]"
    filled = max(0, min(width, round(value_pct / 100.0 * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def sparkline(values: tuple[float | None, ...] | list[float | None]) -> str:
    """Unicode block sparkline of percentages (0–100); a gap is a space."""
    out = []
    for v in values:
        if v is None:
            out.append(" ")
            continue
        idx = int(max(0.0, min(100.0, v)) / 100.0 * (len(_SPARK) - 1) + 0.5)
        out.append(_SPARK[idx])
    return "".join(out)


def clean(text: object) -> str:
    """A user-controlled string made safe for a terminal: control characters become ``?``.

    Job names and comments are chosen by users; an escape sequence in one must not recolour
    or rewrite another user's terminal.
    """
    return "".join("?" if (ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0) else ch for ch in str(text))


def live_action(a: object) -> str:
    """One action of the live policy in words (``model.LiveActionView``), e.g.
    ``warned after 01:30:00: 1 GPU never used, 1.50 idle GPU-hours so far``."""
    gpus = int(getattr(a, "gpus", 0))
    rule = str(getattr(a, "rule", ""))
    what = "never used" if rule == "never_used" else "idle"
    when = getattr(a, "after_start_s", None)
    text = f"{getattr(a, 'action', '')}{'' if when is None else ' after ' + duration(when)}: "
    text += f"{gpus} GPU{'' if gpus == 1 else 's'} {what}, "
    text += f"{hours(getattr(a, 'idle_gpu_hours', None))} idle GPU-hours so far"
    if getattr(a, "action", "") == "cancelled":
        stopped = getattr(a, "stopped_gpu_hours", None)
        text += (
            f"; at most {hours(stopped)} GPU-hours stopped from being wasted"
            if stopped is not None
            else "; GPU-hours stopped from being wasted not known (no time limit)"
        )
    return text
