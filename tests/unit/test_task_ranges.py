"""Array task ranges as users type them (``accounting.jobids.expand_tasks``): each refusal
says what is wrong with the range typed."""

from __future__ import annotations

import pytest

from slurm_gpu.accounting.jobids import MAX_RANGE_TASKS, expand_tasks
from slurm_gpu.errors import UsageError


def test_a_range_expands_to_its_tasks() -> None:
    assert expand_tasks("[1-3,5,7-11:2%4]") == frozenset({1, 2, 3, 5, 7, 9, 11})


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("[5-1]", "goes up"),
        ("[1-9:0]", "positive step"),
        ("[a-b]", "e.g. 1234_[1-5]"),
    ],
)
def test_a_malformed_range_says_how_one_is_written(text: str, hint: str) -> None:
    with pytest.raises(UsageError) as got:
        expand_tasks(text)
    assert hint in (got.value.hint or ""), got.value.hint


def test_a_range_too_large_says_so_not_that_it_goes_down() -> None:
    # Seen as sgtest1: `gpueff '538_[1-99999999]'` answered "a range goes up (1-5), with a
    # positive step", of a range that went up with step 1.
    with pytest.raises(UsageError) as got:
        expand_tasks("[1-99999999]")
    assert "99,999,999 tasks" in got.value.message, got.value.message
    assert f"{MAX_RANGE_TASKS:,}" in (got.value.hint or ""), got.value.hint
    assert "goes up" not in (got.value.hint or "")
