"""File-backed virtual GPUs, for machines (test clusters, CI, laptops) that have no GPU.

A virtual GPU is a directory ``<virtual_dir>/<minor>/`` holding two JSON files:

``identity.json``
    What never changes: ``uuid`` (``GPU-<uuid4>``), ``minor_number``, ``name``,
    ``memory_total_bytes``, ``power_limit_w``, ``idle_power_w``, ``max_power_w``,
    ``compute_capability``, ``sm_clock_max_mhz``, ``sm_clock_idle_mhz``, ``memory_clock_mhz``,
    ``pci_bus_id`` and ``nvlink`` (whether NVLink counters exist).
``state.json``
    Rewritten atomically (temporary file + rename) by the workload driving the GPU, every tick.
    Version 2 is one JSON array: the version (``2``), then the values of ``STATE_FIELDS`` in
    that order. Version 1 (an object with ``"schema": 1`` and these names as keys, processes
    and XID events as objects) is still read. The state names its GPU (``uuid``; version 1
    files written before that field existed are still read). Like a real device it holds
    *cumulative* counters, so a reader polling at any rate gets exact averages over its own
    interval: ``busy_s`` (seconds during which a kernel ran), ``sm_active_s`` and
    ``tensor_active_s`` (busy seconds weighted by the share of SMs / tensor cores active),
    ``energy_mj``, ``nvlink_tx_bytes``/``nvlink_rx_bytes``; and current values: ``t_s`` (when
    written), ``power_w``, ``memory_used_bytes``, ``processes`` (``[pid, used_memory_bytes,
    start_ticks]`` each), ``throttle_reasons``, ``pcie_tx_bytes_per_s``/``pcie_rx_bytes_per_s``,
    ``ecc_corrected_total``, ``ecc_uncorrected_total``, ``xid_events`` (``[t_s, xid]`` each) and
    ``samples``, a short ring of recent ``[t_s, utilization_pct]`` sub-interval samples.

``VirtualGpuSource`` reads them the way NVML reads a real GPU: the duty cycle of a reading is
the ``busy_s`` delta over the time since the previous reading; when no workload writes any more
(the state is older than ``STALE_AFTER_S``) the GPU is idle, draws its idle power and its energy
counter keeps growing; processes whose pid has gone are dropped (and their memory freed, as the
driver does). A GPU whose files vanished or are corrupt reads as ``available=False``; the
others go on. Every file is read by ``read_bounded``: a link (to ``/dev/zero``, say), a FIFO,
anything but a regular file, or a file over ``MAX_FILE_BYTES`` reads as a lost GPU.

``VirtualGpuDevice`` is the writer API used by the demo workloads.

These directories are a *test fixture*: each GPU's directory and files are created
world-writable (0777 and 0666; the top directory 0755) because jobs of any user drive the
GPUs allocated to them. Never point ``telemetry.virtual_dir`` at a directory that matters.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import stat
import time
import uuid as uuid_mod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample
from slurm_gpu.telemetry.base import THROTTLE_GPU_IDLE

SCHEMA_VERSION = 1
"""Version of ``identity.json``."""
STATE_VERSION = 2
"""Version of ``state.json`` the writer writes; the reader also takes version 1."""
#: The values of a version 2 ``state.json``, in order, after the version.
STATE_FIELDS = (
    "uuid",
    "t_s",
    "busy_s",
    "sm_active_s",
    "tensor_active_s",
    "energy_mj",
    "power_w",
    "memory_used_bytes",
    "throttle_reasons",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes",
    "nvlink_rx_bytes",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
    "processes",
    "xid_events",
    "samples",
)
IDENTITY_FILE = "identity.json"
STATE_FILE = "state.json"
STALE_AFTER_S = 1.0
"""A state older than this means no workload is driving the GPU (writers tick every
0.1-0.25 s)."""
SAMPLE_RING = 40
"""Sub-interval samples kept in ``state.json`` (about 5-10 s of ticks)."""
DIR_MODE = 0o777
FILE_MODE = 0o666

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Capacity and power envelope of a virtual GPU model."""

    name: str
    memory_total_bytes: int
    power_limit_w: float
    idle_power_w: float
    max_power_w: float
    compute_capability: tuple[int, int]
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    memory_clock_mhz: int
    nvlink: bool


_MIB = 1024 * 1024

