"""TRES lists and memory sizes."""

from __future__ import annotations

import pytest

from slurm_gpu.accounting.tres import mem_bytes, parse_mem, parse_tres
from slurm_gpu.errors import AccountingError

GIB = 1024**3


def test_full_tres_with_typed_gpus() -> None:
    tres = parse_tres("cpu=8,mem=64G,node=1,billing=8,gres/gpu=2,gres/gpu:a100=2")
    assert (tres.cpus, tres.mem_bytes, tres.nodes, tres.billing, tres.gpus) == (
        8,
        64 * GIB,
        1,
        8,
        2,
    )
    assert tres.gpu_types == (("a100", 2),)
    assert tres.raw == "billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1"


def test_typed_only_gpus_are_summed() -> None:
    tres = parse_tres("cpu=4,gres/gpu:a100=1,gres/gpu:v100=2")
    assert tres.gpus == 3
    assert tres.gpu_types == (("a100", 1), ("v100", 2))


def test_empty_and_null() -> None:
    assert parse_tres("").cpus is None
    assert parse_tres(None).raw == ""
    assert parse_tres("(null)").gpus is None


def test_numeric_tres_ids_from_libslurm() -> None:
    tres = parse_tres("1=4,2=8192,4=1,5=4")
    assert (tres.cpus, tres.mem_bytes, tres.nodes, tres.billing) == (4, 8 * GIB, 1, 4)


def test_bare_mem_is_mebibytes() -> None:
    assert parse_tres("mem=4000").mem_bytes == 4000 * 1024**2


def test_bad_entry_is_typed() -> None:
    with pytest.raises(AccountingError):
        parse_tres("cpu=4,garbage")


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("4000M", "", (4000 * 1024**2, "")),
        ("4000Mc", "", (4000 * 1024**2, "c")),
        ("16Gn", "", (16 * GIB, "n")),
        ("1.5T", "", (int(1.5 * 1024**4), "")),
        ("512K", "", (512 * 1024, "")),
        ("100", "", (100, "")),
        ("100", "M", (100 * 1024**2, "")),
        ("0", "M", (0, "")),
    ],
)
def test_parse_mem(text: str, unit: str, expected: tuple[int, str]) -> None:
    assert parse_mem(text, default_unit=unit) == expected


@pytest.mark.parametrize("text", ["", "abc", "12X", "Unknown"])
def test_unparsable_mem_is_none(text: str) -> None:
    assert mem_bytes(text) is None
