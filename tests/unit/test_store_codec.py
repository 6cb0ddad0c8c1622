"""The packed histogram and timeline encodings: round trips at the stated precision."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from slurm_gpu.errors import StoreError
from slurm_gpu.records import Distribution, TimelinePoint
from slurm_gpu.store import codec

MIB = 2**20


def test_distribution_round_trips_exactly() -> None:
    d = Distribution(counts=tuple(range(101)), total=12345.678)
    assert codec.decode_distribution(codec.encode_distribution(d)) == d
    empty = Distribution(counts=(0,) * 101, total=0.0)
    assert codec.decode_distribution(codec.encode_distribution(empty)) == empty


def test_timeline_round_trips_at_the_quantised_precision() -> None:
    points = (
        TimelinePoint(
            1.7e9, 10.0, 3, (12.345, None), (5 * MIB + 1, None), (250.04, None), 3.257, 7 * MIB
        ),
        TimelinePoint(1.7e9 + 10, 10.0, 3, (100.0, 0.0), (None, 0), (None, 0.0), None, None),
        # A short per-GPU tuple is padded with "not reported"; out-of-range values clamp.
        TimelinePoint(1.7e9 + 20.5, 9.5, 2, (150.0,), (MIB,), (-3.0,), 0.0, 0),
    )
    got = codec.decode_timeline(codec.encode_timeline(points, 2))
    assert [p.t_s for p in got] == [1.7e9, 1.7e9 + 10, 1.7e9 + 20.5]
    assert [p.width_s for p in got] == [10.0, 10.0, 9.5]
    assert [p.samples for p in got] == [3, 3, 2]
    assert [p.gpu_utilization_pct for p in got] == [(12.35, None), (100.0, 0.0), (100.0, None)]
    # Memory peaks round up to the next MiB: never under-reported.
    assert [p.gpu_memory_used_max_bytes for p in got] == [(6 * MIB, None), (None, 0), (MIB, None)]
    assert [p.gpu_power_w for p in got] == [(250.0, None), (None, 0.0), (0.0, None)]
    assert [p.host_cpu_cores for p in got] == [3.26, None, 0.0]
    assert [p.host_rss_max_bytes for p in got] == [7 * MIB, None, 0]


def test_empty_timeline() -> None:
    assert codec.decode_timeline(codec.encode_timeline((), 4)) == ()


def test_unknown_format_version_is_a_store_error() -> None:
    blob = codec.encode_distribution(Distribution(counts=(1,), total=1.0))
    with pytest.raises(StoreError, match="unknown format version 9"):
        codec.decode_distribution(b"\x09" + blob[1:])
    with pytest.raises(StoreError):
        codec.decode_timeline(b"")


def test_fully_reported_columns_quantise_like_the_general_path() -> None:
    # Columns without gaps take a shorter path through the encoder; it must give the same
    # values (zero duty cycle included, memory rounded up to the next MiB).
    utils = [0.0, 0.004, 0.005, 37.123, 99.996, 100.0]
    mems = [0, 1, MIB, MIB + 1, 80 * 1024 * MIB - 1, 3]
    powers = [0.0, 0.04, 0.05, 250.04, 699.95, 700.0]
    points = tuple(
        TimelinePoint(1.7e9 + 10 * i, 10.0, 1, (u,), (m,), (p,), u / 10, m)
        for i, (u, m, p) in enumerate(zip(utils, mems, powers, strict=True))
    )
    got = codec.decode_timeline(codec.encode_timeline(points, 1))
    assert [g.gpu_utilization_pct[0] for g in got] == [int(u * 100 + 0.5) / 100 for u in utils]
    assert [g.gpu_memory_used_max_bytes[0] for g in got] == [-(-m // MIB) * MIB for m in mems]
    assert [g.gpu_power_w[0] for g in got] == [int(p * 10 + 0.5) / 10 for p in powers]
    assert [g.host_rss_max_bytes for g in got] == [-(-m // MIB) * MIB for m in mems]


def _value_by_value(points: tuple[TimelinePoint, ...], gpu_count: int) -> bytes:
    """``encode_timeline`` with the numpy path switched off: every column packed by
    ``_q_col``/``_mib_col``, the encoder as it was before the matrix path."""
    saved = codec.optional_module
    codec.optional_module = lambda name: None  # type: ignore[assignment]
    try:
        return codec.encode_timeline(points, gpu_count)
    finally:
        codec.optional_module = saved


@pytest.mark.parametrize(
    "edit",
    [
        {},
        {"gpu_utilization_pct": (100.0, 99.995, 0.004999, 0.005)},
        {"gpu_utilization_pct": (150.0, -5.0, 0.0, -0.0)},
        {"gpu_power_w": (1e12, 0.05, 0.04999, 700.0)},
        {"gpu_memory_used_max_bytes": (0, 1, MIB, 2**60)},
        {"gpu_memory_used_max_bytes": (2**70, 1, 2, 3)},
        {"gpu_memory_used_max_bytes": (-3, 1, 2, 3)},
        {"gpu_utilization_pct": (None, 1.0, 2.0, 3.0)},
        {"gpu_power_w": (1.0, 2.0)},
    ],
)
def test_a_whole_timeline_matrix_packs_to_the_same_bytes_as_value_by_value(
    edit: dict[str, tuple[float | int | None, ...]],
) -> None:
    """The collector packs complete 4-GPU columns as one numpy matrix (a third of the time);
    the bytes must be those of the value-by-value encoder, in range or clamped, and where a
    column is not complete (a gap, a short tuple) the value-by-value path takes it."""
    edited = _four_gpu_hour(edit, lambda i: 1.7e9 + 10 * i, lambda i: 1)
    assert codec.encode_timeline(edited, 4) == _value_by_value(edited, 4)


def _four_gpu_hour(
    edit: dict[str, Any], stamp: Callable[[int], float], samples: Callable[[int], int]
) -> tuple[TimelinePoint, ...]:
    """50 points of 4 GPUs (``stamp`` and ``samples`` per index), point 7 changed by
    ``edit``."""
    points = tuple(
        TimelinePoint(
            stamp(i),
            10.0,
            samples(i),
            (12.345 + i, 50.0, 99.0, 3.5),
            (5 * MIB + i, 2 * MIB, 40 * 1024 * MIB, 0),
            (250.04, 100.0 + i / 7, 60.0, 0.0),
            3.2,
            7 * MIB,
        )
        for i in range(50)
    )
    return tuple(dataclasses.replace(p, **edit) if i == 7 else p for i, p in enumerate(points))


def test_a_nan_is_refused_by_both_encoders() -> None:
    p = TimelinePoint(1.7e9, 10.0, 1, (float("nan"),), (MIB,), (1.0,), None, None)
    with pytest.raises(ValueError):
        codec.encode_timeline((p,), 1)
    with pytest.raises(ValueError):
        _value_by_value((p,), 1)


def _sealed_and_read(points: tuple[TimelinePoint, ...], gpus: int) -> tuple[TimelinePoint, ...]:
    """``points`` as the collector gets them: in a sealed record, read back."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from store_fixtures import make_node

    from slurm_gpu.capture import spool

    node = dataclasses.replace(make_node("7", gpus=gpus), timeline=points)
    return spool.decode_record(spool.encode_record(node)).timeline


