"""Streaming aggregates: fold readings one at a time into O(1)-memory state.

``NodeAggregator`` takes one reading time at a time (every GPU's ``GpuSample`` plus the job's
``HostSample``) and can at any moment produce the ``NodeRecord`` the epilog seals. Its memory
does not grow with the job's length: distributions are 101 bins, the timeline keeps at most
``timeline_points`` buckets (when full, adjacent pairs merge and the bucket width doubles), and
sets (pids, XIDs) are capped. ``state()`` / ``NodeAggregator.from_state`` turn it into plain
JSON for checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from slurm_gpu.capture.recordcodec import from_jsonable, to_jsonable
from slurm_gpu.records import (
    STALL_CPU_BINS,
    STALL_DUTY_BINS,
    Distribution,
    GpuInfo,
    GpuSample,
    GpuSummary,
    HostSample,
    HostSummary,
    NodeRecord,
    TimelinePoint,
    stall_bin,
)
from slurm_gpu.telemetry.base import THROTTLE_POWER_MASK, THROTTLE_THERMAL_MASK

STATE_VERSION = 1
MAX_PIDS = 16
MAX_XIDS = 64
#: A reading stands for the time since the previous one, but never more than this many
#: intervals: a sampler that was stopped for an hour must not count an hour of throttling.
MAX_GAP_INTERVALS = 2.0


class DistAccumulator:
    """Counts of percentages in 1 %-wide bins plus their exact sum (see ``Distribution``)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * 101
        self.total = 0.0

    def add(self, value: float) -> None:
        v = 0.0 if value < 0 else 100.0 if value > 100 else float(value)
        self.counts[int(v)] += 1
        self.total += v

    def freeze(self) -> Distribution:
        return Distribution(counts=tuple(self.counts), total=self.total)

    def state(self) -> list[Any]:
        return [list(self.counts), self.total]

    @classmethod
    def from_state(cls, data: list[Any]) -> DistAccumulator:
        out = cls()
        counts, total = data
        if len(counts) != 101:
            raise ValueError("distribution needs 101 bins")
        out.counts = [int(c) for c in counts]
        out.total = float(total)
        return out


def distribution_of(values: Iterable[float]) -> Distribution:
    """The ``Distribution`` the sampler would build from ``values`` (percent), in one call."""
    acc = DistAccumulator()
    for v in values:
        acc.add(v)
    return acc.freeze()


class _Mean:
    """Running sum and count of a metric that may be missing."""

    __slots__ = ("n", "sum")

    def __init__(self) -> None:
        self.sum = 0.0
        self.n = 0

    def add(self, value: float | None) -> None:
        if value is not None:
            self.sum += value
            self.n += 1

    @property
    def mean(self) -> float | None:
        return self.sum / self.n if self.n else None


def _max(old: Any, new: Any) -> Any:
    if new is None:
        return old
    return new if old is None or new > old else old


