"""Energy in one unit per column, chosen for the whole column, and job totals in Wh or kWh:
the terminal, the text mail and the HTML mail alike."""

from __future__ import annotations

import dataclasses
import re

import gpueff_factory as F
import pytest

from slurm_gpu.jobreport import adapter, fmt
from slurm_gpu.jobreport.model import JobReport, Telemetry
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.notify.message import MailContext, MessageBuilder

#: One GPU used 3.87 Wh, the other 2200 J: the column the issue saw as "3.87 Wh" / "2200 J".
ENERGIES = (13932.0, 2200.0)


def _report(energies: tuple[float, ...] = ENERGIES) -> JobReport:
    gpus = adapter.gpu_lines_from_records([F.node_record()])
    gpus = tuple(dataclasses.replace(g, energy_j=e) for g, e in zip(gpus, energies, strict=True))
    base = adapter.accounting_report(F.job(), min_elapsed_s=30)
    return adapter.with_telemetry(base, Telemetry(gpus=gpus, live=False).gpus, live=False)


def _units(text: str) -> list[str]:
    return re.findall(r"\d(?:[\d.]*) (J|Wh|kWh)\b", text)


@pytest.mark.parametrize(
    ("values", "unit"),
    [((13932.0, 2200.0), "Wh"), ((50.0, 900.0), "J"), ((4.0e6, 2200.0), "kWh"), ((None,), "J")],
)
def test_a_column_takes_the_unit_of_its_largest_value(
    values: tuple[float | None, ...], unit: str
) -> None:
    assert fmt.energy_unit(values) == unit


def test_totals_are_in_wh_or_kwh() -> None:
    assert fmt.energy_total(3223.0) == "0.895 Wh"
    assert fmt.energy_total(13932.0) == "3.87 Wh"
    assert fmt.energy_total(7.2e6) == "2.00 kWh"
    assert fmt.energy(2200.0, "Wh") == "0.611 Wh"


def test_terminal_gpu_lines_share_one_unit_and_the_total_is_wh() -> None:
    out = TerminalRenderer(colour=False).report(_report())
    per_gpu = [ln for ln in out.splitlines() if ln.strip().startswith("mem ")]
    assert [_units(ln) for ln in per_gpu] == [["Wh"], ["Wh"]], out
    # The job's total, on its Energy line, in Wh as well.
    assert "Energy  4.48 Wh" in out, out


def test_mail_text_and_html_use_the_same_units() -> None:
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    msg = builder.build([_report()], to="sgtest1@example.org")
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    for body in (text, html):
        assert not re.search(r"\d J\b", body), body
        assert "0.611" in body and "4.48" in body


def test_a_column_under_1_wh_is_in_wh_as_the_total_and_the_web_page() -> None:
    """Seen on the test cluster: a one-GPU job's GPU line said ``energy 1100 J`` and its
    Energy line ``0.306 Wh``, the same energy in two units (the web page said Wh)."""
    gpus = adapter.gpu_lines_from_records([F.node_record()])[:1]
    gpus = (dataclasses.replace(gpus[0], energy_j=1100.0),)
    base = adapter.accounting_report(F.job(), min_elapsed_s=30)
    report = adapter.with_telemetry(base, Telemetry(gpus=gpus, live=False).gpus, live=False)
    out = TerminalRenderer(colour=False).report(report)
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("mem ")]
    assert "energy 0.306 Wh" in line, out
    assert "Energy  0.306 Wh" in out, out
    builder = MessageBuilder(from_address="a@b.org", context=MailContext())
    msg = builder.build([report], to="sgtest1@example.org")
    for part in ("plain", "html"):
        body = msg.get_body((part,)).get_content()  # type: ignore[union-attr]
        assert not re.search(r"\d J\b", body) and "0.306 Wh" in body, body


def test_an_energy_under_a_thousandth_of_its_unit_is_not_printed_as_zero() -> None:
    assert fmt.energy(1.0, "Wh") == "< 0.001 Wh"
    assert fmt.energy(0.0, "Wh") == "0 Wh"
