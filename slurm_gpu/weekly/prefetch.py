"""Read a statement's rows on a connection of its own, a few chunks ahead of their reader.

The database driver executes a statement without holding Python's GIL, so while the report
folds one chunk of rows in Python the next chunks can be computed on another core. That holds
for PostgreSQL, whose server computes rows in its own process; SQLite does a grouped
statement's join and sort before its first row, then steps out one row at a time, taking the
GIL back at each step, so there it overlaps nothing measurable (docs/performance.md). At most
``depth`` chunks wait in the queue: memory stays a few chunks, whatever the period.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Sequence
from typing import Any

from sqlalchemy import Engine

#: Longest a reader or the reading thread waits for the other before looking again, seconds.
_POLL_S = 0.5
_END = object()


def in_memory(engine: Engine) -> bool:
    """A SQLite store in memory: another connection would open another, empty, database."""
    return engine.url.get_backend_name() == "sqlite" and engine.url.database in (
        None,
        "",
        ":memory:",
    )


def chunks(
    engine: Engine, stmt: Any, chunk_rows: int, depth: int = 4
) -> Generator[Sequence[Any], None, None]:
    """The rows of ``stmt`` in chunks of ``chunk_rows``, read ahead on a thread with its own
    connection. An error in the thread is raised here; leaving the loop early stops it."""
    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            with engine.connect() as conn:
                result = conn.execution_options(stream_results=True).execute(stmt)
                for part in result.partitions(chunk_rows):
                    if not put(part):
                        return
            put(_END)
        except BaseException as exc:  # handed to the reader, raised there
            put(exc)

    thread = threading.Thread(target=read, name="weekly-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
