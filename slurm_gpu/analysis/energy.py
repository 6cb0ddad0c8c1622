"""A job's GPU energy in kWh, what it cost, the CO2 it emitted, and the part spent idle.

Pure: numbers in, numbers out. Every place that shows a job's energy (``gpueff``, the web
page, the e-mail, the weekly report) computes it here, so that they agree to the digit.

- **Energy** is the sum of the job's GPUs' energy counters (the integral of their power where
  a GPU has no counter), joules, shown in kWh. Sources give no node (host) power today, so
  the figures are the GPUs' alone.
- **Idle energy** is each GPU's energy times its idle share as the idle GPU-hours count it
  (``metrics.wasted_gpu_hours``): all of it for an unused GPU (mean duty cycle at or below
  ``[analysis] unused_max_duty_pct``), else its share of idle readings. An idle GPU draws less
  than a busy one, so for a GPU that was partly busy this is an upper bound.
- **Cost and CO2** weigh the energy by the ``[energy]`` rates in force while the job ran,
  the energy spread evenly over the run (the stored record keeps the job's total, not when
  each joule was spent): a job of 10 h of which 5 h fell on a 0.30 rate and 5 h on 0.20 pays
  0.25 per kWh.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_gpu.config import EnergySettings

#: Joules in one kilowatt-hour.
JOULES_PER_KWH = 3.6e6

#: Most rate segments one job is cut into (a year of a 24-entry daily table is 8,760).
_MAX_SEGMENTS = 20_000


@dataclass(frozen=True, slots=True)
class GpuEnergy:
    """What one GPU contributes: its energy and how idle it was."""

    energy_j: float | None
    """Energy over the job, joules; ``None`` when the GPU reported none."""
    duty_mean_pct: float | None
    """Mean duty cycle, percent; ``None`` when never read."""
    idle_fraction: float | None
    """Share of its readings at or below the idle threshold, 0-1; ``None`` when unknown."""


@dataclass(frozen=True, slots=True)
class JobEnergy:
    """A job's energy, cost and CO2."""

    kwh: float
    """GPU energy, kWh."""
    idle_kwh: float | None
    """Part of ``kwh`` spent while GPUs idled (see the module); ``None`` when no GPU with
    energy had its duty cycle read."""
    cost: float | None
    """``kwh`` × the mean price over the run, in ``currency``; ``None`` without a price."""
    currency: str
    co2_kg: float | None
    """``kwh`` × the mean carbon intensity over the run, kilograms; ``None`` without one."""

    @property
    def idle_share(self) -> float | None:
        """``idle_kwh / kwh``, 0-1; ``None`` when unknown or no energy."""
        if self.idle_kwh is None or self.kwh <= 0:
            return None
        return self.idle_kwh / self.kwh


def _minutes(key: str) -> int:
    hours, minutes = key.split(":")
    return int(hours) * 60 + int(minutes)


