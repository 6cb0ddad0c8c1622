"""The driver's sub-interval utilization samples (``nvmlDeviceGetSamples``), made honest.

Three properties of the driver's buffer that a plain "everything newer than the last
timestamp" cursor gets wrong:

* on some drivers the buffer runs dry while the GPU is idle: no sample is recorded for those
  periods, so a mean over the samples alone is biased toward the busy ones. A gap longer than
  the sampling period (estimated from the samples themselves, never under 1/10 s) is filled
  with 0 % samples, one per missed period, bounded by ``MAX_FILL``; once the driver has
  recorded a 0 % sample it is known to record idle periods (an H200 on 580.159 does), and a
  gap there is samples older than its buffer (14 s on that H200), which are not filled;
* values outside 0–100 occur (values near 290000 are reported on MIG parents): dropped;
* timestamps are CPU time in µs: after the clock steps backward, every new sample is older
  than the cursor and the cursor would stall until the clock caught up. When the caller's
  clock is behind the cursor, the cursor restarts (the next reading only primes it again).

The samples are fetched with one C call (``fetch``) into a buffer kept per GPU, not through
pynvml's wrapper, which makes two: one for the count, one for the samples (each about 1 ms on
an H100, docs/performance.md). That one call still costs 2.0–2.7 ms on an H200, so
``NvmlSource`` reads the samples at the cumulative counters' cadence, over the interval before
that reading only (``SampleCursor.skip_to``): a window that starts at a reading, whose
distance to its first sample is no sampling period, and that is all 0 % when the driver
recorded nothing in it (``idle_window``). A buffer that a reading fills is grown and the
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
"""Most 0 % samples added per reading (a gap of about 3 minutes at the fastest period, 1/6 s;
of about 17 at 1 s)."""
MIN_PERIOD_US = 100_000
"""Shortest spacing taken for the sampling period, µs. NVML samples every 1/6 s to 1 s
(``nvmlDeviceGetSamples``); two closer samples taken as the period turned every later gap
into hundreds of idle samples (the H100 records of 2026-11-27: about 900 a 1 s reading, the
filler's cap, which needs a period of 1 ms or less)."""
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
    """Shortest spacing seen between two consecutive samples, not under ``MIN_PERIOD_US``: the
    driver's sampling period."""
    records_idle: bool = False
    """The driver has recorded a 0 % sample: its buffer does not run dry while the GPU is idle
    (an H200 on 580.159 keeps a sample every 200 ms, idle or busy, 14 s of them), so a gap is
    samples the buffer no longer holds, not idle time, and is not filled."""
    window: bool = False
    """``last_ts_us`` is the start of a window (a reading's time, ``skip_to``), not a sample's
    timestamp: its distance to the first sample is no sampling period."""

    def skip_to(self, ts_us: int) -> None:
        """Take only the samples newer than ``ts_us`` at the next call: a window that starts
        at a reading, the older samples left unread (no-op before the cursor is primed)."""
        if self.last_ts_us is not None and ts_us > self.last_ts_us:
            self.last_ts_us = ts_us
            self.window = True

    def idle_window(self, now_us: int) -> tuple[float, ...]:
        """A window in which the driver recorded no sample (``NOT_FOUND``; the buffer runs dry
        while the GPU is idle): 0 % samples, one per sampling period up to ``now_us``, as the
        gap filler counts such a gap between two samples. Nothing outside a window, where
        that gap is filled when the next sample comes."""
        if self.records_idle or not self.window or not self.period_us or self.last_ts_us is None:
            return ()
        self.window = False
        missing = min(round((now_us - self.last_ts_us) / self.period_us), MAX_FILL)
        self.last_ts_us = max(self.last_ts_us, now_us)
        return (0.0,) * max(missing, 0)

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
        window, self.window = self.window, False
        last = self.last_ts_us or 0
        horizon = now_us + _CLOCK_SLACK_US
        fresh = sorted((ts, v) for ts, v in samples if last < ts <= horizon)
        if not fresh:
            return ()
        stamps = [ts for ts, _v in fresh]
        if not (priming or window):
            stamps.insert(0, last)
        for a, b in pairwise(stamps):
            if b - a >= MIN_PERIOD_US and (self.period_us is None or b - a < self.period_us):
                self.period_us = b - a
        self.last_ts_us = fresh[-1][0]
        self.records_idle = self.records_idle or any(v == 0.0 for _ts, v in fresh)
        if priming:
            return ()  # the first call returns the buffer from before this job's sampler
        out: list[float] = []
        filled = 0
        previous = last
        for ts, value in fresh:
            gap = ts - previous
            if self.period_us and not self.records_idle and gap > _GAP_FACTOR * self.period_us:
                missing = min(round(gap / self.period_us) - 1, MAX_FILL - filled)
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
