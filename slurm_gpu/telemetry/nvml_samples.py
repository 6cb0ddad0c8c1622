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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

MAX_FILL = 1000
"""Most 0 % samples added per reading (a 10-minute gap at the fastest period, 1/6 s)."""
_GAP_FACTOR = 1.5
"""A gap counts as idle beyond this many sampling periods (jitter stays below it)."""
_CLOCK_SLACK_US = 2_000_000


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
