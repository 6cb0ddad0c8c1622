"""Compact binary encodings for the store's bulky columns: histograms and timelines.

A 101-bin utilization histogram and a 512-point timeline would cost kilobytes as JSON. Here
they are packed little-endian arrays, quantised to what a report can show, then zlib-compressed,
behind a one-byte format version so a later release can change the layout and still read old
rows. Measured in ``docs/performance.md``: about 2 KB per GPU-hour at the default 10 s interval.

Quantisation (all lossless for what the reports draw):

- utilization and CPU percentages: 0.01 % steps (``uint16``; ``0xFFFF`` = not reported);
- memory: MiB (``uint32``; ``0xFFFFFFFF`` = not reported);
- power: 0.1 W (``uint32``; ``0xFFFFFFFF`` = not reported);
- host CPU cores busy: 0.01 cores (``uint32``);
- bucket start times: milliseconds after the first bucket (``int64``), the first one as a
  ``float64``; widths in milliseconds (``uint32``).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from slurm_gpu.capture.recordcodec import TimelineColumns, build_points, kept_columns
from slurm_gpu.errors import StoreError
from slurm_gpu.lazy import optional_module
from slurm_gpu.records import Distribution, TimelinePoint

_VERSION = 1
_MIB = 1024 * 1024
_U16_NONE = 0xFFFF
_U32_NONE = 0xFFFFFFFF
_INT_ONLY = frozenset({int})
#: zlib level of timelines: level 1 is 6x faster than 6 on a 4-GPU, 360-point timeline and
#: costs under 1 % more bytes (measured in docs/performance.md); histograms are tiny and keep 6.
_TIMELINE_ZLIB_LEVEL = 1


def _check_version(blob: bytes, what: str) -> bytes:
    if not blob or blob[0] != _VERSION:
        version = blob[0] if blob else None
        raise StoreError(
            f"{what} encoded with unknown format version {version!r}",
            hint="upgrade slurm-gpu: this store was written by a newer release",
        )
    return zlib.decompress(blob[1:])


def _le(arr: array) -> bytes:  # type: ignore[type-arg]
    # The store may be shared between hosts; pin the byte order.
    if struct.pack("=H", 1) != struct.pack("<H", 1):  # pragma: no cover - big-endian hosts
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _from_le(typecode: str, data: bytes) -> array:  # type: ignore[type-arg]
    arr = array(typecode)
    arr.frombytes(data)
    if struct.pack("=H", 1) != struct.pack("<H", 1):  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr


# --------------------------------------------------------------------------- histograms


def encode_distribution(dist: Distribution) -> bytes:
    """Pack a ``Distribution`` (bin counts and exact total) into a few dozen bytes."""
    counts = array("Q", dist.counts)
    payload = struct.pack("<dI", dist.total, len(dist.counts)) + _le(counts)
    return bytes([_VERSION]) + zlib.compress(payload, 6)


def decode_distribution(blob: bytes) -> Distribution:
    """Inverse of ``encode_distribution``; raises ``StoreError`` for an unknown version."""
    raw = _check_version(blob, "histogram")
    total, n = struct.unpack_from("<dI", raw)
    counts = _from_le("Q", raw[12 : 12 + 8 * n])
    return Distribution(counts=tuple(counts), total=total)


# --------------------------------------------------------------------------- timelines


def _column(points: Sequence[TimelinePoint], attr: str, gpu_count: int) -> list[tuple[Any, ...]]:
    """Per-GPU columns of a per-GPU tuple attribute, padded with ``None``."""
    rows = list(map(attrgetter(attr), points))
    if set(map(len, rows)) - {gpu_count}:
        rows = [(tuple(r) + (None,) * gpu_count)[:gpu_count] for r in rows]
    return list(zip(*rows, strict=True)) if rows else [() for _ in range(gpu_count)]


def _q_col(values: Sequence[float | None], scale: float, none: int, top: int) -> list[int]:
    # Inlined quantisation: this loop runs for every point of every GPU of every job. The
    # common column (every value reported and in range) skips the per-value checks.
    if values and None not in values:
        present: Sequence[float] = values  # type: ignore[assignment]
        if min(present) >= 0 and max(present) * scale < top:
            return [int(v * scale + 0.5) for v in present]
    return [
        none if v is None else (0 if v <= 0 else top if v * scale >= top else int(v * scale + 0.5))
        for v in values
    ]


def _mib_col(values: Sequence[int | float | None]) -> list[int]:
    # Round up: a peak must never be under-reported.
    top = _U32_NONE - 1
    if values and None not in values and set(map(type, values)) <= _INT_ONLY:
        ints: Sequence[int] = values  # type: ignore[assignment]
        out = [-(-v // _MIB) for v in ints]
        if max(out) <= top:
            return out
    return [_U32_NONE if v is None else min(top, -(-int(v) // _MIB)) for v in values]


def _gpu_columns_fast(
    points: Sequence[TimelinePoint], attr: str, gpu_count: int, kind: str, top: int
) -> list[bytes] | None:
    """The packed per-GPU columns of ``attr`` (``kind``: ``"util"``, ``"mib"`` or ``"power"``),
    computed on one numpy matrix; ``None`` (the caller packs them value by value) unless every
    point has every GPU's value, finite (and memory not negative). Then the bytes equal those of
    ``_q_col``/``_mib_col`` and ``array``: each is the same IEEE operation per value
    (``int(v * scale + 0.5)``, ``-(-v // MiB)``), done in C over the whole timeline instead of
    one interpreted step per value (a third of the time for a 4-GPU hour)."""
    # Imported on the first timeline packed: only the collector packs timelines, and gpueff,
    # which decodes them, must not pay numpy's import (installed with pandas).
    np = optional_module("numpy")
    if np is None or not points or gpu_count == 0:
        return None
    rows = list(map(attrgetter(attr), points))
    matrix = _matrix(np, rows, kind, (len(points), gpu_count))
    return None if matrix is None else _pack_gpu_matrix(np, matrix.T, kind, top)


def _gpu_lists_fast(
    columns: Sequence[Sequence[Any]], n: int, kind: str, top: int
) -> list[bytes] | None:
    """``_gpu_columns_fast`` for a timeline kept as columns (one list of ``n`` values per
    GPU, ``recordcodec.TimelineColumns``): the same bytes, without reading the points."""
    np = optional_module("numpy")
    if np is None or n == 0 or not columns:
        return None
    matrix = _matrix(np, columns, kind, (len(columns), n))
    return None if matrix is None else _pack_gpu_matrix(np, matrix, kind, top)


def _matrix(np: Any, data: Sequence[Sequence[Any]], kind: str, shape: tuple[int, int]) -> Any:
    """``data`` as one numpy matrix of ``shape`` (integers for ``"mib"``, floats otherwise),
    or ``None`` where a value is missing, a row ragged or an integer too large for 64 bits."""
    try:
        matrix = np.array(data, dtype=np.int64 if kind == "mib" else np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    return matrix if matrix.shape == shape else None


def _pack_gpu_matrix(np: Any, matrix: Any, kind: str, top: int) -> list[bytes] | None:
    """The packed bytes of each row of ``matrix`` (one row per GPU, one column per point);
    ``None`` where a value is not finite or a memory value negative (see
    ``_gpu_columns_fast``)."""
    if kind == "mib":
        if matrix.min() < 0:
            return None
        q = np.minimum(-(-matrix // _MIB), top)
        dtype = "<u4"
    else:
        if not np.isfinite(matrix).all():
            return None
        # As ``_q_col``: 0 at or below 0, ``top`` at or above it, else rounded half up.
        scaled = matrix * (100.0 if kind == "util" else 10.0)
        q = np.where(matrix <= 0, 0, np.where(scaled >= top, top, (scaled + 0.5).astype(np.int64)))
        dtype = "<u2" if kind == "util" else "<u4"
    return [row.astype(dtype).tobytes() for row in q]


def encode_timeline(points: Sequence[TimelinePoint], gpu_count: int) -> bytes:
    """Pack a per-node timeline column by column (columns compress far better than rows).

    ``gpu_count`` is the width of every per-GPU tuple; a point with a shorter tuple is padded
    with "not reported". A timeline decoded from a sealed record
    (``recordcodec.ColumnTimeline``) is packed from the columns it keeps, to the same bytes.
    """
    kept = kept_columns(points)
    if kept is not None and kept.gpu_count == gpu_count and len(kept.t_s) == len(points):
        return _encode_columns(kept)
    n = len(points)
    t0 = points[0].t_s if points else 0.0
    top = _U32_NONE - 1
    t_ms = array("q", [round((p.t_s - t0) * 1000) for p in points])
    width_ms = array("I", _q_col([p.width_s for p in points], 1000, _U32_NONE, top))
    counts = [p.samples for p in points]
    samples = array("I", counts if not counts or min(counts) >= 0 else [max(0, c) for c in counts])
    cpu = array("I", _q_col([p.host_cpu_cores for p in points], 100, _U32_NONE, top))
    rss = array("I", _mib_col([p.host_rss_max_bytes for p in points]))
    parts = [struct.pack("<IId", n, gpu_count, t0), _le(t_ms), _le(width_ms), _le(samples)]
    parts += [_le(cpu), _le(rss)]
    utils = _gpu_columns_fast(points, "gpu_utilization_pct", gpu_count, "util", 10000) or [
        _le(array("H", _q_col(c, 100, _U16_NONE, 10000)))
        for c in _column(points, "gpu_utilization_pct", gpu_count)
    ]
    mems = _gpu_columns_fast(points, "gpu_memory_used_max_bytes", gpu_count, "mib", top) or [
        _le(array("I", _mib_col(c)))
        for c in _column(points, "gpu_memory_used_max_bytes", gpu_count)
    ]
    powers = _gpu_columns_fast(points, "gpu_power_w", gpu_count, "power", top) or [
        _le(array("I", _q_col(c, 10, _U32_NONE, top)))
        for c in _column(points, "gpu_power_w", gpu_count)
    ]
    for g in range(gpu_count):
        parts += (utils[g], mems[g], powers[g])
    return bytes([_VERSION]) + zlib.compress(b"".join(parts), _TIMELINE_ZLIB_LEVEL)


def _encode_columns(c: TimelineColumns) -> bytes:
    """``encode_timeline`` of the points built from ``c``, from the columns themselves: each
    step is the one ``encode_timeline`` takes on the same values (read per GPU instead of per
    point), so the bytes are the same (a test compares them)."""
    n, gpu_count = len(c.t_s), c.gpu_count
    t0 = c.t_s[0] if n else 0.0
    top = _U32_NONE - 1
    t_ms = array("q", [round((t - t0) * 1000) for t in c.t_s])
    width_ms = array("I", _q_col(c.width_s, 1000, _U32_NONE, top))
    counts = c.samples
    samples = array("I", counts if not counts or min(counts) >= 0 else [max(0, v) for v in counts])
    cpu = array("I", _q_col(c.host_cpu_cores, 100, _U32_NONE, top))
    rss = array("I", _mib_col(c.host_rss_max_bytes))
    parts = [struct.pack("<IId", n, gpu_count, t0), _le(t_ms), _le(width_ms), _le(samples)]
    parts += [_le(cpu), _le(rss)]
    utils = _gpu_lists_fast(c.gpu_utilization_pct, n, "util", 10000) or [
        _le(array("H", _q_col(col, 100, _U16_NONE, 10000))) for col in c.gpu_utilization_pct
    ]
    mems = _gpu_lists_fast(c.gpu_memory_used_max_bytes, n, "mib", top) or [
        _le(array("I", _mib_col(col))) for col in c.gpu_memory_used_max_bytes
    ]
    powers = _gpu_lists_fast(c.gpu_power_w, n, "power", top) or [
        _le(array("I", _q_col(col, 10, _U32_NONE, top))) for col in c.gpu_power_w
    ]
    for g in range(gpu_count):
        parts += (utils[g], mems[g], powers[g])
    return bytes([_VERSION]) + zlib.compress(b"".join(parts), _TIMELINE_ZLIB_LEVEL)


def _scaled(values: array[int], none: int, factor: int, *, divide: int = 0) -> list[Any]:
    """``values`` times ``factor`` (divided by ``divide`` when given, for the same floats as
    ``v / divide``), ``none`` as ``None``."""
    if none in values:
        if divide:
            return [None if v == none else v / divide for v in values]
        return [None if v == none else v * factor for v in values]
    if divide:
        return [v / divide for v in values]
    return [v * factor for v in values]


def decode_timeline(blob: bytes, *, utilization_only: bool = False) -> tuple[TimelinePoint, ...]:
    """Inverse of ``encode_timeline``, at the quantised precision.

    ``utilization_only``: the points carry their times, sample counts and GPU utilization
    only; memory, power, CPU and RSS are ``None`` (what a report's sparklines need, at about
    half the cost)."""
    raw = _check_version(blob, "timeline")
    n, gpu_count, t0 = struct.unpack_from("<IId", raw)
    off = 16

    def take(typecode: str) -> array:  # type: ignore[type-arg]
        nonlocal off
        size = array(typecode).itemsize * n
        out = _from_le(typecode, raw[off : off + size])
        off += size
        return out

    t_ms, width_ms, samples, cpu, rss = take("q"), take("I"), take("I"), take("I"), take("I")
    gpus = [(take("H"), take("I"), take("I")) for _ in range(gpu_count)]
    # Column by column in comprehensions, then the points built in C loops: a one-hour
    # timeline (360 points) is decoded for every report gpueff or the collector renders.
    # A column without "not reported" (the common case) skips the per-value test; the
    # membership test runs in C.
    utils = [_scaled(u, _U16_NONE, 1, divide=100) for u, _, _ in gpus]
    times = [t0 + t / 1000 for t in t_ms]
    widths = [w / 1000 for w in width_ms]
    per_gpu_utils = list(zip(*utils, strict=True)) if gpu_count else [()] * n
    if utilization_only:
        nones: list[Any] = [(None,) * gpu_count] * n
        return build_points(
            (times, widths, list(samples), per_gpu_utils, nones, nones, [None] * n, [None] * n),
            n,
        )
    mems = [_scaled(m, _U32_NONE, _MIB) for _, m, _ in gpus]
    powers = [_scaled(p, _U32_NONE, 1, divide=10) for _, _, p in gpus]
    columns = (
        times,
        widths,
        list(samples),
        per_gpu_utils,
        list(zip(*mems, strict=True)) if gpu_count else [()] * n,
        list(zip(*powers, strict=True)) if gpu_count else [()] * n,
        _scaled(cpu, _U32_NONE, 1, divide=100),
        _scaled(rss, _U32_NONE, _MIB),
    )
    return build_points(columns, n)