class _Throttle:
    """Throttled seconds of one cause (power or thermal) and the seconds over which it was
    known.

    An interval is counted from the driver's cumulative violation counter where it was
    read at both ends (exact, in ns, and never more than the interval), else from the
    reading's bitmask (the whole interval when a bit of ``mask`` is set), else not at all: it
    is then unknown, and left out of ``known_s``. Readings without the counter after one
    with it (the counters are read at a slower cadence than the rest, or one read failed)
    are held as pending: the next counter covers them all at once, exactly. A counter that
    went backwards (driver reload), an unavailable reading or the end of the job without a
    last counter breaks the chain: the pending readings are then counted from their
    bitmasks, and the next interval too. ``known_s`` is ``None`` when counting began mid-job
    (a checkpoint written before it was kept), which the record passes on as "not counted".
    """

    __slots__ = ("known_s", "mask", "pending_known_s", "pending_s", "pending_throttled_s",
                 "prev_ns")  # fmt: skip

    def __init__(self, mask: int, known_s: float | None = 0.0) -> None:
        self.mask = mask
        self.known_s = known_s
        self.prev_ns: int | None = None
        self.pending_s = 0.0
        """Seconds of the readings since the counter was last read (it will cover them)."""
        self.pending_known_s = 0.0
        """Of those, the seconds that had a bitmask, and the seconds it said throttled:
        what they count for if the chain breaks."""
        self.pending_throttled_s = 0.0

    def add(self, counter_ns: int | None, reasons: int | None, dt_s: float) -> float:
        """Fold one reading standing for ``dt_s`` seconds; returns the throttled seconds it
        settles (its own, or with a counter, also those of the pending readings)."""
        prev = self.prev_ns
        if counter_ns is None and prev is not None:
            self.pending_s += dt_s
            if reasons is not None:
                self.pending_known_s += dt_s
                if reasons & self.mask:
                    self.pending_throttled_s += dt_s
            return 0.0
        self.prev_ns = counter_ns
        if counter_ns is not None and prev is not None and counter_ns >= prev:
            span = self.pending_s + dt_s
            self.pending_s = self.pending_known_s = self.pending_throttled_s = 0.0
            if self.known_s is not None:
                self.known_s += span
            return min(span, (counter_ns - prev) / 1e9)
        settled = self._settle_pending() if self.pending_s else 0.0
        if reasons is not None:
            throttled = dt_s if reasons & self.mask else 0.0
        else:
            return settled
        if self.known_s is not None:
            self.known_s += dt_s
        return settled + throttled

    def flush(self) -> float:
        """Break the chain (the GPU did not answer): count the pending readings from their
        bitmasks; returns their throttled seconds."""
        self.prev_ns = None
        return self._settle_pending()

    def _settle_pending(self) -> float:
        throttled = self.pending_throttled_s
        if self.known_s is not None:
            self.known_s += self.pending_known_s
        self.pending_s = self.pending_known_s = self.pending_throttled_s = 0.0
        return throttled

    def state(self) -> list[Any]:
        return [self.known_s, self.prev_ns, self.pending_s, self.pending_known_s,
                self.pending_throttled_s]  # fmt: skip

    @classmethod
    def from_state(cls, mask: int, data: list[Any]) -> _Throttle:
        known, prev = data[0], data[1]
        out = cls(mask, None if known is None else float(known))
        out.prev_ns = None if prev is None else int(prev)
        if len(data) >= 5:  # checkpoints before the counters' cadence have no pending part
            out.pending_s, out.pending_known_s, out.pending_throttled_s = (
                float(data[2]), float(data[3]), float(data[4])
            )  # fmt: skip
        return out


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _plus(known_s: float | None, pending_s: float) -> float | None:
    return None if known_s is None else known_s + pending_s


def _nvlink_total(s: GpuSample) -> int | None:
    if s.nvlink_tx_bytes is None and s.nvlink_rx_bytes is None:
        return None
    return (s.nvlink_tx_bytes or 0) + (s.nvlink_rx_bytes or 0)


# Scalar attributes of GpuAccumulator saved in checkpoints, in order.
_GPU_SCALARS = (
    "samples",
    "samples_available",
    "first_time_s",
    "last_time_s",
    "idle_samples",
    "active_first_time_s",
    "active_last_time_s",
    "memory_used_max_bytes",
    "power_max_w",
    "power_integral_j",
    "energy_first_mj",
    "energy_last_mj",
    "energy_counter_ok",
    "temperature_max_c",
    "throttle_power_s",
    "throttle_thermal_s",
    "nvlink_first",
    "nvlink_prev",
    "nvlink_idle",
    "ecc_c_first",
    "ecc_c_last",
    "ecc_u_first",
    "ecc_u_last",
    "process_seen",
    "max_processes",
)
_GPU_MEANS = ("mem", "power", "clock", "pcie_tx", "pcie_rx", "sm", "tensor", "mem_util")
_GPU_LISTS = ("xids", "pids")


