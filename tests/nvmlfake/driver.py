"""Driver profiles played by a fake ``libnvidia-ml.so.1`` (``fakenvml.c``).

The library is compiled with the machine's C compiler the first time a profile needs it (a
fraction of a second; cached per source and symbol set under the temporary directory). A
profile (``profiles/*.json``) is data: the driver version, the functions that driver branch
does not export (left out of the symbol table, so pynvml meets ``FUNCTION_NOT_FOUND`` exactly
as on that driver), the field ids it does not know, the process-struct size of its
``_v3`` call, and the GPUs with their MIG slices, values and per-call errors.

``FakeDriver.install(pynvml)`` points the real pynvml at the library, so its own wrappers,
ctypes structs, version decorators and exception classes run against it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
PROFILES = HERE / "profiles"

#: NVML return codes by the names profiles use (nvml.h).
CODES = {
    "SUCCESS": 0,
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "GPU_NOT_FOUND": 28,
    "UNKNOWN": 999,
}
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
NO_ID = 0xFFFFFFFF

#: Values every GPU starts with unless its profile says otherwise.
GPU_DEFAULTS: dict[str, int] = {
    "mem_total": 80 * 2**30,
    "mem_used": 30 * 2**30,
    "mem_reserved": 512 * 2**20,
    "util_gpu": 87,
    "util_mem": 12,
    "power_mw": 512_345,
    "energy_mj": 9_000_000,
    "clock_sm": 1980,
    "clock_mem": 2619,
    "clocks_event_reasons": 0x4,
    "temp_c": 64,
    "pcie_tx_kbs": 1000,
    "pcie_rx_kbs": 3000,
    "pcie_tx_bytes": 10**9,
    "pcie_rx_bytes": 3 * 10**9,
    "nvlink_tx_kib": 100,
    "nvlink_rx_kib": 7,
    "ecc_sbe": 3,
    "ecc_dbe": 0,
    "cc_major": 9,
    "cc_minor": 0,
    "power_limit_mw": 700_000,
    "gpm_sm_util": 61_500,  # thousandths of a percent
    "gpm_sm_occupancy": 40_000,
    "gpm_tensor_util": 22_000,
}


def _exported(source: str) -> list[str]:
    return re.findall(r"^API\s+[\w\s\*]+?\b(\w+)\(", source, flags=re.MULTILINE)


def build(absent: frozenset[str] = frozenset()) -> Path:
    """Compile the fake library without the ``absent`` symbols; cached by content."""
    source = SOURCE.read_text()
    names = [n for n in _exported(source) if n not in absent]
    key = hashlib.sha256((source + "\0" + ",".join(sorted(absent))).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"slurm-gpu-nvmlfake-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    lib = cache / f"libnvidia-ml-{key}.so.1"
    if lib.exists():
        return lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler: install gcc (share/testcluster/install-deps does)")
    script = cache / f"{key}.map"
    script.write_text("{ global: " + "; ".join(names) + "; local: *; };\n")
    tmp = cache / f".{key}.{os.getpid()}.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(SOURCE),
         f"-Wl,--version-script={script}", "-Wl,-soname,libnvidia-ml.so.1"],
        check=True,
    )  # fmt: skip
    tmp.replace(lib)
    return lib


def load_profile(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PROFILES / f"{name}.json").read_text())
    return data


def _code(value: int | str) -> int:
    return value if isinstance(value, int) else CODES[value]


class FakeDriver:
    """One driver profile loaded into the fake library, and the knobs tests turn."""

    def __init__(self, profile: dict[str, Any] | str) -> None:
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.path = build(frozenset(self.profile.get("absent", ())))
        self.lib = ctypes.CDLL(str(self.path))
        self._types()
        self.index: dict[str, int] = {}
        self.load()

    def _types(self) -> None:
        lib, c = self.lib, ctypes
        lib.fake_add_device.argtypes = [c.c_int, c.c_char_p, c.c_char_p, c.c_int, c.c_int, c.c_int]
        lib.fake_set.argtypes = [c.c_int, c.c_char_p, c.c_longlong]
        lib.fake_set_global.argtypes = [c.c_char_p, c.c_longlong]
        lib.fake_set_driver.argtypes = [c.c_char_p]
        lib.fake_fail.argtypes = [c.c_int, c.c_char_p, c.c_int]
        lib.fake_add_process.argtypes = [c.c_int, c.c_uint, c.c_ulonglong, c.c_uint, c.c_uint]
        lib.fake_add_sample.argtypes = [c.c_int, c.c_ulonglong, c.c_uint]
        lib.fake_push_event.argtypes = [c.c_int, c.c_ulonglong, c.c_ulonglong, c.c_uint, c.c_uint]
        lib.fake_recreate.argtypes = [c.c_int, c.c_char_p]
        lib.fake_calls.argtypes = [c.c_char_p]
        lib.fake_calls.restype = c.c_longlong
        lib.fake_gpm_live.restype = c.c_longlong
        lib.fake_call_name.argtypes = [c.c_int, c.c_char_p, c.c_uint, c.POINTER(c.c_longlong)]
        lib.fake_batch_name.argtypes = [c.c_int, c.c_char_p, c.c_uint, c.POINTER(c.c_longlong)]

    def load(self) -> None:
        """(Re)load the profile into the library: the state of a freshly booted node."""
        p, lib = self.profile, self.lib
        lib.fake_reset()
        lib.fake_set_driver(str(p.get("driver", "570.124.06")).encode())
        lib.fake_set_global(b"proc_v3_bytes", int(p.get("proc_v3_bytes", 24)))
        lib.fake_set_global(b"stale_code", _code(p.get("stale_code", "GPU_IS_LOST")))
        for fid in p.get("absent_fields", ()):
            lib.fake_set_global(b"absent_field", int(fid))
        self.index = {}
        for minor, gpu in enumerate(p.get("gpus", ())):
            i = self._device(-1, gpu, gpu.get("minor", minor))
            for child in gpu.get("mig", ()):
                self._device(i, child, -1)

    def _device(self, parent: int, spec: dict[str, Any], minor: int) -> int:
        lib = self.lib
        i: int = lib.fake_add_device(
            parent, spec["uuid"].encode(), spec.get("name", "NVIDIA H100 80GB HBM3").encode(),
            minor, spec.get("gi", -1), spec.get("ci", -1),
        )  # fmt: skip
        self.index[spec["uuid"]] = i
        values = dict(GPU_DEFAULTS) if parent < 0 else {}
        values.update(spec.get("values", {}))
        for key, value in values.items():
            self.set(spec["uuid"], key, value)
        for key in ("mig_mode", "max_mig", "gpm"):
            if key in spec:
                self.set(spec["uuid"], key, int(spec[key]))
        if spec.get("lost"):
            self.set(spec["uuid"], "lost_code", _code(spec["lost"]))
        for fn, code in spec.get("fail", {}).items():
            self.fail(spec["uuid"], fn, code)
        for pid, mem, *ids in spec.get("processes", ()):
            gi, ci = ids if ids else (NO_ID, NO_ID)
            self.add_process(spec["uuid"], pid, mem, gi, ci)
        return i

    # ---------------------------------------------------------------- pynvml

    def install(self, pynvml: ModuleType) -> None:
        """Make the real pynvml call this library (what its _LoadNvmlLibrary would load)."""
        pynvml.nvmlLib = self.lib
        pynvml._nvmlGetFunctionPointer_cache.clear()

    # ---------------------------------------------------------------- knobs

    def set(self, uuid: str, key: str, value: int) -> None:
        if self.lib.fake_set(self.index[uuid], key.encode(), int(value)) != 0:
            raise KeyError(key)

    def fail(self, uuid: str, fn: str, code: int | str) -> None:
        self.lib.fake_fail(self.index[uuid], fn.encode(), _code(code))

    def lose(self, uuid: str, code: int | str = "GPU_IS_LOST") -> None:
        self.set(uuid, "lost_code", _code(code))

    def add_process(
        self, uuid: str, pid: int, mem: int | None, gi: int = NO_ID, ci: int = NO_ID
    ) -> None:
        raw = 0xFFFFFFFFFFFFFFFF if mem is None else mem
        self.lib.fake_add_process(self.index[uuid], pid, raw, gi, ci)

    def clear_processes(self, uuid: str) -> None:
        self.lib.fake_clear_processes(self.index[uuid])

    def add_sample(self, uuid: str, ts_us: int, value: int) -> None:
        self.lib.fake_add_sample(self.index[uuid], ts_us, value)

    def xid(self, uuid: str, xid: int, gi: int = NO_ID, ci: int = NO_ID) -> None:
        self.lib.fake_push_event(self.index[uuid], XID_EVENT, xid, gi, ci)

    def set_global(self, key: str, value: int | str) -> None:
        self.lib.fake_set_global(key.encode(), _code(value) if isinstance(value, str) else value)

    def reload(self) -> None:
        """A driver reload (rmmod/modprobe, or an upgrade): every handle goes stale."""
        self.lib.fake_reload()

    def recreate(self, uuid: str, new_uuid: str) -> None:
        """Destroy and recreate a MIG instance in the same slot (same GI/CI, new UUID)."""
        i = self.index.pop(uuid)
        self.lib.fake_recreate(i, new_uuid.encode())
        self.index[new_uuid] = i

    def calls(self, name: str | None = None) -> int:
        return int(self.lib.fake_calls(name.encode() if name else None))

    def call_table(self) -> dict[str, int]:
        out: dict[str, int] = {}
        buf = ctypes.create_string_buffer(96)
        n = ctypes.c_longlong()
        i = 0
        while self.lib.fake_call_name(i, buf, 96, ctypes.byref(n)) == 0:
            out[buf.value.decode()] = n.value
            i += 1
        return out

    def field_batches(self) -> dict[tuple[int, ...], int]:
        """``nvmlDeviceGetFieldValues`` calls by the field ids they asked (in their order)."""
        out: dict[tuple[int, ...], int] = {}
        buf = ctypes.create_string_buffer(160)
        n = ctypes.c_longlong()
        i = 0
        while self.lib.fake_batch_name(i, buf, 160, ctypes.byref(n)) == 0:
            text = buf.value.decode()
            out[tuple(int(f) for f in text.split(",")) if text else ()] = n.value
            i += 1
        return out

    def field_reads(self, field_id: int) -> int:
        """How many ``nvmlDeviceGetFieldValues`` calls asked for ``field_id``."""
        return sum(n for ids, n in self.field_batches().items() if field_id in ids)

    def reset_calls(self) -> None:
        self.lib.fake_reset_calls()

    def gpm_live(self) -> int:
        return int(self.lib.fake_gpm_live())

    def registered(self) -> int:
        return int(self.lib.fake_registered())

    def break_event_sets(self) -> None:
        self.lib.fake_break_event_sets()

    def event_sets_alive(self) -> int:
        return int(self.lib.fake_event_sets_alive())


class Clock:
    """Seconds since the epoch, moved by the test; also sets the fake driver's clock (µs),
    so that field timestamps and GPM samples follow the same time as the source."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start
        self.driver: FakeDriver | None = None

    def __call__(self) -> float:
        return self.t

    def attach(self, driver: FakeDriver) -> None:
        self.driver = driver
        driver.set_global("now_us", int(self.t * 1_000_000))

    def advance(self, seconds: float) -> None:
        self.t += seconds
        if self.driver is not None:
            self.driver.set_global("now_us", int(self.t * 1_000_000))


def loaded_drivers(monkeypatch: Any, clock: Clock) -> Iterator[Callable[[str], FakeDriver]]:
    """The body of a ``driver`` fixture: yields ``load(profile)``, which installs a fake
    driver of that profile into pynvml on ``clock``; pynvml's function cache is cleared after
    the test, so the next test binds its own library."""
    import pynvml

    def load(profile: str) -> FakeDriver:
        drv = FakeDriver(profile)
        drv.install(pynvml)
        monkeypatch.setattr(pynvml, "nvmlLib", drv.lib)
        clock.attach(drv)
        return drv

    yield load
    pynvml._nvmlGetFunctionPointer_cache.clear()
