"""Settings of what a job's energy costs: the site's price and carbon intensity per kWh."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_gpu.config.fields import setting

_HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
_MONTHS = {str(m) for m in range(1, 13)}


def hour_table_error(value: Any) -> str | None:
    """Why ``value`` is not a time-of-day table (``{"07:00" = 0.30, "22:00" = 0.20}``: each
    rate holds from its local time until the next entry, the last one wraps past midnight),
    or ``None`` when it is one."""
    if not isinstance(value, Mapping):
        return "must be a table"
    for key, rate in value.items():
        if not isinstance(key, str) or not _HHMM.match(key):
            return f"key {key!r} is not a time of day HH:MM (00:00-23:59)"
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
            return f"the rate at {key} must be a number at least 0, not {rate!r}"
    return None


def month_table_error(value: Any) -> str | None:
    """Why ``value`` is not a monthly table (``{"1" = 410.0, "7" = 290.0}``: months 1-12; a
    month not named takes the flat value), or ``None`` when it is one."""
    if not isinstance(value, Mapping):
        return "must be a table"
    for key, rate in value.items():
        if key not in _MONTHS:
            return f"key {key!r} is not a month number 1-12"
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
            return f"the rate of month {key} must be a number at least 0, not {rate!r}"
    return None


def timezone_error(value: Any) -> str | None:
    """Why ``value`` is not an IANA time zone name, or ``None``."""
    import zoneinfo  # here: datetime and zoneinfo cost gpueff's fast path 2.6 ms at start-up

    try:
        zoneinfo.ZoneInfo(str(value))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"{value!r} is not a time zone this host knows (IANA name, e.g. Europe/Berlin)"
    return None


@dataclass(frozen=True)
class EnergySettings:
    """What a job's GPU energy costs in money and CO2 (``docs/report.md``, "Energy").

    A rate at a moment is the time-of-day table's when one is set, else the monthly table's
    entry for that month when there is one, else the flat value; a job's energy is spread
    evenly over its run to weigh the rates."""

    price_per_kwh: float = setting(
        0.0, "Price of one kWh in `currency`; 0 with no price table: no cost shown.", min=0
    )
    currency: str = setting("EUR", "Currency of the prices, as shown after the amounts.")
    co2_g_per_kwh: float = setting(
        0.0, "Grams of CO2 emitted per kWh; 0 with no CO2 table: no CO2 shown.", min=0
    )
    price_by_hour: Mapping[str, float] = setting(
        {},
        "Time-of-day prices: local start time HH:MM -> price per kWh until the next entry; "
        "empty: none.",
        check=hour_table_error,
    )
    price_by_month: Mapping[str, float] = setting(
        {}, "Monthly prices: month 1-12 -> price per kWh; empty: none.", check=month_table_error
    )
    co2_by_hour: Mapping[str, float] = setting(
        {},
        "Time-of-day carbon intensity: local start time HH:MM -> grams CO2 per kWh; empty: none.",
        check=hour_table_error,
    )
    co2_by_month: Mapping[str, float] = setting(
        {},
        "Monthly carbon intensity: month 1-12 -> grams CO2 per kWh; empty: none.",
        check=month_table_error,
    )
    timezone: str = setting(
        "UTC",
        "Time zone of the tables' times of day and months (IANA name).",
        check=timezone_error,
    )

    @property
    def has_price(self) -> bool:
        """Whether a cost can be shown."""
        return self.price_per_kwh > 0 or bool(self.price_by_hour) or bool(self.price_by_month)

    @property
    def has_co2(self) -> bool:
        """Whether CO2 can be shown."""
        return self.co2_g_per_kwh > 0 or bool(self.co2_by_hour) or bool(self.co2_by_month)
