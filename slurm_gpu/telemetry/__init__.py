"""GPU telemetry sources behind one protocol (``TelemetrySource``).

``open_source`` is how the composition roots (hooks, sampler, CLI) pick the backend named by
``telemetry.backend``; it imports the chosen module only, so pynvml is never loaded on a node
configured for virtual GPUs, nor by anything that merely imports ``slurm_gpu``.
"""

from __future__ import annotations

from slurm_gpu.config import Settings, TelemetrySettings
from slurm_gpu.errors import ConfigError
from slurm_gpu.telemetry.base import CounterSource, TelemetrySource

__all__ = ["CounterSource", "TelemetrySource", "counters_every", "open_source"]


def counters_every(telemetry: TelemetrySettings) -> int:
    """At how many readings in one the costly cumulative counters are read: the readings in
    ``counters_interval_s`` (at least 1; 1 when it is 0 or not above ``interval_s``)."""
    if telemetry.counters_interval_s <= telemetry.interval_s:
        return 1
    return max(1, round(telemetry.counters_interval_s / telemetry.interval_s))


def open_source(settings: Settings) -> TelemetrySource:
    """The telemetry source configured by ``settings.telemetry.backend``.

    Raises ``TelemetryUnavailableError`` when the backend cannot read anything (virtual
    directory missing; for NVML the library is only loaded on first use) and ``ConfigError``
    for an unknown backend.
    """
    backend = settings.telemetry.backend
    if backend == "nvml":
        from slurm_gpu.telemetry.nvml import NvmlSource

        return NvmlSource(counters_every=counters_every(settings.telemetry))
    if backend == "virtual":
        from slurm_gpu.telemetry.virtual import VirtualGpuSource

        return VirtualGpuSource(settings.telemetry.virtual_dir)
    raise ConfigError(
        f"unknown telemetry backend {backend!r}",
        key="telemetry.backend",
        path=settings.path,
        hint='use "nvml" or "virtual"',
    )
