"""Host-list and array-range expansion."""

from __future__ import annotations

import pytest

from slurm_gpu.accounting.hostlist import expand_hostlist, expand_id_ranges
from slurm_gpu.errors import AccountingError


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu[01-03,07],login1", ("gpu01", "gpu02", "gpu03", "gpu07", "login1")),
        ("vm", ("vm",)),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("n[098-101]", ("n098", "n099", "n100", "n101")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("a[1-2]-ib,b", ("a1-ib", "a2-ib", "b")),
        ("None assigned", ()),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_expand_hostlist(expr: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["gpu[01-03", "gpu01]", "n[a-b]", "n[5-1]", "n[[1]]"])
def test_bad_hostlist_is_a_typed_error(expr: str) -> None:
    with pytest.raises(AccountingError):
        expand_hostlist(expr)


def test_huge_range_is_refused_not_expanded() -> None:
    with pytest.raises(AccountingError, match="more than"):
        expand_hostlist("n[1-99999999]")


@pytest.mark.parametrize(
    ("body", "ids"),
    [
        ("1-5", [1, 2, 3, 4, 5]),
        ("2-5%1", [2, 3, 4, 5]),
        ("1,3,7-8", [1, 3, 7, 8]),
        ("0-8:4", [0, 4, 8]),
    ],
)
def test_expand_id_ranges(body: str, ids: list[int]) -> None:
    assert expand_id_ranges(body) == ids


def test_bad_array_range() -> None:
    with pytest.raises(AccountingError):
        expand_id_ranges("1-x")
