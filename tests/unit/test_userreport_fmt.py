"""Number formatting in what users read: units that read well, never scientific notation."""

from __future__ import annotations

import pytest

from slurm_gpu.jobreport import fmt


@pytest.mark.parametrize(
    ("joules", "text"),
    [
        (None, fmt.NA),
        (0.0, "0 Wh"),
        (0.5, "< 0.001 Wh"),
        (2200.0, "0.611 Wh"),
        (3550.0, "0.986 Wh"),
        (3600.0, "1 Wh"),
        (13_824.0, "3.84 Wh"),
        (5_400_000.0, "1.5 kWh"),
    ],
)
def test_energy_picks_a_unit_and_never_uses_an_exponent(joules: float | None, text: str) -> None:
    assert fmt.energy(joules) == text
    assert "e+" not in fmt.energy(joules) and "e-" not in fmt.energy(joules)
