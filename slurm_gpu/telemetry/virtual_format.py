"""The on-disk format of file-backed virtual GPUs, shared by the device that workloads drive
(``telemetry.virtual_device``) and the source the sampler reads (``telemetry.virtual``).

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

These directories are a *test fixture*: each GPU's directory and files are created
world-writable (0777 and 0666; the top directory 0755) because jobs of any user drive the
GPUs allocated to them. Never point ``telemetry.virtual_dir`` at a directory that matters.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurm_gpu.records import GpuInfo

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


# --------------------------------------------------------------------------- file helpers


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


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(read_bounded(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def state_row(state: Mapping[str, Any]) -> list[Any]:
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


def state_from_row(row: Any) -> dict[str, Any]:
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
        return state_from_row(data)
    except TypeError as exc:
        raise ValueError(f"{path}: not a virtual GPU state ({exc})") from None


def pid_start_ticks(pid: int) -> int | None:
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


def process_alive(entry: Mapping[str, Any]) -> bool:
    return pid_alive(entry.get("pid"), entry.get("start_ticks"))


def pid_alive(pid: Any, recorded: Any) -> bool:
    """Whether ``pid`` runs and (when ``recorded`` is not ``None``) started at ``recorded``
    clock ticks, i.e. is the process a state file listed and not a reused pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    ticks = pid_start_ticks(pid)
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


def info_from_identity(identity: Mapping[str, Any]) -> GpuInfo:
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
