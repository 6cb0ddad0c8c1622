"""Fewer garbage collections while a pass builds many long-lived objects.

A collector pass reads the sealed records of an accounting batch (500 jobs) before it stores
them, and a record is mostly its timeline: one ``TimelinePoint`` per bucket (360 for a
one-hour job), all alive until the batch is stored (the pass lets them go then). Under
CPython's default thresholds (a young collection every 700 net allocations, a full one every
100 young ones, when the heap has grown by a quarter) the pass then runs many collections over
a large heap of objects that hold no reference cycle: about a sixth of the collector's time for
1,000 4-GPU jobs when the pass kept every record to its end (``docs/performance.md``).
``fewer_collections`` raises the young threshold for the duration of a pass (the older ones
follow it: they count young collections), and puts the thresholds back after it; the
collector's reference cycles are still found, a little later. The live policy's pass and the
live view (``with_fewer_collections``) and the weekly report's aggregation use it for the same
reason: the answers of Prometheus, or the rows of a week, held while they are folded.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Net allocations between two young collections during a pass (CPython's default: 700).
#: Measured on 1,000 4-GPU jobs: 10,000 removes most of the full collections' cost; the
#: objects a young collection scans stay bounded (a few megabytes).
PASS_THRESHOLD = 10_000


@contextlib.contextmanager
def fewer_collections(threshold: int = PASS_THRESHOLD) -> Iterator[None]:
    """Within the block, a young collection every ``threshold`` net allocations at the least
    (a higher threshold already set is kept); the thresholds in force before are restored
    after it. Nothing changes where automatic collection is off (``gc.disable()`` or a
    threshold of 0)."""
    old = gc.get_threshold()
    if not gc.isenabled() or old[0] == 0 or old[0] >= threshold:
        yield
        return
    gc.set_threshold(threshold, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def with_fewer_collections(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """``func`` run within ``fewer_collections()`` at every call."""

    @functools.wraps(func)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with fewer_collections():
            return func(*args, **kwargs)

    return run


__all__ = ["PASS_THRESHOLD", "fewer_collections", "with_fewer_collections"]