#: Models ``slurm-gpu vgpu create --model`` knows; numbers from the vendors' data sheets.
MODELS: dict[str, GpuModel] = {
    "h100": GpuModel(
        "NVIDIA H100 80GB HBM3", 81559 * _MIB, 700.0, 70.0, 690.0, (9, 0), 1980, 345, 2619, True
    ),
    "a100": GpuModel(
        "NVIDIA A100-SXM4-40GB", 40960 * _MIB, 400.0, 55.0, 395.0, (8, 0), 1410, 210, 1215, True
    ),
    "v100": GpuModel(
        "Tesla V100-SXM2-32GB", 32768 * _MIB, 300.0, 40.0, 295.0, (7, 0), 1530, 135, 877, True
    ),
    "l4": GpuModel("NVIDIA L4", 23034 * _MIB, 72.0, 16.0, 72.0, (8, 9), 2040, 210, 6251, False),
}
DEFAULT_MODEL = "h100"


def resolve_model(model: str) -> GpuModel:
    """The model named by its key (``a100``) or product name (``NVIDIA A100-SXM4-40GB``), in
    any case. Raises ``TelemetryUnavailableError`` for an unknown one."""
    wanted = model.strip().lower()
    for key, spec in MODELS.items():
        if wanted in (key, spec.name.lower()):
            return spec
    names = ", ".join(f"{k} ({m.name})" for k, m in MODELS.items())
    raise TelemetryUnavailableError(
        f"unknown virtual GPU model {model!r}", hint=f"known models: {names}"
    )


# --------------------------------------------------------------------------- file helpers


