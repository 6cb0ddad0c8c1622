"""How NVML answers are read: return codes, the exceptions pynvml raises, versioned calls.

No pynvml import here: the module object is passed in by ``nvml.py``. Codes are nvml.h's
numbers, which are part of NVML's ABI and the same in every pynvml release.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
GPU_NOT_FOUND = 28
NO_ID = 0xFFFFFFFF
"""An instance id that names no MIG instance (events and processes of a whole GPU)."""

#: The only answers that mean the GPU itself is gone (NVML's reference, and what nvidia-smi,
#: DCGM and Slurm's gpu_nvml.c treat as such). Anything else loses one field, not the GPU.
LOST_CODES = frozenset({GPU_IS_LOST, GPU_NOT_FOUND, RESET_REQUIRED})
#: Answers that mean NVML itself must be initialised again (driver reloaded or upgraded).
DRIVER_GONE_CODES = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH})


class GpuLost(Exception):
    """The GPU stopped answering (GPU_IS_LOST, GPU_NOT_FOUND, RESET_REQUIRED)."""


class DriverGone(Exception):
    """NVML answered as if the driver had been reloaded: re-initialise."""


class CallFailed(Exception):
    """One call failed for a reason that costs only its own field(s)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(code)
        self.code = code


def code_of(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def pynvml_errors(nv: Any) -> tuple[type[BaseException], ...]:
    """Every exception class a pynvml call can raise for a driver answer.

    ``NVMLLibraryMismatchError`` (pynvml 12.550 and later, unversioned calls on an older
    driver) is not an ``NVMLError``; ctypes raises ``ArgumentError`` for odd arguments.
    """
    extra = getattr(nv, "NVMLLibraryMismatchError", None)
    classes: list[type[BaseException]] = [nv.NVMLError, ctypes.ArgumentError]
    if isinstance(extra, type) and issubclass(extra, BaseException):
        classes.append(extra)
    return tuple(classes)


def call(
    nv: Any, errors: tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any
) -> Any:
    """``fn(*args)``; raise ``GpuLost``, ``DriverGone`` or ``CallFailed`` for a failure."""
    try:
        return fn(*args)
    except errors as exc:
        code = code_of(exc)
        if code in LOST_CODES:
            raise GpuLost from None
        if code in DRIVER_GONE_CODES:
            raise DriverGone from None
        if code is None and not isinstance(exc, nv.NVMLError):
            code = FUNCTION_NOT_FOUND  # NVMLLibraryMismatchError: the driver lacks the call
        raise CallFailed(code) from None
    except (AttributeError, TypeError, ValueError):
        raise CallFailed(FUNCTION_NOT_FOUND) from None  # a pynvml without this call


def parse_driver_version(text: str | None) -> tuple[int, ...]:
    """``"535.54.03"`` -> ``(535, 54, 3)``; ``()`` when unknown."""
    out: list[int] = []
    for part in (text or "").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
