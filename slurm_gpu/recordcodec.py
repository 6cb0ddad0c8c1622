"""Plain-JSON encoding of the frozen records in ``slurm_gpu.records``.

``to_jsonable`` turns a record into dicts, lists and scalars; ``from_jsonable`` rebuilds it from
the type hints, strictly: a missing required field, an unknown field or a value of the wrong
type raises ``ValueError`` (callers turn it into ``SpoolFormatError``). Fields with a default may
be left out, which keeps spool lines short.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

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


def _scalar(kind: type[Any]) -> _Converter:
    def convert(value: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
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

            def convert_var(value: Any) -> Any:
                if not isinstance(value, list):
                    raise ValueError("expected a list")
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
