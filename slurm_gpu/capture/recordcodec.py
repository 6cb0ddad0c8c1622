"""Plain-JSON encoding of the frozen records in ``slurm_gpu.records``.

``to_jsonable`` turns a record into dicts, lists and scalars; ``from_jsonable`` rebuilds it from
the type hints, strictly: a missing required field, an unknown field or a value of the wrong
type raises ``ValueError`` (callers turn it into ``SpoolFormatError``). Fields with a default may
be left out, which keeps spool lines short.

``timeline_to_columns`` / ``timeline_from_columns`` are the compact form of a ``NodeRecord``
timeline used by sealed records from version 2 on: one list per field instead of one object
per point (a third of the bytes, and decoding builds each ``TimelinePoint`` directly instead of
going through the generic decoder: the collector reads thousands of records per pass). The
decoded timeline (``ColumnTimeline``) keeps those columns, from which the store packs it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from slurm_gpu.records import TimelinePoint

T = TypeVar("T")

_Converter = Callable[[Any], Any]
_CACHE: dict[type[Any], tuple[dict[str, _Converter], frozenset[str]]] = {}


_FIELDS: dict[type[Any], tuple[tuple[str, Any], ...]] = {}
_SCALARS = (int, float, str, bool, type(None))


def _fields_of(cls: type[Any]) -> tuple[tuple[str, Any], ...]:
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = tuple(
            (f.name, f.default if f.default is not dataclasses.MISSING else _NO_DEFAULT)
            for f in dataclasses.fields(cls)
        )
        _FIELDS[cls] = fields
    return fields


_NO_DEFAULT = object()


def to_jsonable(obj: Any, *, omit_defaults: bool = False) -> Any:
    """Dataclasses become dicts, tuples become lists; with ``omit_defaults`` fields equal to
    their default are left out."""
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, tuple | list):
        # Sealing a week-long record encodes thousands of numeric tuples: skip the recursion
        # for flat ones.
        if all(isinstance(v, _SCALARS) for v in obj):
            return list(obj)
        return [to_jsonable(v, omit_defaults=omit_defaults) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for name, default in _fields_of(type(obj)):
            value = getattr(obj, name)
            if omit_defaults and default is not _NO_DEFAULT and value == default:
                continue
            out[name] = to_jsonable(value, omit_defaults=omit_defaults)
        return out
    return obj


#: Integers a record or reading may hold: 64 bits, signed or unsigned (NVML's counters are
#: unsigned 64-bit). A record with a larger one is malformed (quarantined) rather than a batch
#: the store cannot take, and the standard library and orjson then read the same text alike
#: (orjson reads an integer beyond these bounds as a float).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _in_range(ints: Any) -> bool:
    """Whether the integers of ``ints`` (``None`` left out) fit 64 bits; one C pass each way."""
    present = [v for v in ints if v is not None] if None in ints else ints
    return not present or (min(present) >= INT_MIN and max(present) <= INT_MAX)


def _scalar(kind: type[Any]) -> _Converter:
    def convert(value: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
        if kind is int and not INT_MIN <= value <= INT_MAX:
            raise ValueError("integer beyond 64 bits")
        return value

    return convert


def _converter(hint: Any) -> _Converter:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        sub = _converter(inner[0])
        return lambda v: None if v is None else sub(v)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _converter(args[0])
            # Lists of one plain scalar type (histogram counts, per-GPU values) are checked in
            # one pass; anything else goes item by item, with the exact error.
            fast = _FAST_ITEM_TYPES.get(args[0])

            def convert_var(value: Any) -> Any:
                if not isinstance(value, list):
                    raise ValueError("expected a list")
                if fast is not None and set(map(type, value)) <= fast:
                    if int in fast and not _in_range(value):
                        raise ValueError("integer beyond 64 bits")
                    return tuple(value)
                return tuple(item(v) for v in value)

            return convert_var
        items = [_converter(a) for a in args]

        def convert_fixed(value: Any) -> Any:
            if not isinstance(value, list) or len(value) != len(items):
                raise ValueError(f"expected a list of {len(items)}")
            return tuple(c(v) for c, v in zip(items, value, strict=True))

        return convert_fixed
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: from_jsonable(hint, v)
    if hint in (int, float, str, bool):
        return _scalar(hint)
    raise TypeError(f"unsupported field type {hint!r}")


#: Item hints whose JSON values need no conversion when of exactly these types (``bool`` is
#: not ``int`` here: ``type(True) is bool``).
_FAST_ITEM_TYPES: dict[Any, frozenset[type[Any]]] = {
    int: frozenset({int}),
    float: frozenset({float}),
    str: frozenset({str}),
    int | None: frozenset({int, type(None)}),
    float | None: frozenset({float, type(None)}),
}


def _plan(cls: type[Any]) -> tuple[dict[str, _Converter], frozenset[str]]:
    plan = _CACHE.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        converters = {f.name: _converter(hints[f.name]) for f in fields}
        required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        plan = (converters, required)
        _CACHE[cls] = plan
    return plan


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild a record of type ``cls`` from ``to_jsonable`` output; ``ValueError`` if it does
    not fit."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object")
    converters, required = _plan(cls)
    missing = required - data.keys()
    if missing:
        raise ValueError(f"{cls.__name__}: missing {', '.join(sorted(missing))}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        convert = converters.get(key)
        if convert is None:
            raise ValueError(f"{cls.__name__}: unknown field {key!r}")
        try:
            kwargs[key] = convert(value)
        except ValueError as exc:
            raise ValueError(f"{cls.__name__}.{key}: {exc}") from None
    return cls(**kwargs)


# --------------------------------------------------------------------------- timeline columns

_TIMELINE_GPU_FIELDS = ("gpu_utilization_pct", "gpu_memory_used_max_bytes", "gpu_power_w")


def timeline_to_columns(points: Sequence[TimelinePoint]) -> dict[str, Any] | None:
    """The column form of a timeline: ``t_s``, ``width_s``, ``samples``, ``host_cpu_cores``,
    ``host_rss_max_bytes`` as lists, and each per-GPU field as one list per GPU.

    ``None`` when the per-GPU tuples do not all have the same length (the aggregator never
    produces that; callers then keep the row form).
    """
    width = len(points[0].gpu_utilization_pct) if points else 0
    for p in points:
        if not (
            len(p.gpu_utilization_pct)
            == len(p.gpu_memory_used_max_bytes)
            == len(p.gpu_power_w)
            == width
        ):
            return None
    out: dict[str, Any] = {
        "t_s": [p.t_s for p in points],
        "width_s": [p.width_s for p in points],
        "samples": [p.samples for p in points],
    }
    for name in _TIMELINE_GPU_FIELDS:
        rows = [getattr(p, name) for p in points]
        out[name] = [list(col) for col in zip(*rows, strict=True)] if rows else []
    out["host_cpu_cores"] = [p.host_cpu_cores for p in points]
    out["host_rss_max_bytes"] = [p.host_rss_max_bytes for p in points]
    return out


def _column(data: dict[str, Any], name: str, n: int | None) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        raise ValueError(f"timeline.{name}: expected a list")
    if n is not None and len(value) != n:
        raise ValueError(f"timeline.{name}: expected {n} values, got {len(value)}")
    return value


_FLOAT = frozenset({float})
_FLOAT_OR_NONE = frozenset({float, type(None)})
_INT = frozenset({int})
_INT_OR_NONE = frozenset({int, type(None)})


def _floats(col: list[Any], name: str, *, optional: bool) -> list[Any]:
    # set(map(type, ...)) runs in C: the common case (all floats) costs one pass, no bytecode
    # per value.
    kinds = set(map(type, col))
    if kinds <= (_FLOAT_OR_NONE if optional else _FLOAT):
        return col
    out: list[Any] = []
    for v in col:
        t = type(v)
        if t is float or (optional and v is None):
            out.append(v)
        elif t is int:
            out.append(float(v))
        else:
            raise ValueError(f"timeline.{name}: expected a number, got {t.__name__}")
    return out


def _ints(col: list[Any], name: str, *, optional: bool) -> list[Any]:
    kinds = set(map(type, col))
    if not kinds <= (_INT_OR_NONE if optional else _INT):
        bad = next(iter(kinds - (_INT_OR_NONE if optional else _INT)))
        raise ValueError(f"timeline.{name}: expected an integer, got {bad.__name__}")
    if not _in_range(col):
        raise ValueError(f"timeline.{name}: integer beyond 64 bits")
    return col


def timeline_from_columns(data: Any) -> tuple[TimelinePoint, ...]:
    """Inverse of ``timeline_to_columns``, as strict as ``from_jsonable``: ``ValueError`` for a
    missing column, a column of the wrong length or a value of the wrong type."""
    if not isinstance(data, dict):
        raise ValueError("timeline: expected an object")
    unknown = data.keys() - {"t_s", "width_s", "samples", "host_cpu_cores", "host_rss_max_bytes"}
    unknown -= set(_TIMELINE_GPU_FIELDS)
    if unknown:
        raise ValueError(f"timeline: unknown field {sorted(unknown)[0]!r}")
    t_s = _floats(_column(data, "t_s", None), "t_s", optional=False)
    n = len(t_s)
    width_s = _floats(_column(data, "width_s", n), "width_s", optional=False)
    samples = _ints(_column(data, "samples", n), "samples", optional=False)
    cores = _floats(_column(data, "host_cpu_cores", n), "host_cpu_cores", optional=True)
    rss = _ints(_column(data, "host_rss_max_bytes", n), "host_rss_max_bytes", optional=True)
    per_gpu: list[list[tuple[Any, ...]]] = []
    gpu_columns: list[tuple[list[Any], ...]] = []
    width: int | None = None
    for name in _TIMELINE_GPU_FIELDS:
        cols = _column(data, name, width)
        width = len(cols)
        checked = []
        for col in cols:
            if not isinstance(col, list) or len(col) != n:
                raise ValueError(f"timeline.{name}: expected {n} values per GPU")
            if name == "gpu_memory_used_max_bytes":
                checked.append(_ints(col, name, optional=True))
            else:
                checked.append(_floats(col, name, optional=True))
        per_gpu.append(list(zip(*checked, strict=True)) if checked else [()] * n)
        gpu_columns.append(tuple(checked))
    utils, mems, powers = per_gpu
    points = build_points((t_s, width_s, samples, utils, mems, powers, cores, rss), n)
    return ColumnTimeline.of(
        points,
        TimelineColumns(
            t_s=t_s,
            width_s=width_s,
            samples=samples,
            host_cpu_cores=cores,
            host_rss_max_bytes=rss,
            gpu_utilization_pct=gpu_columns[0],
            gpu_memory_used_max_bytes=gpu_columns[1],
            gpu_power_w=gpu_columns[2],
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineColumns:
    """The checked columns a ``ColumnTimeline``'s points were built from: one list per field,
    and one list per GPU (in ``NodeRecord.gpus`` order) of each per-GPU field. Private to the
    record's timeline: never changed after it is built."""

    t_s: list[float]
    width_s: list[float]
    samples: list[int]
    host_cpu_cores: list[float | None]
    host_rss_max_bytes: list[int | None]
    gpu_utilization_pct: tuple[list[float | None], ...]
    gpu_memory_used_max_bytes: tuple[list[int | None], ...]
    gpu_power_w: tuple[list[float | None], ...]

    @property
    def gpu_count(self) -> int:
        """How many GPUs each point has values for."""
        return len(self.gpu_utilization_pct)


