"""The virtual GPU device: what demo workloads (and ``slurm-gpu vgpu create``) write.

``create_gpus`` makes ``<virtual_dir>/<minor>/`` with ``identity.json`` and an initial
``state.json``; ``VirtualGpuDevice`` is the writer API the demo workloads drive every tick
(cumulative counters, processes, XID events), in the format of ``telemetry.virtual_format``.
The sampler never imports this module: it reads the files through ``telemetry.virtual``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import uuid as uuid_mod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.records import GpuInfo
from slurm_gpu.telemetry.virtual_format import (
    DIR_MODE,
    FILE_MODE,
    IDENTITY_FILE,
    SAMPLE_RING,
    SCHEMA_VERSION,
    STATE_FILE,
    Clock,
    info_from_identity,
    pid_start_ticks,
    process_alive,
    read_json,
    read_state,
    state_row,
)


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
                old = read_json(gpu_dir / IDENTITY_FILE)
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
                _write_json_atomic(state_path, state_row(initial))
            infos.append(info_from_identity(identity))
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
        self.info = info_from_identity(identity)
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
        base["processes"] = [p for p in base["processes"] if process_alive(p)]
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
            identity = read_json(gpu_dir / IDENTITY_FILE)
            info_from_identity(identity)
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
        procs.append({"pid": pid, "used_memory_bytes": 0, "start_ticks": pid_start_ticks(pid)})
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
        power_w: float | None = None,
    ) -> None:
        """Account the time since the previous tick: a kernel ran ``duty`` (0-1) of it.

        ``sm_active`` is the share of SMs busy while a kernel ran (default 0.8),
        ``tensor_active`` the share of cycles the tensor cores worked while a kernel ran.
        Throughputs are bytes per second over the tick. Power (watts) follows the duty cycle
        and SM activity unless ``power_w`` gives the board's draw (a kernel that keeps few
        SMs and little memory traffic busy draws far less than the model's share of duty);
        either way it is capped at the power limit.
        """
        now = self._clock()
        dt = max(0.0, now - float(self.state["t_s"]))
        duty = min(1.0, max(0.0, duty))
        sm = 0.8 if sm_active is None else min(1.0, max(0.0, sm_active))
        st = self.state
        st["busy_s"] = float(st["busy_s"]) + duty * dt
        st["sm_active_s"] = float(st["sm_active_s"]) + duty * sm * dt
        st["tensor_active_s"] = float(st["tensor_active_s"]) + duty * min(1.0, tensor_active) * dt
        if power_w is None:
            span = self.max_power_w - self.idle_power_w
            power = self.idle_power_w + span * duty * (0.6 + 0.4 * sm)
        else:
            power = max(0.0, power_w)
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
        _write_json_atomic(self.gpu_dir / STATE_FILE, state_row(self.state))
