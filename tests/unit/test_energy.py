"""Energy, cost and CO2 of a job (issue 30, point 3) against hand-computed values."""

from __future__ import annotations

import datetime as dt

import pytest

from slurm_gpu.analysis.energy import (
    JOULES_PER_KWH,
    GpuEnergy,
    co2_text,
    cost_text,
    energy_text,
    job_energy,
    kwh_text,
    mean_rate,
    summary_text,
)
from slurm_gpu.config import EnergySettings, parse_settings
from slurm_gpu.errors import ConfigError


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


def test_flat_rates_and_idle_share_by_hand() -> None:
    # GPU a: 1 kWh, busy half the time, a quarter of its readings idle -> 0.25 kWh idle.
    # GPU b: 0.5 kWh, mean duty 0.5 % (unused at the 1 % threshold) -> all 0.5 kWh idle.
    gpus = [
        GpuEnergy(energy_j=1.0 * JOULES_PER_KWH, duty_mean_pct=50.0, idle_fraction=0.25),
        GpuEnergy(energy_j=0.5 * JOULES_PER_KWH, duty_mean_pct=0.5, idle_fraction=0.9),
    ]
    e = job_energy(
        gpus,
        start_s=utc(2026, 11, 2, 8),
        end_s=utc(2026, 11, 2, 10),
        settings=EnergySettings(price_per_kwh=0.30, co2_g_per_kwh=400.0, currency="CHF"),
        unused_max_duty_pct=1.0,
    )
    assert e is not None
    assert e.kwh == pytest.approx(1.5)
    assert e.idle_kwh == pytest.approx(0.75)
    assert e.idle_share == pytest.approx(0.5)
    assert e.cost == pytest.approx(0.45)  # 1.5 kWh x 0.30
    assert e.co2_kg == pytest.approx(0.6)  # 1.5 kWh x 400 g
    assert summary_text(e) == "1.5 kWh (50 % while GPUs idled), 600 g CO2, 0.45 CHF"


def test_without_rates_only_kwh_and_idle_share() -> None:
    e = job_energy(
        [GpuEnergy(7.2e6, 80.0, 0.1)],
        start_s=None,
        end_s=None,
        settings=EnergySettings(),
        unused_max_duty_pct=1.0,
    )
    assert e is not None and e.cost is None and e.co2_kg is None
    assert e.kwh == pytest.approx(2.0) and e.idle_kwh == pytest.approx(0.2)
    assert summary_text(e) == "2 kWh (10 % while GPUs idled)"


def test_no_energy_is_none_and_unknown_duty_is_unknown_idle() -> None:
    s = EnergySettings(co2_g_per_kwh=100.0)
    assert (
        job_energy(
            [GpuEnergy(None, 50.0, 0.1)], start_s=0, end_s=1, settings=s, unused_max_duty_pct=1.0
        )
        is None
    )
    e = job_energy(
        [GpuEnergy(3.6e6, None, None)], start_s=0, end_s=1, settings=s, unused_max_duty_pct=1.0
    )
    assert e is not None and e.idle_kwh is None and e.idle_share is None
    assert e.co2_kg == pytest.approx(0.1)


def test_time_of_day_table_weighs_each_hour_of_the_run() -> None:
    # 17:00 -> 03:00 UTC: 5 h at the day price (07:00-22:00), 5 h at the night price.
    table = {"07:00": 0.30, "22:00": 0.20}
    assert mean_rate(utc(2026, 11, 2, 17), utc(2026, 11, 3, 3), 9.0, table, {}) == (
        pytest.approx(0.25)
    )
    # Before the first entry of the day the last one holds (it wraps past midnight).
    assert mean_rate(utc(2026, 11, 3, 3), utc(2026, 11, 3, 5), 9.0, table, {}) == (
        pytest.approx(0.20)
    )
    # 06:00 -> 08:00: one hour of each.
    assert mean_rate(utc(2026, 11, 3, 6), utc(2026, 11, 3, 8), 9.0, table, {}) == (
        pytest.approx(0.25)
    )
    # A job's cost: 2 kWh at a mean of 0.25.
    e = job_energy(
        [GpuEnergy(2 * JOULES_PER_KWH, 90.0, 0.0)],
        start_s=utc(2026, 11, 2, 17),
        end_s=utc(2026, 11, 3, 3),
        settings=EnergySettings(price_by_hour=table),
        unused_max_duty_pct=1.0,
    )
    assert e is not None and e.cost == pytest.approx(0.50)


