"""GPU telemetry sources behind one protocol (``TelemetrySource``).

``open_source`` is how the composition roots (hooks, sampler, CLI) pick the backend named by
``telemetry.backend``; it imports the chosen module only, so pynvml is never loaded on a node
configured for virtual GPUs, nor by anything that merely imports ``slurm_gpu``.
"""

from __future__ import annotations

from slurm_gpu.config import Settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.telemetry.base import TelemetrySource

__all__ = ["TelemetrySource", "open_source"]


def open_source(settings: Settings) -> TelemetrySource:
    """The telemetry source configured by ``settings.telemetry.backend``.

    Raises ``TelemetryUnavailableError`` when the backend cannot read anything (virtual
    directory missing; for NVML the library is only loaded on first use) and ``ConfigError``
    for an unknown backend.
    """
    backend = settings.telemetry.backend
    if backend == "nvml":
        from slurm_gpu.telemetry.nvml import NvmlSource

        return NvmlSource()
    if backend == "virtual":
        from slurm_gpu.telemetry.virtual import VirtualGpuSource

        return VirtualGpuSource(settings.telemetry.virtual_dir)
    raise ConfigError(
        f"unknown telemetry backend {backend!r}",
        key="telemetry.backend",
        path=settings.path,
        hint='use "nvml" or "virtual"',
    )