@pytest.mark.parametrize(
    "edit",
    [
        {},
        {"gpu_utilization_pct": (150.0, -5.0, 0.0, -0.0)},
        {"gpu_power_w": (1e12, 0.05, 0.04999, 700.0)},
        {"gpu_memory_used_max_bytes": (2**63 + 5, 1, 2, 3)},  # beyond numpy's int64
        {"gpu_memory_used_max_bytes": (-3, 1, 2, 3)},
        {"gpu_utilization_pct": (None, 1.0, 2.0, 3.0)},
        {"host_cpu_cores": None, "host_rss_max_bytes": None, "samples": -1},
        {"gpu_power_w": (1, 2, 3, 4), "width_s": 10},  # integers where floats are expected
    ],
)
@pytest.mark.parametrize("gpu_count", [4, 3, 5])
def test_a_sealed_records_timeline_packs_from_its_columns_to_the_same_bytes(
    edit: dict[str, object], gpu_count: int
) -> None:
    """A timeline read from a sealed record keeps its checked columns
    (``recordcodec.ColumnTimeline``), and the store packs it from them: the bytes must be
    those of the same points packed point by point, and of the value-by-value encoder. A
    ``gpu_count`` other than the columns' width takes the points' path (padding or cutting)."""
    from slurm_gpu.capture.recordcodec import ColumnTimeline, kept_columns

    edited = _four_gpu_hour(edit, lambda i: 1.7e9 + 10 * i + i / 3, lambda i: 1 + i % 2)
    read = _sealed_and_read(edited, 4)
    assert type(read) is ColumnTimeline and kept_columns(read) is not None
    assert read == tuple(read)
    plain = tuple(read)
    assert kept_columns(plain) is None
    assert codec.encode_timeline(read, gpu_count) == codec.encode_timeline(plain, gpu_count)
    assert codec.encode_timeline(read, gpu_count) == _value_by_value(plain, gpu_count)


@pytest.mark.parametrize("gpus", [0, 1])
def test_an_empty_or_gpu_less_sealed_timeline_packs_as_its_points(gpus: int) -> None:
    for points in [
        (),
        tuple(
            TimelinePoint(
                1.7e9 + 10 * i, 10.0, 1, (5.0,) * gpus, (MIB,) * gpus, (9.0,) * gpus, 1.0, 3
            )
            for i in range(3)
        ),
    ]:
        read = _sealed_and_read(points, gpus)
        assert codec.encode_timeline(read, gpus) == codec.encode_timeline(tuple(read), gpus)
        assert codec.decode_timeline(codec.encode_timeline(read, gpus)) == codec.decode_timeline(
            codec.encode_timeline(tuple(read), gpus)
        )


def test_a_column_timeline_pickles_and_copies_as_a_plain_tuple() -> None:
    import copy
    import pickle

    points = tuple(
        TimelinePoint(1.7e9 + 10 * i, 10.0, 1, (5.0,), (MIB,), (9.0,), 1.0, 3) for i in range(3)
    )
    read = _sealed_and_read(points, 1)
    for other in (pickle.loads(pickle.dumps(read)), copy.copy(read), copy.deepcopy(read)):
        assert type(other) is tuple and other == read == points