class GpuAccumulator:
    """Streaming summary of one GPU."""

    def __init__(self, info: GpuInfo, idle_threshold_pct: float) -> None:
        self.info = info
        self.idle_threshold_pct = idle_threshold_pct
        self.utilization = DistAccumulator()
        self.sub_samples = DistAccumulator()
        self.samples = 0
        self.samples_available = 0
        self.first_time_s: float | None = None
        self.last_time_s: float | None = None
        self.idle_samples = 0
        self.active_first_time_s: float | None = None
        self.active_last_time_s: float | None = None
        self.memory_used_max_bytes: int | None = None
        self.power_max_w: float | None = None
        self.power_integral_j = 0.0
        self.energy_first_mj: int | None = None
        self.energy_last_mj: int | None = None
        self.energy_counter_ok = True
        self.temperature_max_c: float | None = None
        self.throttle_power_s = 0.0
        self.throttle_thermal_s = 0.0
        self.throttle_power = _Throttle(THROTTLE_POWER_MASK)
        self.throttle_thermal = _Throttle(THROTTLE_THERMAL_MASK)
        self.nvlink_first: int | None = None
        self.nvlink_prev: int | None = None
        self.nvlink_idle = 0
        self.ecc_c_first: int | None = None
        self.ecc_c_last: int | None = None
        self.ecc_u_first: int | None = None
        self.ecc_u_last: int | None = None
        self.process_seen = False
        self.max_processes = 0
        self.process_list_unread = 0
        self.stall_grid: list[int] | None = None
        self.xids: list[int] = []
        self.pids: list[int] = []
        self.mem = _Mean()
        self.power = _Mean()
        self.clock = _Mean()
        self.pcie_tx = _Mean()
        self.pcie_rx = _Mean()
        self.sm = _Mean()
        self.tensor = _Mean()
        self.mem_util = _Mean()

    def add(self, s: GpuSample, dt_s: float) -> bool | None:
        """Fold one reading that stands for ``dt_s`` seconds; returns whether it was idle
        (``None`` when the duty cycle was not read)."""
        self.samples += 1
        if self.first_time_s is None:
            self.first_time_s = s.time_s
        self.last_time_s = s.time_s
        if not s.available:
            # Counters read after a gap in which the GPU did not answer cover that gap too.
            self.throttle_power_s += self.throttle_power.flush()
            self.throttle_thermal_s += self.throttle_thermal.flush()
            return None
        self.samples_available += 1
        idle: bool | None = None
        if s.utilization_pct is not None:
            self.utilization.add(s.utilization_pct)
            idle = s.utilization_pct <= self.idle_threshold_pct
            if idle:
                self.idle_samples += 1
            else:
                if self.active_first_time_s is None:
                    self.active_first_time_s = s.time_s
                self.active_last_time_s = s.time_s
        for v in s.utilization_samples_pct:
            self.sub_samples.add(v)
        self.memory_used_max_bytes = _max(self.memory_used_max_bytes, s.memory_used_bytes)
        self.mem.add(s.memory_used_bytes)
        if s.power_w is not None:
            self.power.add(s.power_w)
            self.power_max_w = _max(self.power_max_w, s.power_w)
            self.power_integral_j += s.power_w * dt_s
        if s.energy_mj is not None:
            if self.energy_first_mj is None:
                self.energy_first_mj = s.energy_mj
            elif self.energy_last_mj is not None and s.energy_mj < self.energy_last_mj:
                self.energy_counter_ok = False  # driver reloaded: the counter restarted
            self.energy_last_mj = s.energy_mj
        self.clock.add(s.sm_clock_mhz)
        self.temperature_max_c = _max(self.temperature_max_c, s.temperature_c)
        self.throttle_power_s += self.throttle_power.add(
            s.violation_power_ns, s.throttle_reasons, dt_s
        )
        self.throttle_thermal_s += self.throttle_thermal.add(
            s.violation_thermal_ns, s.throttle_reasons, dt_s
        )
        self.pcie_tx.add(s.pcie_tx_bytes_per_s)
        self.pcie_rx.add(s.pcie_rx_bytes_per_s)
        nvl = _nvlink_total(s)
        if nvl is not None:
            if self.nvlink_first is None:
                self.nvlink_first = nvl
            elif idle and self.nvlink_prev is not None and nvl >= self.nvlink_prev:
                self.nvlink_idle += nvl - self.nvlink_prev
            self.nvlink_prev = nvl
        if s.ecc_corrected_total is not None:
            if self.ecc_c_first is None:
                self.ecc_c_first = s.ecc_corrected_total
            self.ecc_c_last = s.ecc_corrected_total
        if s.ecc_uncorrected_total is not None:
            if self.ecc_u_first is None:
                self.ecc_u_first = s.ecc_uncorrected_total
            self.ecc_u_last = s.ecc_uncorrected_total
        for xid in s.xid_events:
            if xid not in self.xids and len(self.xids) < MAX_XIDS:
                self.xids.append(xid)
        if s.processes is None:
            self.process_list_unread += 1
        elif s.processes:
            self.process_seen = True
            self.max_processes = max(self.max_processes, len(s.processes))
            for p in s.processes:
                if len(self.pids) < MAX_PIDS and p.pid not in self.pids:
                    self.pids.append(p.pid)
        self.sm.add(s.sm_active_pct)
        self.tensor.add(s.tensor_active_pct)
        self.mem_util.add(s.memory_utilization_pct)
        return idle

    def add_counters(self, s: GpuSample, dt_s: float) -> None:
        """Fold a read of the cumulative counters alone (``read_counters`` at the seal), made
        ``dt_s`` seconds after the last reading: the energy and ECC totals and the throttled
        time run to it. Not a reading: nothing else changes."""
        if not s.available:
            return
        if s.energy_mj is not None and self.energy_first_mj is not None:
            if self.energy_last_mj is not None and s.energy_mj < self.energy_last_mj:
                self.energy_counter_ok = False
            self.energy_last_mj = s.energy_mj
        if s.ecc_corrected_total is not None and self.ecc_c_first is not None:
            self.ecc_c_last = s.ecc_corrected_total
        if s.ecc_uncorrected_total is not None and self.ecc_u_first is not None:
            self.ecc_u_last = s.ecc_uncorrected_total
        for throttle, counter in (
            (self.throttle_power, s.violation_power_ns),
            (self.throttle_thermal, s.violation_thermal_ns),
        ):
            if counter is not None and throttle.prev_ns is not None:
                settled = throttle.add(counter, None, dt_s)
                if throttle is self.throttle_power:
                    self.throttle_power_s += settled
                else:
                    self.throttle_thermal_s += settled

    def add_stall(self, duty_pct: float, cpu_busy_pct: float) -> None:
        """Count one reading in the (duty, cores busy) grid (``GpuSummary.stall_grid``)."""
        if self.stall_grid is None:
            self.stall_grid = [0] * (STALL_DUTY_BINS * STALL_CPU_BINS)
        self.stall_grid[stall_bin(duty_pct, cpu_busy_pct)] += 1

    def summary(self) -> GpuSummary:
        energy: float | None = None
        if (
            self.energy_counter_ok
            and self.energy_first_mj is not None
            and self.energy_last_mj is not None
            and self.energy_last_mj > self.energy_first_mj
        ):
            energy = (self.energy_last_mj - self.energy_first_mj) / 1000.0
        elif self.power.n:
            energy = self.power_integral_j
        # Readings after the last counter read (none when the sampler sealed with a read of
        # the counters) count from their bitmasks.
        power, thermal = self.throttle_power, self.throttle_thermal
        nvlink = None
        if self.nvlink_first is not None and self.nvlink_prev is not None:
            nvlink = max(0, self.nvlink_prev - self.nvlink_first)

        def delta(first: int | None, last: int | None) -> int | None:
            return None if first is None or last is None else max(0, last - first)

        return GpuSummary(
            info=self.info,
            samples=self.samples,
            samples_available=self.samples_available,
            first_time_s=self.first_time_s,
            last_time_s=self.last_time_s,
            utilization=self.utilization.freeze(),
            sub_samples=self.sub_samples.freeze(),
            idle_samples=self.idle_samples,
            active_first_time_s=self.active_first_time_s,
            active_last_time_s=self.active_last_time_s,
            memory_used_max_bytes=self.memory_used_max_bytes,
            memory_used_mean_bytes=self.mem.mean,
            power_mean_w=self.power.mean,
            power_max_w=self.power_max_w,
            energy_j=energy,
            sm_clock_mean_mhz=self.clock.mean,
            temperature_max_c=self.temperature_max_c,
            throttle_power_s=self.throttle_power_s + power.pending_throttled_s,
            throttle_thermal_s=self.throttle_thermal_s + thermal.pending_throttled_s,
            throttle_power_known_s=_plus(power.known_s, power.pending_known_s),
            throttle_thermal_known_s=_plus(thermal.known_s, thermal.pending_known_s),
            pcie_tx_mean_bytes_per_s=self.pcie_tx.mean,
            pcie_rx_mean_bytes_per_s=self.pcie_rx.mean,
            nvlink_bytes=nvlink,
            nvlink_bytes_while_idle=self.nvlink_idle if nvlink is not None else None,
            ecc_corrected=delta(self.ecc_c_first, self.ecc_c_last),
            ecc_uncorrected=delta(self.ecc_u_first, self.ecc_u_last),
            xid_events=tuple(self.xids),
            process_seen=self.process_seen,
            max_processes=self.max_processes,
            pids=tuple(self.pids),
            sm_active_mean_pct=self.sm.mean,
            tensor_active_mean_pct=self.tensor.mean,
            memory_utilization_mean_pct=self.mem_util.mean,
            process_list_unread=self.process_list_unread,
            stall_grid=tuple(self.stall_grid) if self.stall_grid is not None else (),
        )

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _GPU_SCALARS}
        out.update({name: list(getattr(self, name)) for name in _GPU_LISTS})
        out.update({name: [getattr(self, name).sum, getattr(self, name).n] for name in _GPU_MEANS})
        out["info"] = to_jsonable(self.info)
        out["utilization"] = self.utilization.state()
        out["sub_samples"] = self.sub_samples.state()
        out["process_list_unread"] = self.process_list_unread
        out["stall_grid"] = self.stall_grid
        out["throttle_power"] = self.throttle_power.state()
        out["throttle_thermal"] = self.throttle_thermal.state()
        return out

    @classmethod
    def from_state(cls, data: dict[str, Any], idle_threshold_pct: float) -> GpuAccumulator:
        out = cls(from_jsonable(GpuInfo, data["info"]), idle_threshold_pct)
        for name in _GPU_SCALARS:
            setattr(out, name, data[name])
        for name in _GPU_LISTS:
            setattr(out, name, [int(v) for v in data[name]])
        for name in _GPU_MEANS:
            mean = _Mean()
            saved = data.get(name)
            # A checkpoint of an older release lacks the means added since: they start empty
            # and cover the readings after the upgrade.
            if saved is not None:
                mean.sum, mean.n = float(saved[0]), int(saved[1])
            setattr(out, name, mean)
        out.utilization = DistAccumulator.from_state(data["utilization"])
        out.sub_samples = DistAccumulator.from_state(data["sub_samples"])
        # Checkpoints written before these were counted: the list's readings before the
        # upgrade are unknown, and the grid starts empty.
        unread = data.get("process_list_unread")
        out.process_list_unread = int(unread) if unread is not None else out.samples_available
        grid = data.get("stall_grid")
        if grid is not None:
            if len(grid) != STALL_DUTY_BINS * STALL_CPU_BINS:
                raise ValueError("stall grid has the wrong size")
            out.stall_grid = [int(v) for v in grid]
        # Checkpoints written before the known time was counted: the seconds before the
        # upgrade were counted over an unknown span, so the record says "not counted".
        for name, mask in (
            ("throttle_power", THROTTLE_POWER_MASK),
            ("throttle_thermal", THROTTLE_THERMAL_MASK),
        ):
            saved = data.get(name)
            setattr(
                out,
                name,
                _Throttle(mask, None) if saved is None else _Throttle.from_state(mask, saved),
            )
        return out


