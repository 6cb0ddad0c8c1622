"""Sealed records parsed with orjson where installed give what ``json.loads`` gives, for
every text either parser accepts or refuses, except integers beyond 64 bits (orjson reads them
as floats): a record holding one is refused either way."""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest

from slurm_gpu.capture import fastjson, spool
from slurm_gpu.capture.spool import SpoolFormatError
from slurm_gpu.lazy import optional_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_collect import make_record

TEXTS = [
    b'{"schema": "x", "v": [1, 2.5, -0.0, 1e300, null, true], "s": "caf\\u00e9"}',
    b'{"nan": NaN, "inf": Infinity, "minf": -Infinity}',  # not JSON, but json.loads takes it
    b'{"lone": "\\ud800"}',  # a lone surrogate
    b'{"dup": 1, "dup": 2}',
    b"[" * 2000 + b"]" * 2000,  # deeper than orjson's limit
]


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_parsed_as_the_standard_library_parses(text: bytes) -> None:
    try:
        want = json.loads(text)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            fastjson.loads(text)
        return
    got = fastjson.loads(text)
    assert json.dumps(got, allow_nan=True) == json.dumps(want, allow_nan=True)


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": }', b"\xff\xfe"])
def test_not_json_is_a_value_error(text: bytes) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)


def test_orjson_is_used_where_installed() -> None:
    pytest.importorskip("orjson")
    assert optional_module("orjson") is not None


@pytest.mark.parametrize("with_orjson", [True, False])
def test_a_record_with_an_integer_beyond_64_bits_is_refused_either_way(
    with_orjson: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the standard library's parser kept 10**25 as an int, the record decoded, and the
    store's insert of its batch failed at every pass (SQLite's integers are 64-bit)."""
    if not with_orjson:
        monkeypatch.setattr(fastjson, "optional_module", lambda name: None)
    elif optional_module("orjson") is None:
        pytest.skip("orjson is not installed")
    rec = make_record("123", "n1", 1, random.Random(1))
    huge = dataclasses.replace(rec, gpus=(dataclasses.replace(rec.gpus[0], samples=10**25),))
    with pytest.raises(SpoolFormatError):
        spool.decode_record(spool.encode_record(huge))
    assert spool.decode_record(spool.encode_record(rec)) == rec