class ColumnTimeline(tuple):  # type: ignore[type-arg]
    """A decoded record's timeline: the tuple of its ``TimelinePoint``s (equal to, hashed and
    used as that plain tuple), which also keeps the sealed record's checked columns
    (``columns``), so that the store packs the timeline (``store.codec.encode_timeline``)
    from them instead of reading every point back: for a 4-GPU hour that read was about a
    third of the packing. Copies and pickles are plain tuples (no second copy of the values
    travels); ``dataclasses.replace`` with another timeline drops the columns with it."""

    columns: TimelineColumns

    @classmethod
    def of(cls, points: Sequence[TimelinePoint], columns: TimelineColumns) -> ColumnTimeline:
        """``points`` (built from ``columns``, in order) with their columns."""
        out = cls(points)
        out.columns = columns
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (tuple(self),))


def kept_columns(points: Sequence[TimelinePoint]) -> TimelineColumns | None:
    """The columns ``points`` were decoded from (a ``ColumnTimeline``), else ``None``."""
    return points.columns if type(points) is ColumnTimeline else None


def _fast_build_ok() -> bool:
    names = tuple(f.name for f in dataclasses.fields(TimelinePoint))
    return (
        names == _POINT_FIELDS
        and not hasattr(TimelinePoint, "__post_init__")
        and all(
            isinstance(getattr(TimelinePoint, n, None), types.MemberDescriptorType) for n in names
        )
    )


_POINT_FIELDS = (
    "t_s",
    "width_s",
    "samples",
    "gpu_utilization_pct",
    "gpu_memory_used_max_bytes",
    "gpu_power_w",
    "host_cpu_cores",
    "host_rss_max_bytes",
)


def build_points(columns: tuple[Sequence[Any], ...], n: int) -> tuple[TimelinePoint, ...]:
    """``TimelinePoint``s from checked columns.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
    for 360 points of 8 fields was a third of decoding a record. The points are instead
    allocated empty and filled column by column through the slot descriptors, in C loops.
    Used only while ``TimelinePoint`` is a plain slotted dataclass with exactly these fields
    and no ``__post_init__`` (checked once); otherwise the constructor is called.
    """
    if not _FAST_BUILD:
        return tuple(map(TimelinePoint, *columns))
    points = list(map(object.__new__, itertools.repeat(TimelinePoint, n)))
    for name, column in zip(_POINT_FIELDS, columns, strict=True):
        collections.deque(map(getattr(TimelinePoint, name).__set__, points, column), maxlen=0)
    return tuple(points)


_FAST_BUILD = _fast_build_ok()
