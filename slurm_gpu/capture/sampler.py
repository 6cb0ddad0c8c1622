"""The per-job sampler: read the job's GPUs and processes every interval, spool, seal at SIGTERM.

One detached process per job and node, started by the prolog (or a systemd unit). Each
reading is folded into ``NodeAggregator`` (constant memory) and appended to the spool; every
``checkpoint_interval_s`` the aggregates and the spool offset are checkpointed so that the
epilog can recover a record if the sampler dies. On SIGTERM the sampler seals the record from
the aggregates it holds, which costs the same for a five-minute and a seven-day job.

Nothing stops the loop: a failed reading is logged and skipped, a lost GPU reads as
unavailable, a full or unwritable spool stops the jsonl (the aggregates go on) and the record
is still attempted at the end.

The process itself is started as ``python -I -m slurm_gpu.hooks.sampler`` (the composition
root that reads the configuration and chooses the telemetry source, ``slurm_gpu.hooks.sampler``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.livefile import LiveWriter, private_group_of
from slurm_gpu.capture.spool import (
    JobSpool,
    SpoolHeader,
    SpoolWriter,
    write_record,
    write_state,
)
from slurm_gpu.records import GpuInfo, GpuSample, HostSample, StackSummary
from slurm_gpu.telemetry.base import CounterSource, TelemetrySource, slurm_gpu_index

# The logger keeps its name from before the capture package: sites filter logs by it.
log = logging.getLogger("slurm_gpu.sampler")

#: Seconds between two rewrites of ``<host>.live.json`` (at least one interval).
LIVE_INTERVAL_S = 10.0
#: Seconds between two attempts to open a telemetry source that was unavailable.
REOPEN_INTERVAL_S = 60.0
#: Window of the live summary's recent duty cycle, seconds (the exporter's and ``slurm-gpu
#: live``'s "now" without Prometheus; Prometheus computes any window from the counters).
RECENT_WINDOW_S = 300.0
#: Most readings kept per GPU for the recent window (bounds memory at short intervals).
RECENT_MAX_READINGS = 600


@dataclass(frozen=True, slots=True)
class SamplerOptions:
    """What one sampler needs to know, resolved from the command line and the settings."""

    job_id: str
    hostname: str
    uid: int | None
    gpu_uuids: tuple[str, ...]
    spool_dir: str
    interval_s: float
    checkpoint_interval_s: float
    idle_threshold_pct: float
    timeline_points: int
    cores: int | None = None
    user: str | None = None
    """The job's user name (``SLURM_JOB_USER``), for the live view's labels."""
    account: str | None = None
    """The job's account (``SLURM_JOB_ACCOUNT``), for the live view's labels."""
    partition: str | None = None
    """The job's partition (``SLURM_JOB_PARTITION``), for the live view's labels."""


class _LiveGpu:
    """What the live summary needs of one GPU beyond the aggregates, in O(1) per reading
    and bounded memory: busy and sampled seconds (counters), since when it is idle, and the
    readings of the recent window."""

    __slots__ = ("busy_s", "idle_since_s", "recent", "recent_sum", "sampled_s")

    def __init__(self, max_readings: int) -> None:
        self.busy_s = 0.0
        """Seconds of kernel activity: the sum of duty cycle x interval, seconds."""
        self.sampled_s = 0.0
        """Seconds covered by readings that had a duty cycle, seconds."""
        self.idle_since_s: float | None = None
        """Start of the current idle run (unix seconds); ``None`` while busy or unknown."""
        self.recent: deque[tuple[float, float]] = deque(maxlen=max_readings)
        self.recent_sum = 0.0

    def add(self, now: float, util_pct: float | None, dt_s: float, idle_pct: float) -> None:
        if util_pct is None:
            return
        self.busy_s += util_pct / 100.0 * dt_s
        self.sampled_s += dt_s
        if util_pct < idle_pct:
            if self.idle_since_s is None:
                self.idle_since_s = now
        else:
            self.idle_since_s = None
        if len(self.recent) == self.recent.maxlen:
            self.recent_sum -= self.recent[0][1]
        self.recent.append((now, util_pct))
        self.recent_sum += util_pct
        while self.recent and self.recent[0][0] < now - RECENT_WINDOW_S:
            self.recent_sum -= self.recent.popleft()[1]

    def recent_pct(self) -> float | None:
        return self.recent_sum / len(self.recent) if self.recent else None


SourceFactory = Callable[[], TelemetrySource]


class _HostReader(Protocol):
    """What the sampler needs of a host sampler (see ``slurm_gpu.capture.hostsample``)."""

    @property
    def method(self) -> str: ...

    def sample(self, now_s: float | None = None) -> HostSample: ...

    def allocated_cores(self) -> int | None: ...

    def job_gone(self) -> bool: ...


class _StackReader(Protocol):
    """What the sampler needs of stack sampling (``slurm_gpu.capture.stacksampler``)."""

    def due(self, now: float) -> bool: ...

    def burst(
        self,
        now: float,
        gpus_idle: bool | None,
        wait: Callable[[float], bool],
        clock: Callable[[], float],
    ) -> bool: ...

    def summary(self) -> StackSummary: ...


#: Seconds a sampler waits for the epilog once its job's cgroup is gone, then seals the record
#: itself: an epilog that never ran (a slurmd restarted at the wrong moment, a hook killed with
#: the job's cgroup under PrologFlags=RunInJob) must not leave a record unsealed until the next
#: job on the GPU reaps the sampler. Epilogs come within a second or two of the job's end.
ORPHAN_GRACE_S = 30.0


class Sampler:
    """One job's sampler. ``run`` loops until ``wait`` reports a stop request."""

    def __init__(
        self,
        opts: SamplerOptions,
        source_factory: SourceFactory,
        host: _HostReader | None,
        *,
        clock: Callable[[], float] = time.time,
        stacks: _StackReader | None = None,
    ) -> None:
        self.opts = opts
        self.stacks = stacks
        """Stack bursts (opt-in, ``docs/stacks.md``); ``None`` when off."""
        self.paths = JobSpool(opts.spool_dir, opts.job_id, opts.hostname)
        self._source_factory = source_factory
        self._source: TelemetrySource | None = None
        self._source_name = "unknown"
        self._last_open_try = -1e18
        self.host = host
        self.clock = clock
        self.notes: list[str] = []
        self._writer: SpoolWriter | None = None
        self._spool_ok = True
        self._checkpoint_ok = True
        self._last_checkpoint = 0.0
        self._last_live = -1e18
        self._last_gpus: Sequence[GpuSample] = ()
        self._last_host: HostSample | None = None
        self.started_s = clock()
        # The group that may read the live summary: the job user's private group, looked up
        # once (a name service may be slow); none when not root (nothing to grant).
        live_gid = private_group_of(opts.uid) if os.geteuid() == 0 else None
        self._live = LiveWriter(self.paths, live_gid)
        self.agg = self._make_aggregator()
        max_recent = min(RECENT_MAX_READINGS, int(RECENT_WINDOW_S / opts.interval_s) + 2)
        self._live_gpus = [_LiveGpu(max_recent) for _ in opts.gpu_uuids]
        self._prev_reading_s: float | None = None
        self._gone_since: float | None = None

    # ------------------------------------------------------------------ setup

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _open_source(self) -> TelemetrySource | None:
        if self._source is not None:
            return self._source
        now = self.clock()
        if now - self._last_open_try < REOPEN_INTERVAL_S:
            return None
        self._last_open_try = now
        try:
            self._source = self._source_factory()
            self._source_name = self._source.name
        except Exception as exc:
            log.warning("telemetry unavailable: %s", exc)
            self._note("telemetry_unavailable")
            self._source = None
        return self._source

    def _make_aggregator(self) -> NodeAggregator:
        infos: dict[str, GpuInfo] = {}
        source = self._open_source()
        if source is not None:
            try:
                infos = {i.uuid: i for i in source.list_gpus()}
            except Exception as exc:
                log.warning("cannot list GPUs: %s", exc)
                self._note("gpu_list_failed")
        gpus = []
        for uuid in self.opts.gpu_uuids:
            if uuid not in infos:
                self._note(f"gpu_unknown:{uuid}")
            gpus.append(infos.get(uuid, GpuInfo(uuid=uuid)))
        # The number Slurm names each GPU by on this node, by the prolog's own rule (from
        # every GPU the source lists): the live summary's gpu_index, which slurm-gpu police
        # checks against Slurm's allocation. None: not known (a MIG slice, no GPU list).
        listed = list(infos.values())
        self._gpu_index: dict[str, int | None] = {g.uuid: slurm_gpu_index(g, listed) for g in gpus}
        return NodeAggregator(
            job_id=self.opts.job_id,
            hostname=self.opts.hostname,
            uid=self.opts.uid,
            interval_s=self.opts.interval_s,
            source=self._source_name,
            gpus=gpus,
            started_s=self.started_s,
            idle_threshold_pct=self.opts.idle_threshold_pct,
            timeline_points=self.opts.timeline_points,
            allocated_cores=self.opts.cores,
        )

    def _spool_failed(self, what: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, "EIO") if exc.errno else type(exc).__name__
        log.error("%s failed (%s); spool writing stops, aggregates go on", what, exc)
        self._note(f"spool_write_failed:{name}")
        self._spool_ok = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def open_spool(self) -> None:
        """Create the job directory if needed and write the spool header."""
        header = SpoolHeader(
            job_id=self.opts.job_id,
            hostname=self.opts.hostname,
            uid=self.opts.uid,
            interval_s=self.opts.interval_s,
            source=self._source_name,
            gpus=self.agg.gpu_infos,
            started_s=self.started_s,
        )
        try:
            self.paths.create_dir()
            self._writer = SpoolWriter(self.paths.jsonl, header)
        except OSError as exc:
            self._spool_failed("opening the spool", exc)

    # ------------------------------------------------------------------ one reading

    def read_once(self) -> None:
        """Take one reading of every GPU and the host, fold it, spool it."""
        now = self.clock()
        gpus: Sequence[GpuSample]
        source = self._open_source()
        try:
            if source is None:
                raise RuntimeError("no telemetry source")
            gpus = source.sample(self.opts.gpu_uuids)
        except Exception as exc:
            if source is not None:
                log.warning("GPU reading failed: %s", exc)
            gpus = [GpuSample(uuid=u, time_s=now, available=False) for u in self.opts.gpu_uuids]
        host: HostSample | None = None
        if self.host is not None:
            try:
                host = self.host.sample(now)
                if self.agg.host.allocated_cores is None:
                    self.agg.set_allocated_cores(self.host.allocated_cores())
            except Exception as exc:
                log.warning("host reading failed: %s", exc)
        for s in gpus:
            if not s.available:
                self._note(f"gpu_lost:{s.uuid}")
        self.agg.add(now, gpus, host)
        self._last_gpus, self._last_host = gpus, host
        # A reading stands for the time since the previous one, at most two intervals (a
        # suspended sampler must not credit the gap to whatever it read last).
        prev, self._prev_reading_s = self._prev_reading_s, now
        dt = self.opts.interval_s if prev is None else min(now - prev, 2 * self.opts.interval_s)
        for live, s in zip(self._live_gpus, gpus, strict=False):
            util = s.utilization_pct if s.available else None
            live.add(now, util, max(dt, 0.0), self.opts.idle_threshold_pct)
        if self._writer is not None:
            try:
                self._writer.append(now, gpus, host)
            except OSError as exc:
                self._spool_failed("appending to the spool", exc)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> None:
        """fsync the spool and write the aggregates with the offset they cover."""
        if not self._spool_ok or self._writer is None:
            return
        try:
            offset = self._writer.sync()
            write_state(self.paths.state, self.agg.state_json(), offset, self.notes)
            self._checkpoint_ok = True
        except OSError as exc:
            if self._checkpoint_ok:
                log.error("checkpoint failed: %s", exc)
            self._checkpoint_ok = False
            self._note("checkpoint_failed")

    def write_live(self) -> None:
        """Rewrite the small live summary for ``gpueff`` on running jobs."""
        if not self._spool_ok:
            return
        gpus = []
        for acc, s, live in zip(self.agg.gpus, self._last_gpus, self._live_gpus, strict=False):
            dist = acc.utilization
            n = sum(dist.counts)
            energy_j: float | None = None
            if acc.energy_counter_ok and acc.energy_first_mj is not None:
                energy_j = ((acc.energy_last_mj or acc.energy_first_mj) - acc.energy_first_mj) / 1e3
            elif acc.power_integral_j:
                energy_j = acc.power_integral_j
            gpus.append(
                {
                    "uuid": acc.info.uuid,
                    # The product name and minor number: gpueff shows a running job's GPUs
                    # by model (not Slurm's gres type) and by /dev/nvidiaN, as when it ended.
                    "name": acc.info.name,
                    "minor_number": acc.info.minor_number,
                    "gpu_index": self._gpu_index.get(acc.info.uuid),
                    "available": s.available,
                    "utilization_pct": s.utilization_pct,
                    "memory_used_bytes": s.memory_used_bytes,
                    "memory_total_bytes": s.memory_total_bytes or acc.info.memory_total_bytes,
                    "utilization_mean_pct": dist.total / n if n else None,
                    "utilization_recent_pct": live.recent_pct(),
                    "recent_window_s": RECENT_WINDOW_S,
                    "busy_s": live.busy_s,
                    "sampled_s": live.sampled_s,
                    "idle_since_s": live.idle_since_s,
                    "active_first_s": acc.active_first_time_s,
                    "power_w": s.power_w,
                    # The mean since the job's start and the limit, as the sealed record's
                    # line shows them (``power 338 W / 400 W``).
                    "power_mean_w": acc.power.mean,
                    "power_limit_w": acc.info.power_limit_w,
                    "energy_j": energy_j,
                    "idle_samples": acc.idle_samples,
                    "samples": acc.samples,
                    "memory_used_max_bytes": acc.memory_used_max_bytes,
                    "process_seen": acc.process_seen,
                }
            )
        h = self._last_host
        summary = {
            "job_id": self.opts.job_id,
            "hostname": self.opts.hostname,
            "uid": self.opts.uid,
            "user": self.opts.user,
            "account": self.opts.account,
            "partition": self.opts.partition,
            "started_s": self.started_s,
            "updated_s": self.agg.last_time_s,
            "interval_s": self.opts.interval_s,
            "gpus": gpus,
            "host": None
            if h is None
            else {
                "cpu_time_s": self.agg.host.summary().cpu_time_s,
                "rss_bytes": h.rss_bytes,
                "allocated_cores": self.agg.host.allocated_cores,
                "method": h.method,
            },
        }
        try:
            self._live.write(summary)
        except (OSError, ValueError) as exc:
            log.warning("live summary not written: %s", exc)

    # ------------------------------------------------------------------ end

    def _final_counters(self) -> None:
        """A source that reads its cumulative counters (energy, violation times) at fewer
        readings than the rest reads them once more, so that the record's totals run to the
        end of the job."""
        source = self._source
        if not isinstance(source, CounterSource) or self.agg.last_time_s is None:
            return
        try:
            counters = source.read_counters(self.opts.gpu_uuids)
        except Exception as exc:
            log.warning("final read of the GPU counters failed: %s", exc)
            return
        self.agg.add_counters(self.clock(), counters)

    def seal(self) -> bool:
        """Write the sealed record (complete) from the aggregates; True if written."""
        self._final_counters()
        if self._writer is not None:
            try:
                self._writer.sync()
            except OSError as exc:
                log.warning("final spool sync failed: %s", exc)
            self._writer.close()
            self._writer = None
        self._live.close()
        record = self.agg.record(ended_s=self.clock(), complete=True, notes=self.notes)
        if self.stacks is not None:
            record = dataclasses.replace(record, stacks=self.stacks.summary())
        try:
            self.paths.create_dir()
            write_record(self.paths.record, record)
        except OSError as exc:
            log.error("sealing the record failed: %s", exc)
            return False
        if self._source is not None:
            try:
                self._source.close()
            except Exception as exc:
                log.warning("closing telemetry failed: %s", exc)
        # The /proc method keeps the job's files open between readings.
        close_host = getattr(self.host, "close", None)
        if close_host is not None:
            close_host()
        return True

    def run(self, wait: Callable[[float], bool]) -> bool:
        """Loop until ``wait(timeout_s)`` returns True, then seal; returns whether sealed.

        Readings follow a drift-free schedule ``started + k * interval``; a reading that ran
        late skips the ticks it missed instead of bunching up.
        """
        self.open_spool()
        interval = self.opts.interval_s
        start = self.clock()
        self._last_checkpoint = start
        k = 0
        while True:
            try:
                self.read_once()
                now = self.clock()
                if now - self._last_live >= max(LIVE_INTERVAL_S, interval) or k == 0:
                    self._last_live = now
                    self.write_live()
                if now - self._last_checkpoint >= self.opts.checkpoint_interval_s:
                    self._last_checkpoint = now
                    self.checkpoint()
            except Exception:
                log.exception("reading failed")
            if self._stack_burst(wait):
                break
            now = self.clock()
            if self._orphaned(now):
                break
            k = max(k + 1, int((now - start) / interval) + 1)
            if wait(max(0.0, start + k * interval - now)):
                break
        return self.seal()

    def _gpus_idle(self) -> bool | None:
        """Whether every GPU read idle at the last reading (``None``: not known)."""
        utils = [s.utilization_pct for s in self._last_gpus if s.available]
        if not utils or any(u is None for u in utils):
            return None
        return all(u is not None and u <= self.opts.idle_threshold_pct for u in utils)

    def _stack_burst(self, wait: Callable[[float], bool]) -> bool:
        """A stack burst when one is due; True when a stop request came during it."""
        now = self.clock()
        if self.stacks is None or not self.stacks.due(now):
            return False
        try:
            return self.stacks.burst(now, self._gpus_idle(), wait, self.clock)
        except Exception:
            log.exception("stack burst failed")
            return False

    def _orphaned(self, now: float) -> bool:
        """Whether the job's cgroup has been gone for ``ORPHAN_GRACE_S`` with no epilog to
        stop this sampler: then it seals the record itself, noting ``sealed_without_epilog``."""
        try:
            gone = self.host is not None and self.host.job_gone()
        except OSError:
            gone = False
        if not gone:
            self._gone_since = None
            return False
        if self._gone_since is None:
            self._gone_since = now
        if now - self._gone_since < ORPHAN_GRACE_S:
            return False
        log.warning(
            "the job has ended (its cgroup or slurmstepd gone, or past its end) %.0f s ago "
            "and no epilog stopped this sampler; sealing the record",
            now - self._gone_since,
        )
        self._note("sealed_without_epilog")
        return True


# --------------------------------------------------------------------------- process entry


def _signal_waiter() -> Callable[[float], bool]:
    """A wait function that returns True as soon as SIGTERM, SIGINT or SIGHUP has arrived
    (one that came before the first wait included). Call it from the main thread, first."""
    # Handlers and the wakeup file, not sigtimedwait: CPython's sigtimedwait, interrupted
    # (EINTR) after its deadline has passed, returns an uninitialised siginfo instead of None,
    # even one whose si_signo reads SIGHUP, so a sampler stopped (SIGSTOP) for longer than its
    # wait took the SIGCONT for a stop request and sealed its record while the job ran on.
    stopped: list[int] = []
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def note(signum: int, frame: Any) -> None:
        stopped.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note)

    def wait(timeout_s: float) -> bool:
        if not stopped and timeout_s > 0:
            # The C handler writes to the wakeup file at once, so select returns early.
            ready, _, _ = select.select([wake_r], [], [], timeout_s)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
        return bool(stopped)

    return wait