def _write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` by temporary file + rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(data, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        # fchmod because the umask of a job would otherwise make the file unwritable for the
        # next job's user.
        os.fchmod(fd, FILE_MODE)
        os.write(fd, payload)
    finally:
        os.close(fd)
    os.replace(tmp, path)


#: Largest virtual GPU file read, bytes (a state with a full sample ring is about 2 KB).
MAX_FILE_BYTES = 64 * 1024


def read_bounded(path: str | os.PathLike[str]) -> bytes:
    """A virtual GPU file, read as the sampler (root) must read a file any user may replace:
    a link is not followed, a FIFO does not block, anything but a regular file is refused,
    and at most ``MAX_FILE_BYTES`` are read (a longer file is refused). Raises ``OSError``
    or ``ValueError``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{os.fspath(path)}: not a regular file")
        chunks = []
        total = 0
        while total <= MAX_FILE_BYTES:
            want = MAX_FILE_BYTES + 1 - total
            chunk = os.read(fd, want)
            chunks.append(chunk)
            total += len(chunk)
            if len(chunk) < want:
                break  # a regular file reads short only at its end: no second read
    finally:
        os.close(fd)
    if total > MAX_FILE_BYTES:
        raise ValueError(f"{os.fspath(path)}: over {MAX_FILE_BYTES} bytes")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(read_bounded(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def _state_row(state: Mapping[str, Any]) -> list[Any]:
    """The version 2 ``state.json`` value of a state held as a version 1 object."""
    row: list[Any] = [STATE_VERSION]
    row += (state[name] for name in STATE_FIELDS[:-3])
    row.append(
        [
            [p.get("pid"), p.get("used_memory_bytes"), p.get("start_ticks")]
            for p in state["processes"]
        ]
    )
    row.append([[e["t_s"], e["xid"]] for e in state["xid_events"]])
    row.append(state["samples"])
    return row


def _state_from_row(row: Any) -> dict[str, Any]:
    """A version 2 ``state.json`` value as the version 1 object; ``ValueError`` if it is not
    one."""
    if not isinstance(row, list) or len(row) != len(STATE_FIELDS) + 1 or row[0] != STATE_VERSION:
        raise ValueError("not a version 2 virtual GPU state")
    state = dict(zip(STATE_FIELDS, row[1:], strict=True))
    state["schema"] = 1
    state["processes"] = [
        {"pid": pid, "used_memory_bytes": mem, "start_ticks": start}
        for pid, mem, start in state["processes"]
    ]
    state["xid_events"] = [{"t_s": t, "xid": xid} for t, xid in state["xid_events"]]
    return state


def read_state(path: Path) -> dict[str, Any]:
    """A ``state.json`` of either version, as the version 1 object (what the writer works
    on). Raises ``OSError`` or ``ValueError``."""
    data = json.loads(read_bounded(path))
    if isinstance(data, dict):
        return data
    try:
        return _state_from_row(data)
    except TypeError as exc:
        raise ValueError(f"{path}: not a virtual GPU state ({exc})") from None


def _pid_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or
    ``None`` if the process does not exist. Used to tell a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _process_alive(entry: Mapping[str, Any]) -> bool:
    return _pid_alive(entry.get("pid"), entry.get("start_ticks"))


def _pid_alive(pid: Any, recorded: Any) -> bool:
    """Whether ``pid`` runs and (when ``recorded`` is not ``None``) started at ``recorded``
    clock ticks, i.e. is the process a state file listed and not a reused pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    ticks = _pid_start_ticks(pid)
    if ticks is None:
        return False
    return recorded is None or recorded == ticks


def gpu_dirs(virtual_dir: Path) -> list[tuple[int, Path]]:
    """``(minor, directory)`` of every virtual GPU under ``virtual_dir``, by minor number."""
    found = []
    for child in virtual_dir.iterdir():
        if child.name.isdigit() and child.is_dir():
            found.append((int(child.name), child))
    return sorted(found)


# --------------------------------------------------------------------------- creation


def create_gpus(
    virtual_dir: str | os.PathLike[str],
    count: int,
    *,
    model: str = DEFAULT_MODEL,
    memory_gib: float | None = None,
    clock: Clock = time.time,
) -> list[GpuInfo]:
    """Create virtual GPUs with minor numbers ``0..count-1`` (idempotent).

    An existing GPU keeps its UUID and counters; its capacity is updated to the model given.
    Returns the GPUs' identities. Raises ``TelemetryUnavailableError`` for an unknown model or an
    unwritable directory.
    """
    spec = resolve_model(model)
    memory_total = int(memory_gib * 1024**3) if memory_gib else spec.memory_total_bytes
    root = Path(virtual_dir)
    infos = []
    try:
        if not root.is_dir():
            root.mkdir(parents=True)
            # Users need not create or remove GPUs, only rewrite their state files.
            os.chmod(root, 0o755)
        for minor in range(count):
            gpu_dir = root / str(minor)
            gpu_dir.mkdir(exist_ok=True)
            os.chmod(gpu_dir, DIR_MODE)
            gpu_uuid = None
            with contextlib.suppress(OSError, ValueError):
                old = _read_json(gpu_dir / IDENTITY_FILE)
                if isinstance(old.get("uuid"), str) and old["uuid"].startswith("GPU-"):
                    gpu_uuid = old["uuid"]
            identity = {
                "schema": SCHEMA_VERSION,
                "uuid": gpu_uuid or f"GPU-{uuid_mod.uuid4()}",
                "minor_number": minor,
                "name": spec.name,
                "memory_total_bytes": memory_total,
                "power_limit_w": spec.power_limit_w,
                "idle_power_w": spec.idle_power_w,
                "max_power_w": spec.max_power_w,
                "compute_capability": list(spec.compute_capability),
                "sm_clock_max_mhz": spec.sm_clock_max_mhz,
                "sm_clock_idle_mhz": spec.sm_clock_idle_mhz,
                "memory_clock_mhz": spec.memory_clock_mhz,
                "pci_bus_id": f"00000000:{0x18 + minor:02X}:00.0",
                "nvlink": spec.nvlink,
            }
            _write_json_atomic(gpu_dir / IDENTITY_FILE, identity)
            state_path = gpu_dir / STATE_FILE
            try:
                read_state(state_path)
            except (OSError, ValueError):
                initial = _initial_state(clock(), str(identity["uuid"]))
                _write_json_atomic(state_path, _state_row(initial))
            infos.append(_info_from_identity(identity))
    except OSError as exc:
        raise TelemetryUnavailableError(
            f"cannot create virtual GPUs in {root}: {exc.strerror or exc}",
            hint="run as root or choose a writable --dir",
        ) from None
    return infos


def _initial_state(now: float, gpu_uuid: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "uuid": gpu_uuid,
        "t_s": now,
        "busy_s": 0.0,
        "sm_active_s": 0.0,
        "tensor_active_s": 0.0,
        "energy_mj": 0,
        "power_w": None,
        "memory_used_bytes": 0,
        "processes": [],
        "throttle_reasons": None,
        "pcie_tx_bytes_per_s": 0.0,
        "pcie_rx_bytes_per_s": 0.0,
        "nvlink_tx_bytes": 0,
        "nvlink_rx_bytes": 0,
        "ecc_corrected_total": 0,
        "ecc_uncorrected_total": 0,
        "xid_events": [],
        "samples": [],
    }


def _info_from_identity(identity: Mapping[str, Any]) -> GpuInfo:
    cc = identity.get("compute_capability")
    return GpuInfo(
        uuid=str(identity["uuid"]),
        index=int(identity["minor_number"]),
        minor_number=int(identity["minor_number"]),
        name=identity.get("name"),
        memory_total_bytes=identity.get("memory_total_bytes"),
        power_limit_w=identity.get("power_limit_w"),
        pci_bus_id=identity.get("pci_bus_id"),
        compute_capability=(int(cc[0]), int(cc[1])) if isinstance(cc, list) and cc else None,
    )


# --------------------------------------------------------------------------- writer


class VirtualGpuDevice:
    """Drives one virtual GPU the way a training process drives a real one.

    Typical use, once per tick of a workload::

        dev = VirtualGpuDevice.open(virtual_dir, minor)
        dev.attach(memory_bytes=30 * 2**30)     # this process now "uses" the GPU
        dev.tick(duty=0.95, sm_active=0.8)      # since the last tick a kernel ran 95 % of the time
        ...
        dev.detach()                            # process done: memory freed

    Every call that changes the state rewrites ``state.json`` atomically. Counters continue
    from what the file held, so they are monotonic across jobs like a real device's.
    """

    def __init__(self, gpu_dir: Path, identity: Mapping[str, Any], clock: Clock = time.time):
        self.gpu_dir = gpu_dir
        self.identity = dict(identity)
        self.info = _info_from_identity(identity)
        self._clock = clock
        self._rng = random.Random()
        now = clock()
        try:
            state = read_state(gpu_dir / STATE_FILE)
        except (OSError, ValueError):
            state = {}
        base = _initial_state(now, self.info.uuid)
        base.update({k: v for k, v in state.items() if k in base})
        base["uuid"] = self.info.uuid
        # Energy drawn at idle power while no workload was writing, as the device would have.
        last = float(base["t_s"]) if isinstance(base["t_s"], int | float) else now
        base["energy_mj"] = int(base["energy_mj"] or 0) + int(
            max(0.0, now - last) * self.idle_power_w * 1000
        )
        base["t_s"] = now
        base["power_w"] = self.idle_power_w
        # Processes of earlier jobs that died without detaching are gone from a real GPU too.
        base["processes"] = [p for p in base["processes"] if _process_alive(p)]
        if not base["processes"]:
            base["memory_used_bytes"] = 0
        self.state: dict[str, Any] = base

    @classmethod
    def open(
        cls, virtual_dir: str | os.PathLike[str], minor: int, *, clock: Clock = time.time
    ) -> VirtualGpuDevice:
        """Open virtual GPU ``minor`` for writing. Raises ``TelemetryUnavailableError`` if it
        does not exist."""
        gpu_dir = Path(virtual_dir) / str(minor)
        try:
            identity = _read_json(gpu_dir / IDENTITY_FILE)
            _info_from_identity(identity)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TelemetryUnavailableError(
                f"virtual GPU {minor} in {virtual_dir} cannot be opened ({exc})",
                hint="create it with: slurm-gpu vgpu create --dir DIR --count N",
            ) from None
        return cls(gpu_dir, identity, clock)

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def memory_total_bytes(self) -> int:
        return int(self.identity["memory_total_bytes"])

    @property
    def idle_power_w(self) -> float:
        return float(self.identity.get("idle_power_w", 0.0))

    @property
    def max_power_w(self) -> float:
        return float(self.identity.get("max_power_w", self.idle_power_w))

    # -- processes and memory

    def attach(self, pid: int | None = None, memory_bytes: int = 0) -> None:
        """Register ``pid`` (default: this process) as a compute process using ``memory_bytes``."""
        pid = os.getpid() if pid is None else pid
        procs = [p for p in self.state["processes"] if p.get("pid") != pid]
        procs.append({"pid": pid, "used_memory_bytes": 0, "start_ticks": _pid_start_ticks(pid)})
        self.state["processes"] = procs
        self.set_memory(memory_bytes, pid=pid)

    def detach(self, pid: int | None = None) -> None:
        """Unregister ``pid`` (default: this process) and free its memory."""
        pid = os.getpid() if pid is None else pid
        self.state["processes"] = [p for p in self.state["processes"] if p.get("pid") != pid]
        self._sum_memory()
        self.tick(0.0)

    def set_memory(self, used_bytes: int, pid: int | None = None) -> None:
        """Set the memory ``pid`` (default: this process) holds, clamped to the capacity."""
        pid = os.getpid() if pid is None else pid
        used = max(0, min(int(used_bytes), self.memory_total_bytes))
        for proc in self.state["processes"]:
            if proc.get("pid") == pid:
                proc["used_memory_bytes"] = used
        self._sum_memory()
        self.flush()

    def _sum_memory(self) -> None:
        total = sum(int(p.get("used_memory_bytes") or 0) for p in self.state["processes"])
        self.state["memory_used_bytes"] = min(total, self.memory_total_bytes)

    # -- activity

    def tick(
        self,
        duty: float,
        *,
        sm_active: float | None = None,
        tensor_active: float = 0.0,
        nvlink_tx_bytes_per_s: float = 0.0,
        nvlink_rx_bytes_per_s: float = 0.0,
        pcie_tx_bytes_per_s: float = 0.0,
        pcie_rx_bytes_per_s: float = 0.0,
    ) -> None:
        """Account the time since the previous tick: a kernel ran ``duty`` (0-1) of it.

        ``sm_active`` is the share of SMs busy while a kernel ran (default 0.8),
        ``tensor_active`` the share of cycles the tensor cores worked while a kernel ran.
        Throughputs are bytes per second over the tick. Power follows the duty cycle.
        """
        now = self._clock()
        dt = max(0.0, now - float(self.state["t_s"]))
        duty = min(1.0, max(0.0, duty))
        sm = 0.8 if sm_active is None else min(1.0, max(0.0, sm_active))
        st = self.state
        st["busy_s"] = float(st["busy_s"]) + duty * dt
        st["sm_active_s"] = float(st["sm_active_s"]) + duty * sm * dt
        st["tensor_active_s"] = float(st["tensor_active_s"]) + duty * min(1.0, tensor_active) * dt
        power = self.idle_power_w + (self.max_power_w - self.idle_power_w) * duty * (0.6 + 0.4 * sm)
        power *= 1.0 + self._rng.uniform(-0.02, 0.02)
        st["power_w"] = round(min(power, float(self.identity.get("power_limit_w") or power)), 2)
        st["energy_mj"] = int(st["energy_mj"]) + int(st["power_w"] * dt * 1000)
        st["nvlink_tx_bytes"] = int(st["nvlink_tx_bytes"]) + int(nvlink_tx_bytes_per_s * dt)
        st["nvlink_rx_bytes"] = int(st["nvlink_rx_bytes"]) + int(nvlink_rx_bytes_per_s * dt)
        st["pcie_tx_bytes_per_s"] = pcie_tx_bytes_per_s
        st["pcie_rx_bytes_per_s"] = pcie_rx_bytes_per_s
        st["t_s"] = now
        if dt > 0:
            st["samples"] = [*st["samples"], [now, round(duty * 100.0, 2)]][-SAMPLE_RING:]
        self.flush()

    def set_throttle(self, reasons: int | None) -> None:
        """Report an NVML clock-event-reason bitmask (``None``: derive idle/none from duty)."""
        self.state["throttle_reasons"] = reasons
        self.flush()

    def inject_xid(self, xid: int) -> None:
        """Report an XID error event now (e.g. 79: fallen off the bus, 48: double-bit ECC)."""
        events = [*self.state["xid_events"], {"t_s": self._clock(), "xid": int(xid)}]
        self.state["xid_events"] = events[-32:]
        self.flush()

    def add_ecc_errors(self, corrected: int = 0, uncorrected: int = 0) -> None:
        """Add to the volatile ECC error counters."""
        self.state["ecc_corrected_total"] = int(self.state["ecc_corrected_total"]) + corrected
        self.state["ecc_uncorrected_total"] = int(self.state["ecc_uncorrected_total"]) + uncorrected
        self.flush()

    def flush(self) -> None:
        """Write the state file now (atomically, version ``STATE_VERSION``)."""
        _write_json_atomic(self.gpu_dir / STATE_FILE, _state_row(self.state))


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
        self.gpm = (_info_from_identity(identity).compute_capability or (0, 0)) >= (9, 0)
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
            return _pid_alive(pid, recorded)
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
        alive = _pid_alive(pid, recorded)
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
        ticks = _pid_start_ticks(pid)
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
                info = _info_from_identity(_read_json(gpu_dir / IDENTITY_FILE))
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
        elif seen:
            util, sm_pct, tensor_pct = 0.0, 0.0, 0.0
        else:
            # First reading: like NVML, report the most recent driver sample period.
            util = float(ring[-1][1]) if fresh and ring else 0.0
            sm_pct, tensor_pct = None, None
        util = 100.0 if util > 100.0 else 0.0 if util < 0.0 else util
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
            int(util * 400.0 + 0.5) / 1000.0,  # memory_utilization_pct (40 % of the duty)
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
        )


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