_HOST_SCALARS = (
    "method",
    "samples",
    "allocated_cores",
    "cpu_first",
    "cpu_last",
    "prev_cpu",
    "prev_time",
    "rss_max",
    "rss_sum",
    "rss_n",
    "io_r_first",
    "io_r_last",
    "io_w_first",
    "io_w_last",
)


class HostAccumulator:
    """Streaming summary of the job's processes on this node."""

    def __init__(self, allocated_cores: int | None = None) -> None:
        self.method = "none"
        self.samples = 0
        self.allocated_cores = allocated_cores
        self.cpu_first: float | None = None
        self.cpu_last: float | None = None
        self.prev_cpu: float | None = None
        self.prev_time: float | None = None
        self.rss_max: int | None = None
        self.rss_sum = 0.0
        self.rss_n = 0
        self.io_r_first: int | None = None
        self.io_r_last: int | None = None
        self.io_w_first: int | None = None
        self.io_w_last: int | None = None
        self.cores_busy = DistAccumulator()

    def add(self, h: HostSample) -> float | None:
        """Fold one reading; returns the cores busy since the previous reading, if known."""
        self.samples += 1
        self.method = h.method
        cores: float | None = None
        if h.cpu_time_s is not None:
            if self.cpu_first is None:
                self.cpu_first = h.cpu_time_s
            self.cpu_last = h.cpu_time_s
            if (
                self.prev_cpu is not None
                and self.prev_time is not None
                and h.time_s > self.prev_time
            ):
                cores = max(0.0, (h.cpu_time_s - self.prev_cpu) / (h.time_s - self.prev_time))
                if self.allocated_cores:
                    self.cores_busy.add(100.0 * cores / self.allocated_cores)
            self.prev_cpu = h.cpu_time_s
            self.prev_time = h.time_s
        if h.rss_bytes is not None:
            self.rss_max = _max(self.rss_max, h.rss_bytes)
            self.rss_sum += h.rss_bytes
            self.rss_n += 1
        if h.io_read_bytes is not None:
            if self.io_r_first is None:
                self.io_r_first = h.io_read_bytes
            self.io_r_last = h.io_read_bytes
        if h.io_write_bytes is not None:
            if self.io_w_first is None:
                self.io_w_first = h.io_write_bytes
            self.io_w_last = h.io_write_bytes
        return cores

    def summary(self) -> HostSummary:
        def delta(first: float | None, last: float | None) -> Any:
            return None if first is None or last is None else max(0, last - first)

        return HostSummary(
            method=self.method,
            samples=self.samples,
            cpu_time_s=delta(self.cpu_first, self.cpu_last),
            cpu_cores_busy=self.cores_busy.freeze(),
            allocated_cores=self.allocated_cores,
            rss_max_bytes=self.rss_max,
            rss_mean_bytes=self.rss_sum / self.rss_n if self.rss_n else None,
            io_read_bytes=delta(self.io_r_first, self.io_r_last),
            io_write_bytes=delta(self.io_w_first, self.io_w_last),
        )

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _HOST_SCALARS}
        out["cores_busy"] = self.cores_busy.state()
        return out

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> HostAccumulator:
        out = cls()
        for name in _HOST_SCALARS:
            setattr(out, name, data[name])
        out.cores_busy = DistAccumulator.from_state(data["cores_busy"])
        return out


