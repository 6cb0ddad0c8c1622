"""``VirtualGpuSource``: reads file-backed virtual GPUs the way NVML reads a real GPU.

It reads the files of ``telemetry.virtual_format``: the duty cycle of a reading is
the ``busy_s`` delta over the time since the previous reading; when no workload writes any more
(the state is older than ``STALE_AFTER_S``) the GPU is idle, draws its idle power and its energy
counter keeps growing; processes whose pid has gone are dropped (and their memory freed, as the
driver does). A GPU whose files vanished or are corrupt reads as ``available=False``; the
others go on. Every file is read by ``read_bounded``: a link (to ``/dev/zero``, say), a FIFO,
anything but a regular file, or a file over ``MAX_FILE_BYTES`` reads as a lost GPU.

The writer side is ``telemetry.virtual_device``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample
from slurm_gpu.telemetry.base import THROTTLE_GPU_IDLE
from slurm_gpu.telemetry.virtual_format import (
    IDENTITY_FILE,
    STALE_AFTER_S,
    STATE_FIELDS,
    STATE_FILE,
    STATE_VERSION,
    Clock,
    gpu_dirs,
    info_from_identity,
    pid_alive,
    pid_start_ticks,
    read_bounded,
    read_json,
)

# --------------------------------------------------------------------------- reader


def _read_json_fd(path: str) -> Any:
    """Parse a small JSON file read with one ``os.read`` (the sampler reads one per GPU per
    reading: no file object, no Path, and the C scanner called directly). Raises ``OSError``
    or ``ValueError``. Read through ``read_bounded``: no link followed, a bounded size."""
    text = read_bounded(path).decode()
    if not text or text[0].isspace():
        return json.loads(text)  # not as written by this module: the full parser
    try:
        obj, end = _scan_once(text, 0)
    except StopIteration:
        raise ValueError(f"{path}: not JSON") from None
    if end != len(text) and not text[end:].isspace():
        raise ValueError(f"{path}: extra data after the JSON value")
    return obj


# The decoder's C scanner (``json.scanner.c_make_scanner``), which ``json.loads`` reaches
# through three Python-level calls.
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class _Gpu:
    """What the source keeps about one GPU between readings: its files, the constants of its
    identity (re-read only when ``identity.json`` is replaced) and the counters of the
    previous reading."""

    __slots__ = (
        "busy_s",
        "clock_idle",
        "clock_max",
        "energy_mj",
        "gpm",
        "identity_key",
        "identity_path",
        "idle_w",
        "last_sample_s",
        "last_xid_s",
        "max_w",
        "mem_clock",
        "nvlink",
        "ref_s",
        "seen",
        "sm_active_s",
        "state_path",
        "tensor_active_s",
        "total",
    )

    def __init__(self, gpu_dir: Path, created_s: float) -> None:
        self.state_path = os.path.join(gpu_dir, STATE_FILE)
        self.identity_path = os.path.join(gpu_dir, IDENTITY_FILE)
        self.identity_key: tuple[int, int, int] | None = None
        self.idle_w = 0.0
        self.max_w = 1.0
        self.total = 0
        self.clock_max = 0
        self.clock_idle = 0
        self.mem_clock: int | None = None
        self.nvlink = False
        self.gpm = False
        self.seen = False  # whether a reading has been taken (the counters below are set)
        self.ref_s = 0.0
        self.busy_s = 0.0
        self.sm_active_s = 0.0
        self.tensor_active_s = 0.0
        self.energy_mj = 0
        self.last_sample_s = 0.0
        self.last_xid_s = created_s

    def check_identity(self, gpu_uuid: str) -> None:
        """Re-read ``identity.json`` if it was replaced since the last look (one ``stat``);
        ``KeyError`` if the directory now holds another GPU."""
        st = os.stat(self.identity_path)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.identity_key:
            return
        self.identity_key = None
        identity = _read_json_fd(self.identity_path)
        if not isinstance(identity, dict):
            raise ValueError(f"{self.identity_path}: not a JSON object")
        if identity.get("uuid") != gpu_uuid:
            raise KeyError(gpu_uuid)  # the directory now holds another GPU
        self.idle_w = float(identity.get("idle_power_w", 0.0))
        self.max_w = float(identity.get("max_power_w", self.idle_w)) or 1.0
        self.total = int(identity["memory_total_bytes"])
        self.clock_max = int(identity["sm_clock_max_mhz"])
        self.clock_idle = int(identity["sm_clock_idle_mhz"])
        self.mem_clock = int(identity.get("memory_clock_mhz", 0)) or None
        self.nvlink = bool(identity.get("nvlink"))
        self.gpm = (info_from_identity(identity).compute_capability or (0, 0)) >= (9, 0)
        self.identity_key = key


class _Liveness:
    """Whether the processes listed in the state files are alive, without reading
    ``/proc/<pid>/stat`` for each of them at every reading.

    A process is checked once against its recorded start time (a reused pid is another
    process), then watched through a pidfd, which becomes readable when the process exits:
    one ``poll`` per reading answers for all of them. Without pidfds (old kernels) every
    check reads ``/proc``. As on a real GPU, an exited process that is not yet reaped (a
    zombie) is gone from the list from the next reading on.
    """

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int | None], int] = {}
        self._dead: set[tuple[int, int]] = set()
        self._used: set[tuple[int, int | None]] = set()
        self._exited: set[int] | None = None
        self._poll = select.poll()

    def begin(self) -> None:
        """Start a reading: exits are polled again at the first check."""
        self._exited = None
        self._used = set()

    def alive(self, pid: Any, recorded: Any) -> bool:
        """Whether the process a state lists as ``pid`` started at ``recorded`` (clock
        ticks; ``None``: not recorded) still runs."""
        if not isinstance(pid, int) or pid <= 0:
            return False
        if recorded is not None and not isinstance(recorded, int):
            return pid_alive(pid, recorded)
        key = (pid, recorded)
        fd = self._fds.get(key)
        if fd is not None:
            self._used.add(key)
            if self._exited is None:
                self._exited = {f for f, _ev in self._poll.poll(0)}
            if fd not in self._exited:
                return True
            self._forget(key)
            if recorded is not None:
                self._dead.add((pid, recorded))  # a (pid, start time) never comes back
            return False
        if recorded is not None and (pid, recorded) in self._dead:
            self._used.add(key)
            return False
        alive = pid_alive(pid, recorded)
        if alive:
            self._watch(key, pid, recorded)
        elif recorded is not None:
            self._dead.add((pid, recorded))
            self._used.add(key)
        return alive

    def _watch(self, key: tuple[int, int | None], pid: int, recorded: int | None) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return  # checked through /proc at every reading instead
        # The pid may have been reused between the check and pidfd_open: check again, now
        # that the pidfd pins the process.
        ticks = pid_start_ticks(pid)
        if ticks is None or (recorded is not None and ticks != recorded):
            os.close(fd)
            return
        self._fds[key] = fd
        self._poll.register(fd, select.POLLIN)
        self._used.add(key)

    def _forget(self, key: tuple[int, int | None]) -> None:
        fd = self._fds.pop(key)
        self._poll.unregister(fd)
        os.close(fd)

    def end(self) -> None:
        """End a reading: stop watching processes no state file lists any more."""
        used = self._used
        for key in [k for k in self._fds if k not in used]:
            self._forget(key)
        self._dead = {k for k in self._dead if k in used}

    def close(self) -> None:
        for key in list(self._fds):
            self._forget(key)
        self._dead.clear()


class VirtualGpuSource:
    """``TelemetrySource`` over the virtual GPUs in ``virtual_dir``."""

    name = "virtual"

    def __init__(self, virtual_dir: str | os.PathLike[str], *, clock: Clock = time.time) -> None:
        self.virtual_dir = Path(virtual_dir)
        self._clock = clock
        self._created_s = clock()
        self._gpus: dict[str, _Gpu] = {}
        self._liveness = _Liveness()
        if not self.virtual_dir.is_dir():
            raise TelemetryUnavailableError(
                f"virtual GPU directory {self.virtual_dir} does not exist",
                hint=(
                    f"create it with: slurm-gpu vgpu create --dir {self.virtual_dir} --count 4, "
                    'or set telemetry.backend = "nvml" on a node with GPUs'
                ),
            )

    def list_gpus(self) -> Sequence[GpuInfo]:
        """Every virtual GPU whose identity can be read, by minor number."""
        infos = []
        try:
            dirs = gpu_dirs(self.virtual_dir)
        except OSError as exc:
            raise TelemetryUnavailableError(
                f"cannot list virtual GPUs in {self.virtual_dir}: {exc.strerror or exc}"
            ) from None
        for _minor, gpu_dir in dirs:
            try:
                info = info_from_identity(read_json(gpu_dir / IDENTITY_FILE))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a broken GPU is not listed; the others are
            known = self._gpus.get(info.uuid)
            if known is None:
                self._gpus[info.uuid] = _Gpu(gpu_dir, self._created_s)
            elif known.state_path != os.path.join(gpu_dir, STATE_FILE):
                # Moved to another minor number: same GPU, same counters, new files.
                known.state_path = os.path.join(gpu_dir, STATE_FILE)
                known.identity_path = os.path.join(gpu_dir, IDENTITY_FILE)
                known.identity_key = None
            infos.append(info)
        return infos

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        """Read each virtual GPU once; ``available=False`` for one that vanished or is corrupt."""
        gpus = self._gpus
        for u in uuids:
            if u not in gpus:
                with contextlib.suppress(TelemetryUnavailableError):
                    self.list_gpus()
                break
        now = self._clock()
        out = []
        self._liveness.begin()
        for gpu_uuid in uuids:
            try:
                out.append(self._sample_one(gpu_uuid, gpus[gpu_uuid], now))
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
                # Gone, corrupt, or not a state at all: this GPU reads as lost.
                out.append(GpuSample(uuid=gpu_uuid, time_s=now, available=False))
        self._liveness.end()
        return out

    def close(self) -> None:
        """Stop watching processes (idempotent)."""
        self._liveness.close()

    def _sample_one(self, gpu_uuid: str, g: _Gpu, now: float) -> GpuSample:
        st = _read_json_fd(g.state_path)
        if type(st) is not list:
            st = _row_from_v1(st, g.state_path)
        elif len(st) != _STATE_LEN or st[0] != STATE_VERSION:
            raise ValueError(f"{g.state_path}: not a version {STATE_VERSION} state")
        # One unpacking instead of a dict lookup per field (this runs for every GPU at every
        # reading); the order is STATE_FIELDS.
        (
            _version,
            owner,
            t_file,
            busy,
            sm_s,
            tensor_s,
            energy_mj,
            power_raw,
            mem_reported,
            throttle,
            pcie_tx,
            pcie_rx,
            nvlink_tx,
            nvlink_rx,
            ecc_c,
            ecc_u,
            listed,
            events,
            ring,
        ) = st
        # A state written by this version names its GPU, so a directory that now holds
        # another GPU is told without looking at identity.json; otherwise stat it.
        if owner is not None and owner != gpu_uuid:
            raise KeyError(gpu_uuid)
        if owner is None or g.identity_key is None:
            g.check_identity(gpu_uuid)
        t_file = float(t_file)
        age = now - t_file
        fresh = age <= STALE_AFTER_S
        busy = float(busy)
        sm_s = float(sm_s)
        tensor_s = float(tensor_s)
        power = float(power_raw) if fresh and power_raw is not None else g.idle_w
        energy = int(energy_mj) + (int(age * power * 1000) if age > 0.0 else 0)
        # While a writer is alive its counters are exact at t_file; once it has stopped they
        # are exact up to now (nothing runs), so the reference time is now.
        ref = t_file if fresh else now
        util: float
        sm_pct: float | None
        tensor_pct: float | None
        seen = g.seen
        if seen and ref > g.ref_s:
            span = ref - g.ref_s
            util = (busy - g.busy_s) / span * 100.0
            sm_pct = (sm_s - g.sm_active_s) / span * 100.0
            tensor_pct = (tensor_s - g.tensor_active_s) / span * 100.0
            # The memory controller's share of the time: 10 % of the duty plus 40 % of the SM
            # activity (42 % of the duty at the default 0.8), so that kernels keeping few SMs
            # busy also move little memory, as on a real board.
            mem_util = _MEM_UTIL_OF_DUTY * util + _MEM_UTIL_OF_SM * sm_pct
        elif seen:
            util, sm_pct, tensor_pct = 0.0, 0.0, 0.0
            mem_util = 0.0
        else:
            # First reading: like NVML, report the most recent driver sample period.
            util = float(ring[-1][1]) if fresh and ring else 0.0
            sm_pct, tensor_pct = None, None
            mem_util = (_MEM_UTIL_OF_DUTY + _MEM_UTIL_OF_SM * 0.8) * util  # the default SM share
        util = 100.0 if util > 100.0 else 0.0 if util < 0.0 else util
        mem_util = 100.0 if mem_util > 100.0 else 0.0 if mem_util < 0.0 else mem_util
        if sm_pct is not None:
            sm_pct = 100.0 if sm_pct > 100.0 else 0.0 if sm_pct < 0.0 else sm_pct
        if tensor_pct is not None:
            tensor_pct = 100.0 if tensor_pct > 100.0 else 0.0 if tensor_pct < 0.0 else tensor_pct
        new_samples: tuple[float, ...] = ()
        if ring:
            last_sample_s = g.last_sample_s
            new_samples = tuple(float(u) for t, u in ring if float(t) > last_sample_s)
            g.last_sample_s = max(last_sample_s, *(float(t) for t, _u in ring))
        new_xids: tuple[int, ...] = ()
        if events:
            last_xid_s = g.last_xid_s
            xids = [(float(t), int(x)) for t, x in events]
            new_xids = tuple(x for t, x in xids if t > last_xid_s)
            g.last_xid_s = max(last_xid_s, *(t for t, _x in xids))
        if seen:
            if energy < g.energy_mj:
                energy = g.energy_mj  # the extrapolation must stay monotonic
            if ref > g.ref_s:
                g.ref_s = ref
        else:
            g.ref_s = ref
        g.busy_s, g.sm_active_s, g.tensor_active_s, g.energy_mj = busy, sm_s, tensor_s, energy
        g.seen = True
        procs: tuple[GpuProcess, ...] = ()
        mem_used = 0
        if listed:
            alive = self._liveness.alive
            procs = tuple(
                GpuProcess(int(pid), mem) for pid, mem, start in listed if alive(pid, start)
            )
            if procs:
                mem_used = sum(p.used_memory_bytes or 0 for p in procs)
                if fresh and mem_reported is not None:
                    mem_used = int(mem_reported)
        total = g.total
        if throttle is None:
            throttle = THROTTLE_GPU_IDLE if util == 0.0 else 0
        nvlink = g.nvlink
        heat = power / g.max_w
        sm_active = tensor_active = None
        if g.gpm and sm_pct is not None and tensor_pct is not None:
            sm_active = int(sm_pct * 1000.0 + 0.5) / 1000.0
            tensor_active = int(tensor_pct * 1000.0 + 0.5) / 1000.0
        # Values are rounded as NVML reports them (to 0.001 %, 0.01 W, 0.1 °C), by
        # int(x * 10**k + 0.5) / 10**k on these non-negative values: the same result as
        # round(x, k) but for exact ties, at a third of its cost (round() goes through a
        # decimal string), six times per GPU per reading.
        # Positional, in GpuSample's field order (checked by the tests): keywords cost a
        # name lookup per field, 25 per GPU per reading.
        return GpuSample(
            gpu_uuid,  # uuid
            now,  # time_s
            True,  # available
            int(util * 1000.0 + 0.5) / 1000.0,  # utilization_pct
            new_samples,  # utilization_samples_pct
            int(mem_util * 1000.0 + 0.5) / 1000.0,  # memory_utilization_pct
            mem_used if mem_used < total else total,  # memory_used_bytes
            total,  # memory_total_bytes
            int(power * 100.0 + 0.5) / 100.0,  # power_w
            energy,  # energy_mj
            g.clock_max if util > 0.0 else g.clock_idle,  # sm_clock_mhz
            g.mem_clock,  # memory_clock_mhz
            int(throttle),  # throttle_reasons
            int(300.0 + 450.0 * (heat if heat < 1.0 else 1.0) + 0.5) / 10.0,  # temperature_c
            float(pcie_tx) if fresh else 0.0,  # pcie_tx_bytes_per_s
            float(pcie_rx) if fresh else 0.0,  # pcie_rx_bytes_per_s
            int(nvlink_tx) if nvlink else None,  # nvlink_tx_bytes
            int(nvlink_rx) if nvlink else None,  # nvlink_rx_bytes
            int(ecc_c),  # ecc_corrected_total
            int(ecc_u),  # ecc_uncorrected_total
            new_xids,  # xid_events
            procs,  # processes
            sm_active,  # sm_active_pct
            None,  # sm_occupancy_pct
            tensor_active,  # tensor_active_pct
            None,  # violation_power_ns: a virtual GPU keeps the bitmask only
            None,  # violation_thermal_ns
        )


#: Memory utilization of a virtual GPU, per percent of duty cycle and of SM activity.
_MEM_UTIL_OF_DUTY = 0.1
_MEM_UTIL_OF_SM = 0.4

#: Length of a version 2 state array: the version, then STATE_FIELDS.
_STATE_LEN = len(STATE_FIELDS) + 1
#: GpuSample's fields in the order ``_sample_one`` passes them.
SAMPLE_ORDER = (
    "uuid",
    "time_s",
    "available",
    "utilization_pct",
    "utilization_samples_pct",
    "memory_utilization_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "throttle_reasons",
    "temperature_c",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes",
    "nvlink_rx_bytes",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
    "xid_events",
    "processes",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "violation_power_ns",
    "violation_thermal_ns",
)


def _row_from_v1(st: Any, path: str) -> list[Any]:
    """A version 1 state (an object; missing optional keys take their defaults) as the
    version 2 array; ``ValueError``/``KeyError``/``TypeError`` when it is not one."""
    if not isinstance(st, dict):
        raise ValueError(f"{path}: not a virtual GPU state")
    get = st.get
    return [
        1,
        get("uuid"),
        st["t_s"],
        st["busy_s"],
        get("sm_active_s", 0.0),
        get("tensor_active_s", 0.0),
        st["energy_mj"],
        get("power_w"),
        get("memory_used_bytes"),
        get("throttle_reasons"),
        get("pcie_tx_bytes_per_s", 0.0),
        get("pcie_rx_bytes_per_s", 0.0),
        get("nvlink_tx_bytes", 0),
        get("nvlink_rx_bytes", 0),
        get("ecc_corrected_total", 0),
        get("ecc_uncorrected_total", 0),
        [
            [p.get("pid"), p.get("used_memory_bytes"), p.get("start_ticks")]
            for p in get("processes") or ()
        ],
        [[e["t_s"], e["xid"]] for e in get("xid_events") or ()],
        get("samples") or (),
    ]
