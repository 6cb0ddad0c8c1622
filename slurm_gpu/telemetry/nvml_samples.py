"""The driver's sub-interval utilization samples (``nvmlDeviceGetSamples``), made honest.

Three properties of the driver's buffer that a plain "everything newer than the last
timestamp" cursor gets wrong:

* the buffer runs dry while the GPU is idle: no sample is recorded for those periods, so a
  mean over the samples alone is biased toward the busy ones. A gap longer than the sampling
  period (estimated from the samples themselves) is filled with 0 % samples, one per missed
  period, bounded by ``MAX_FILL``;
* values outside 0–100 occur (values near 290000 are reported on MIG parents): dropped;
* timestamps are CPU time in µs: after the clock steps backward, every new sample is older
  than the cursor and the cursor would stall until the clock caught up. When the caller's
  clock is behind the cursor, the cursor restarts (the next reading only primes it again).

The samples are fetched with one C call per reading (``fetch``) into a buffer kept per GPU,
not through pynvml's wrapper, which makes two: one for the count, one for the samples (each
about 1 ms on an H100, docs/performance.md). A buffer that a reading fills is grown and the
same samples asked again, so none is lost whether a driver answers ``INSUFFICIENT_SIZE`` or
fills what fits (NVML's documented behaviour).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from slurm_gpu.telemetry.nvml_calls import INSUFFICIENT_SIZE, SUCCESS

MAX_FILL = 1000
"""Most 0 % samples added per reading (a 10-minute gap at the fastest period, 1/6 s)."""
_GAP_FACTOR = 1.5
"""A gap counts as idle beyond this many sampling periods (jitter stays below it)."""
_CLOCK_SLACK_US = 2_000_000
FIRST_CAPACITY = 256
"""Samples a GPU's buffer holds at first (16 bytes each): 40 s at 6 samples a second."""
MAX_CAPACITY = 65536
"""Most samples a buffer grows to (1 MiB)."""
_MAX_TRIES = 12


@dataclass(slots=True)
class SampleCursor:
    """Per-GPU position in the driver's sample buffer."""

    last_ts_us: int | None = None
    period_us: int | None = None
    """Shortest spacing seen between two consecutive samples: the driver's sampling period."""

    def since(self, now_us: int) -> int:
        """The timestamp to ask ``nvmlDeviceGetSamples`` for (0 = the whole buffer)."""
        if self.last_ts_us is not None and now_us + _CLOCK_SLACK_US < self.last_ts_us:
            self.last_ts_us = None  # the clock stepped back: start over
        return self.last_ts_us or 0

    def take(self, samples: Iterable[tuple[int, float]], now_us: int) -> tuple[float, ...]:
        """Samples newer than the cursor, oldest first, idle gaps filled with 0 %.

        Samples stamped after ``now_us`` predate a backward clock step and are left out.
        """
        priming = self.last_ts_us is None
        last = self.last_ts_us or 0
        horizon = now_us + _CLOCK_SLACK_US
        fresh = sorted((ts, v) for ts, v in samples if last < ts <= horizon)
        if not fresh:
            return ()
        stamps = [last, *(ts for ts, _v in fresh)] if not priming else [ts for ts, _v in fresh]
        for a, b in pairwise(stamps):
            if b > a and (self.period_us is None or b - a < self.period_us):
                self.period_us = b - a
        self.last_ts_us = fresh[-1][0]
        if priming:
            return ()  # the first call returns the buffer from before this job's sampler
        out: list[float] = []
        filled = 0
        previous = last
        for ts, value in fresh:
            if self.period_us and ts - previous > _GAP_FACTOR * self.period_us:
                missing = min(round((ts - previous) / self.period_us) - 1, MAX_FILL - filled)
                out.extend([0.0] * max(missing, 0))
                filled += max(missing, 0)
            previous = ts
            if 0.0 <= value <= 100.0:
                out.append(float(value))
        return tuple(out)


@dataclass(slots=True)
class SampleBuffer:
    """One GPU's ``nvmlSample_t`` array for ``nvmlDeviceGetSamples``, allocated on first use
    and grown when a reading fills it."""

    capacity: int = 0
    array: Any = field(default=None, repr=False)

    def ensure(self, nv: Any, capacity: int) -> Any:
        if self.array is None or capacity > self.capacity:
            self.capacity = min(max(capacity, FIRST_CAPACITY), MAX_CAPACITY)
            self.array = (nv.c_nvmlSample_t * self.capacity)()
        return self.array


def fetch(
    nv: Any, handle: Any, sample_type: int, since_us: int, buf: SampleBuffer
) -> tuple[int, list[Any]]:
    """(value type, samples newer than ``since_us``) through the C entry point, one call
    unless the buffer is too small; raises pynvml's ``NVMLError`` (``NOT_FOUND``: none new)."""
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetSamples")  # NVMLError if absent
    value_type = ctypes.c_uint(0)
    want = buf.capacity or FIRST_CAPACITY
    for _ in range(_MAX_TRIES):
        array = buf.ensure(nv, want)
        count = ctypes.c_uint(buf.capacity)
        ret = fn(
            handle, ctypes.c_uint(sample_type), ctypes.c_ulonglong(since_us),
            ctypes.byref(value_type), ctypes.byref(count), array,
        )  # fmt: skip
        if ret == INSUFFICIENT_SIZE:
            needed = ctypes.c_uint(0)
            ret = fn(
                handle, ctypes.c_uint(sample_type), ctypes.c_ulonglong(since_us),
                ctypes.byref(value_type), ctypes.byref(needed), None,
            )  # fmt: skip
            if ret != SUCCESS:
                raise nv.NVMLError(ret)
            want = max(int(needed.value) + 16, 2 * buf.capacity)
            continue
        if ret != SUCCESS:
            raise nv.NVMLError(ret)
        n = min(int(count.value), buf.capacity)
        if n >= buf.capacity and buf.capacity < MAX_CAPACITY:
            want = 2 * buf.capacity  # may have been cut short: ask again with room
            continue
        return int(value_type.value), array[:n]
    raise nv.NVMLError(INSUFFICIENT_SIZE)