class _Bucket:
    """Sums and peaks of one timeline bucket. Lists are per GPU."""

    __slots__ = (
        "cores_n",
        "cores_sum",
        "mem_max",
        "power_n",
        "power_sum",
        "rss_max",
        "samples",
        "util_n",
        "util_sum",
    )

    def __init__(self, n_gpus: int) -> None:
        self.samples = 0
        self.util_sum = [0.0] * n_gpus
        self.util_n = [0] * n_gpus
        self.mem_max: list[int | None] = [None] * n_gpus
        self.power_sum = [0.0] * n_gpus
        self.power_n = [0] * n_gpus
        self.cores_sum = 0.0
        self.cores_n = 0
        self.rss_max: int | None = None

    def merge(self, other: _Bucket) -> None:
        self.samples += other.samples
        for i in range(len(self.util_sum)):
            self.util_sum[i] += other.util_sum[i]
            self.util_n[i] += other.util_n[i]
            self.mem_max[i] = _max(self.mem_max[i], other.mem_max[i])
            self.power_sum[i] += other.power_sum[i]
            self.power_n[i] += other.power_n[i]
        self.cores_sum += other.cores_sum
        self.cores_n += other.cores_n
        self.rss_max = _max(self.rss_max, other.rss_max)

    def state(self) -> list[Any]:
        return [getattr(self, name) for name in self.__slots__]

    @classmethod
    def from_state(cls, data: list[Any], n_gpus: int) -> _Bucket:
        out = cls(n_gpus)
        for name, value in zip(cls.__slots__, data, strict=True):
            setattr(out, name, value)
        return out