def _local(t_s: float, zone: dt.tzinfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(t_s, zone)


def _at(day: dt.date, minute: int, zone: dt.tzinfo) -> float:
    """Epoch seconds of ``minute`` past local midnight of ``day``."""
    naive = dt.datetime.combine(day, dt.time()) + dt.timedelta(minutes=minute)
    return naive.replace(tzinfo=zone).timestamp()


def _hour_rate(t_s: float, table: Mapping[str, float], zone: dt.tzinfo) -> tuple[float, float]:
    """(rate at ``t_s``, epoch seconds of the table's next change after it)."""
    starts = sorted((_minutes(k), float(v)) for k, v in table.items())
    minutes = [m for m, _ in starts]
    local = _local(t_s, zone)
    now = local.hour * 60 + local.minute + local.second / 60.0
    i = bisect.bisect_right(minutes, now) - 1
    rate = starts[i][1]  # i == -1: before the first entry, the last one (wraps midnight)
    day = local.date()
    if i + 1 < len(starts):
        nxt = _at(day, starts[i + 1][0], zone)
    else:
        nxt = _at(day + dt.timedelta(days=1), starts[0][0], zone)
    return rate, nxt


def _month_rate(
    t_s: float, table: Mapping[str, float], flat: float, zone: dt.tzinfo
) -> tuple[float, float]:
    local = _local(t_s, zone)
    rate = float(table.get(str(local.month), flat))
    year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return rate, _at(dt.date(year, month, 1), 0, zone)


def mean_rate(
    start_s: float | None,
    end_s: float | None,
    flat: float,
    by_hour: Mapping[str, float],
    by_month: Mapping[str, float],
    timezone: str = "UTC",
) -> float:
    """The time-weighted mean of a rate over ``[start_s, end_s]`` (epoch seconds): the
    time-of-day table when set, else the monthly table (a month not in it: ``flat``), else
    ``flat``. Without a known span, the rate at ``start_s`` (or ``flat`` with no start)."""
    if not by_hour and not by_month:
        return flat
    if start_s is None:
        return flat
    import zoneinfo  # only for a table by time: about 5 ms of every gpueff's start otherwise

    zone = zoneinfo.ZoneInfo(timezone)

    def rate_and_next(t: float) -> tuple[float, float]:
        if by_hour:
            return _hour_rate(t, by_hour, zone)
        return _month_rate(t, by_month, flat, zone)

    end = start_s if end_s is None else max(end_s, start_s)
    if end <= start_s:
        return rate_and_next(start_s)[0]
    total = 0.0
    t = start_s
    for _ in range(_MAX_SEGMENTS):
        rate, nxt = rate_and_next(t)
        # A clock change can put the next local boundary at or before t: step a minute.
        upto = min(end, nxt if nxt > t else t + 60.0)
        total += rate * (upto - t)
        t = upto
        if t >= end:
            break
    else:  # longer than _MAX_SEGMENTS changes: the rest at the last rate
        total += rate_and_next(t)[0] * (end - t)
    return total / (end - start_s)


def idle_energy_j(gpu: GpuEnergy, unused_max_duty_pct: float) -> float | None:
    """The part of one GPU's energy spent idle (see the module), joules; ``None`` when its
    energy or duty cycle is unknown."""
    if gpu.energy_j is None or gpu.duty_mean_pct is None:
        return None
    if gpu.duty_mean_pct <= unused_max_duty_pct:
        return gpu.energy_j
    return gpu.energy_j * (gpu.idle_fraction or 0.0)


def job_energy(
    gpus: Iterable[GpuEnergy],
    *,
    start_s: float | None,
    end_s: float | None,
    settings: EnergySettings,
    unused_max_duty_pct: float,
) -> JobEnergy | None:
    """A job's energy, cost and CO2 from its GPUs; ``None`` when no GPU reported energy."""
    gpus = list(gpus)
    energies = [g.energy_j for g in gpus if g.energy_j is not None]
    if not energies:
        return None
    kwh = sum(energies) / JOULES_PER_KWH
    idle = [x for x in (idle_energy_j(g, unused_max_duty_pct) for g in gpus) if x is not None]
    s = settings
    price = None
    if s.has_price:
        price = mean_rate(
            start_s, end_s, s.price_per_kwh, s.price_by_hour, s.price_by_month, s.timezone
        )
    co2 = None
    if s.has_co2:
        co2 = mean_rate(start_s, end_s, s.co2_g_per_kwh, s.co2_by_hour, s.co2_by_month, s.timezone)
    return JobEnergy(
        kwh=kwh,
        idle_kwh=sum(idle) / JOULES_PER_KWH if idle else None,
        cost=None if price is None else kwh * price,
        currency=s.currency,
        co2_kg=None if co2 is None else kwh * co2 / 1000.0,
    )


# ------------------------------------------------------------------ one way to write them


def energy_text(joules: float | None) -> str:
    """Energy as every report writes it: three significant digits in kWh from 1 kWh up (whole
    kWh from 1,000), else in Wh (``1.23 kWh``, ``45.6 Wh``, ``0.895 Wh``: a total is never in
    joules); ``n/a`` unknown."""
    if joules is None:
        return "n/a"
    wh = joules / 3600.0
    if wh >= 1_000_000:
        return f"{wh / 1000:.0f} kWh"
    if wh >= 1000:
        return f"{wh / 1000:.3g} kWh"
    if 0 < wh < 0.001:
        return "< 0.001 Wh"  # fixed point: "%.3g" would print 1 J as "0.000278" and less as 1e-05
    return f"{wh:.3g} Wh"


def kwh_text(kwh: float | None) -> str:
    """``energy_text`` of an energy in kWh."""
    return energy_text(None if kwh is None else kwh * JOULES_PER_KWH)


def co2_text(kg: float | None) -> str:
    """CO2 with three significant digits: ``1.23 kg CO2`` from 1 kg (whole kg from 1,000),
    else ``456 g CO2``."""
    if kg is None:
        return "n/a"
    if kg >= 1000:
        return f"{kg:.0f} kg CO2"
    if kg >= 1:
        return f"{kg:.3g} kg CO2"
    return f"{kg * 1000.0:.3g} g CO2"


def cost_text(amount: float | None, currency: str) -> str:
    """Money to the cent (``12.34 EUR``); below a cent ``< 0.01 EUR``."""
    if amount is None:
        return "n/a"
    if 0 < amount < 0.005:
        return f"< 0.01 {currency}"
    return f"{amount:.2f} {currency}"


def summary_text(energy: JobEnergy | None) -> str:
    """One line: ``1.23 kWh (40 % while GPUs idled), 456 g CO2, 0.37 EUR``; parts not known
    are left out; ``n/a`` without energy."""
    if energy is None:
        return "n/a"
    parts = [kwh_text(energy.kwh)]
    share = energy.idle_share
    if share is not None:
        parts[0] += f" ({100.0 * share:.0f} % while GPUs idled)"
    if energy.co2_kg is not None:
        parts.append(co2_text(energy.co2_kg))
    if energy.cost is not None:
        parts.append(cost_text(energy.cost, energy.currency))
    return ", ".join(parts)