def test_monthly_table_in_the_sites_time_zone() -> None:
    # Berlin is UTC+1 in winter: local 23:00 on 31 January is 22:00 UTC; one hour in each month.
    months = {"1": 500.0, "2": 300.0}
    start, end = utc(2026, 1, 31, 22), utc(2026, 2, 1, 0)
    assert mean_rate(start, end, 0.0, {}, months, "Europe/Berlin") == pytest.approx(400.0)
    # The same span in UTC lies wholly in January.
    assert mean_rate(start, end, 0.0, {}, months, "UTC") == pytest.approx(500.0)
    # A month not in the table takes the flat value: March at 100.
    assert mean_rate(utc(2026, 3, 5), utc(2026, 3, 6), 100.0, {}, months) == pytest.approx(100.0)


def test_hour_table_wins_over_month_table_and_a_clock_change_ends() -> None:
    both = EnergySettings(co2_by_hour={"00:00": 10.0}, co2_by_month={"11": 999.0})
    e = job_energy(
        [GpuEnergy(JOULES_PER_KWH, 50.0, 0.0)],
        start_s=utc(2026, 11, 2),
        end_s=utc(2026, 11, 2, 1),
        settings=both,
        unused_max_duty_pct=1.0,
    )
    assert e is not None and e.co2_kg == pytest.approx(0.010)
    # 29 March 2026, Berlin skips 02:00-03:00: an entry at 02:30 does not exist that day.
    table = {"00:00": 1.0, "02:30": 2.0, "03:00": 3.0}
    rate = mean_rate(utc(2026, 3, 28, 23), utc(2026, 3, 29, 2), 0.0, table, {}, "Europe/Berlin")
    assert 1.0 <= rate <= 3.0


def test_zero_length_and_missing_end_use_the_rate_at_the_start() -> None:
    table = {"00:00": 0.1, "12:00": 0.4}
    assert mean_rate(utc(2026, 5, 1, 13), utc(2026, 5, 1, 13), 0.0, table, {}) == 0.4
    assert mean_rate(utc(2026, 5, 1, 13), None, 0.0, table, {}) == 0.4
    assert mean_rate(None, None, 0.7, table, {}) == 0.7


@pytest.mark.parametrize(
    ("kwh", "text"),
    [
        (None, "n/a"),
        (0.0005, "0.5 Wh"),
        (0.0456, "45.6 Wh"),
        (1.234, "1.23 kWh"),
        (123.4, "123 kWh"),
        (4321.0, "4321 kWh"),
    ],
)
def test_kwh_text(kwh: float | None, text: str) -> None:
    assert kwh_text(kwh) == text


def test_co2_and_cost_text() -> None:
    assert co2_text(0.168) == "168 g CO2"
    assert co2_text(12.345) == "12.3 kg CO2"
    assert co2_text(2500.0) == "2500 kg CO2"
    assert cost_text(0.126, "EUR") == "0.13 EUR"
    assert cost_text(0.001, "EUR") == "< 0.01 EUR"
    assert cost_text(None, "EUR") == "n/a"
    assert energy_text(3.6e6) == "1 kWh"


def test_energy_section_parses_and_rejects_bad_tables() -> None:
    s = parse_settings(
        {
            "energy": {
                "price_per_kwh": 0.25,
                "price_by_hour": {"07:00": 0.3, "22:00": 0.2},
                "co2_by_month": {"1": 450, "7": 250},
                "timezone": "Europe/Berlin",
            }
        },
        path="/etc/x.toml",
    )
    assert s.energy.price_by_hour == {"07:00": 0.3, "22:00": 0.2}
    assert s.energy.has_price and s.energy.has_co2
    bad = [
        ({"price_by_hour": {"7:00": 0.3}}, "energy.price_by_hour", "HH:MM"),
        ({"price_by_hour": {"07:00": "cheap"}}, "energy.price_by_hour", "number"),
        ({"co2_by_month": {"13": 1.0}}, "energy.co2_by_month", "month"),
        ({"timezone": "Mars/Olympus"}, "energy.timezone", "time zone"),
        ({"price_per_kwh": -1}, "energy.price_per_kwh", "at least"),
    ]
    for table, key, words in bad:
        with pytest.raises(ConfigError) as info:
            parse_settings({"energy": table}, path="/etc/x.toml")
        assert key in str(info.value) and words in str(info.value)