class Timeline:
    """At most ``max_points`` buckets of equal width starting at ``start_s``.

    A reading past the last bucket merges adjacent pairs and doubles the width, as often as
    needed, so memory stays constant whatever the job length and totals are preserved.
    """

    def __init__(self, n_gpus: int, max_points: int, width_s: float, start_s: float) -> None:
        self.n_gpus = n_gpus
        self.max_points = max(2, max_points)
        self.width_s = width_s
        self.start_s = start_s
        self.buckets: list[_Bucket | None] = []
        # The JSON of the first ``_clean`` buckets' states as of the last ``state_json``:
        # readings go forward in time, so only the last buckets change between checkpoints.
        self._encoded: list[str] = []
        self._clean = 0

    def _compact(self) -> None:
        merged: list[_Bucket | None] = []
        for i in range(0, len(self.buckets), 2):
            a = self.buckets[i]
            b = self.buckets[i + 1] if i + 1 < len(self.buckets) else None
            if a is None:
                merged.append(b)
            else:
                if b is not None:
                    a.merge(b)
                merged.append(a)
        self.buckets = merged
        self.width_s *= 2
        self._clean = 0

    def add(
        self,
        time_s: float,
        gpu_util: Sequence[float | None],
        gpu_mem: Sequence[int | None],
        gpu_power: Sequence[float | None],
        host_cores: float | None,
        host_rss: int | None,
    ) -> None:
        k = max(0, int((time_s - self.start_s) // self.width_s))
        while k >= self.max_points:
            self._compact()
            k = max(0, int((time_s - self.start_s) // self.width_s))
        if k >= len(self.buckets):
            self.buckets.extend([None] * (k + 1 - len(self.buckets)))
        if k < self._clean:
            self._clean = k
        bucket = self.buckets[k]
        if bucket is None:
            bucket = self.buckets[k] = _Bucket(self.n_gpus)
        bucket.samples += 1
        for i in range(self.n_gpus):
            u = gpu_util[i]
            if u is not None:
                bucket.util_sum[i] += u
                bucket.util_n[i] += 1
            bucket.mem_max[i] = _max(bucket.mem_max[i], gpu_mem[i])
            p = gpu_power[i]
            if p is not None:
                bucket.power_sum[i] += p
                bucket.power_n[i] += 1
        if host_cores is not None:
            bucket.cores_sum += host_cores
            bucket.cores_n += 1
        bucket.rss_max = _max(bucket.rss_max, host_rss)

    def points(self) -> tuple[TimelinePoint, ...]:
        out = []
        for k, b in enumerate(self.buckets):
            if b is None or not b.samples:
                continue
            out.append(
                TimelinePoint(
                    t_s=self.start_s + k * self.width_s,
                    width_s=self.width_s,
                    samples=b.samples,
                    gpu_utilization_pct=tuple(
                        s / n if n else None for s, n in zip(b.util_sum, b.util_n, strict=True)
                    ),
                    gpu_memory_used_max_bytes=tuple(b.mem_max),
                    gpu_power_w=tuple(
                        s / n if n else None for s, n in zip(b.power_sum, b.power_n, strict=True)
                    ),
                    host_cpu_cores=b.cores_sum / b.cores_n if b.cores_n else None,
                    host_rss_max_bytes=b.rss_max,
                )
            )
        return tuple(out)

    def state(self) -> dict[str, Any]:
        return {
            "max_points": self.max_points,
            "width_s": self.width_s,
            "start_s": self.start_s,
            "buckets": [b.state() if b is not None else None for b in self.buckets],
        }

    def state_json(self) -> str:
        """``state()`` as compact JSON; the buckets unchanged since the last call are not
        encoded again (a long job's timeline is most of a checkpoint: 57 KB, about 1 ms to
        encode, at 512 buckets of 8 GPUs)."""
        encoded = self._encoded[: self._clean]
        for b in self.buckets[self._clean :]:
            encoded.append("null" if b is None else _compact_json(b.state()))
        self._encoded, self._clean = encoded, len(encoded)
        head = _compact_json(
            {"max_points": self.max_points, "width_s": self.width_s, "start_s": self.start_s}
        )
        return head[:-1] + ',"buckets":[' + ",".join(encoded) + "]}"

    @classmethod
    def from_state(cls, data: dict[str, Any], n_gpus: int) -> Timeline:
        out = cls(n_gpus, int(data["max_points"]), float(data["width_s"]), float(data["start_s"]))
        out.buckets = [
            _Bucket.from_state(b, n_gpus) if b is not None else None for b in data["buckets"]
        ]
        return out


class NodeAggregator:
    """Everything the sampler knows about one job on this node, in constant memory."""

    def __init__(
        self,
        *,
        job_id: str,
        hostname: str,
        uid: int | None,
        interval_s: float,
        source: str,
        gpus: Sequence[GpuInfo],
        started_s: float,
        idle_threshold_pct: float = 1.0,
        timeline_points: int = 512,
        allocated_cores: int | None = None,
    ) -> None:
        self.job_id = job_id
        self.hostname = hostname
        self.uid = uid
        self.interval_s = interval_s
        self.source = source
        self.started_s = started_s
        self.idle_threshold_pct = idle_threshold_pct
        self.gpus = [GpuAccumulator(info, idle_threshold_pct) for info in gpus]
        self._index = {info.uuid: i for i, info in enumerate(gpus)}
        self.host = HostAccumulator(allocated_cores)
        self.timeline = Timeline(len(self.gpus), timeline_points, interval_s, started_s)
        self.last_time_s: float | None = None
        self.readings = 0

    @property
    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return tuple(g.info for g in self.gpus)

    def set_allocated_cores(self, cores: int | None) -> None:
        """Set the job's core count on this node once it is known (readings before count
        nothing toward the cores-busy distribution)."""
        if cores and not self.host.allocated_cores:
            self.host.allocated_cores = cores

    def add(self, time_s: float, gpus: Sequence[GpuSample], host: HostSample | None) -> None:
        """Fold one reading time: the samples of every GPU (matched by UUID; others ignored)
        and the job's host sample (``None`` when it could not be read)."""
        if self.last_time_s is None:
            dt = self.interval_s
        else:
            dt = min(max(0.0, time_s - self.last_time_s), MAX_GAP_INTERVALS * self.interval_s)
        self.last_time_s = time_s
        self.readings += 1
        n = len(self.gpus)
        util: list[float | None] = [None] * n
        mem: list[int | None] = [None] * n
        power: list[float | None] = [None] * n
        for s in gpus:
            i = self._index.get(s.uuid)
            if i is None:
                continue
            self.gpus[i].add(s, dt)
            if s.available:
                util[i] = s.utilization_pct
                mem[i] = s.memory_used_bytes
                power[i] = s.power_w
        cores = rss = None
        if host is not None:
            cores = self.host.add(host)
            rss = host.rss_bytes
        allocated = self.host.allocated_cores
        if cores is not None and allocated:
            # GPU stalls against saturated cores at sampling resolution (the timeline's
            # buckets grow minutes wide on long jobs and cannot show the coincidence).
            busy_pct = 100.0 * cores / allocated
            for i, u in enumerate(util):
                if u is not None:
                    self.gpus[i].add_stall(u, busy_pct)
        self.timeline.add(time_s, util, mem, power, cores, rss)

    def add_counters(self, time_s: float, gpus: Sequence[GpuSample]) -> None:
        """Fold a read of the cumulative counters alone at ``time_s`` (the sampler's seal):
        not a reading, so the timeline, the reading count and the last reading's time stay
        as they are."""
        if self.last_time_s is None:
            return
        dt = min(max(0.0, time_s - self.last_time_s), MAX_GAP_INTERVALS * self.interval_s)
        for s in gpus:
            i = self._index.get(s.uuid)
            if i is not None:
                self.gpus[i].add_counters(s, dt)

    def record(self, *, ended_s: float, complete: bool, notes: Sequence[str] = ()) -> NodeRecord:
        """The sealed record as of now."""
        return NodeRecord(
            job_id=self.job_id,
            hostname=self.hostname,
            uid=self.uid,
            interval_s=self.interval_s,
            source=self.source,
            started_s=self.started_s,
            ended_s=ended_s,
            gpus=tuple(g.summary() for g in self.gpus),
            host=self.host.summary() if self.host.samples else None,
            timeline=self.timeline.points(),
            complete=complete,
            notes=tuple(dict.fromkeys(notes)),
        )

    def state(self) -> dict[str, Any]:
        """Plain-JSON checkpoint of everything above."""
        return {**self._state_head(), "timeline": self.timeline.state()}

    def state_json(self) -> str:
        """``state()`` as compact JSON text, the timeline's unchanged buckets not encoded
        again (``Timeline.state_json``): what a checkpoint writes."""
        head = _compact_json(self._state_head())
        return head[:-1] + ',"timeline":' + self.timeline.state_json() + "}"

    def _state_head(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "job_id": self.job_id,
            "hostname": self.hostname,
            "uid": self.uid,
            "interval_s": self.interval_s,
            "source": self.source,
            "started_s": self.started_s,
            "idle_threshold_pct": self.idle_threshold_pct,
            "last_time_s": self.last_time_s,
            "readings": self.readings,
            "gpus": [g.state() for g in self.gpus],
            "host": self.host.state(),
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> NodeAggregator:
        """Restore from ``state()``; ``ValueError``/``KeyError``/``TypeError`` if it does not
        fit (callers treat that as a corrupt checkpoint)."""
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unknown aggregate state version {data.get('version')!r}")
        threshold = float(data["idle_threshold_pct"])
        gpus = [GpuAccumulator.from_state(g, threshold) for g in data["gpus"]]
        out = cls(
            job_id=str(data["job_id"]),
            hostname=str(data["hostname"]),
            uid=data["uid"],
            interval_s=float(data["interval_s"]),
            source=str(data["source"]),
            gpus=[g.info for g in gpus],
            started_s=float(data["started_s"]),
            idle_threshold_pct=threshold,
        )
        out.gpus = gpus
        out.host = HostAccumulator.from_state(data["host"])
        out.timeline = Timeline.from_state(data["timeline"], len(gpus))
        out.last_time_s = data["last_time_s"]
        out.readings = int(data["readings"])
        return out
