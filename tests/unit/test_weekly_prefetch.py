"""The weekly report's read-ahead: every row in order, errors raised to the reader, and the
reading thread stopped when the reader leaves early."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from slurm_gpu.weekly import prefetch


def _engine(tmp_path: Path, rows: int) -> Engine:
    engine = create_engine(f"sqlite:///{tmp_path}/t.db")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER PRIMARY KEY)"))
        conn.execute(text("INSERT INTO t (n) VALUES (:n)"), [{"n": i} for i in range(rows)])
    return engine


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "weekly-prefetch")


def test_every_row_in_order_in_chunks(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 1000)
    got = list(prefetch.chunks(engine, text("SELECT n FROM t ORDER BY n"), 64, depth=2))
    assert [len(c) for c in got] == [64] * 15 + [40]
    assert [r[0] for c in got for r in c] == list(range(1000))
    assert _threads() == 0


def test_an_error_in_the_reading_thread_is_raised_to_the_reader(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 10)
    with pytest.raises(OperationalError, match="no such table"):
        list(prefetch.chunks(engine, text("SELECT n FROM missing"), 4))
    assert _threads() == 0


def test_leaving_early_stops_the_reading_thread(tmp_path: Path) -> None:
    engine = _engine(tmp_path, 5000)
    reader = prefetch.chunks(engine, text("SELECT n FROM t ORDER BY n"), 10, depth=1)
    assert [r[0] for r in next(reader)] == list(range(10))
    reader.close()  # what leaving a for loop early does to a generator
    assert _threads() == 0


def test_a_store_in_memory_is_read_in_turn() -> None:
    assert prefetch.in_memory(create_engine("sqlite://"))
    assert not prefetch.in_memory(create_engine("sqlite:////tmp/x.db"))
