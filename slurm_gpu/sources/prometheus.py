"""The registry's factory of the Prometheus sources (``dcgm``, ``jobstats``, ``exporter``).

All three read the site's Prometheus at ``[live] prometheus_url`` through the one client the
live view uses (``slurm_gpu.prometheus``): one Prometheus, one setting.
"""

from __future__ import annotations

from slurm_gpu.config import Settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.prometheus.client import PrometheusClient
from slurm_gpu.sources.base import TelemetrySource
from slurm_gpu.sources.prometheus_common import PrometheusSource, PromSourceOptions
from slurm_gpu.sources.prometheus_dcgm import DcgmExporterSource
from slurm_gpu.sources.prometheus_exporter import SlurmExporterSource
from slurm_gpu.sources.prometheus_jobstats import JobstatsSource

#: Configured name -> (source class, the name its records carry).
_CLASSES: dict[str, type[PrometheusSource]] = {
    "dcgm": DcgmExporterSource,
    "jobstats": JobstatsSource,
    "exporter": SlurmExporterSource,
}
#: Configured name -> the source name its records carry (``sourcecaps``).
RECORD_NAMES = {"dcgm": "dcgm-exporter", "jobstats": "jobstats", "exporter": "slurm-exporter"}


def make_source(settings: Settings, name: str) -> TelemetrySource:
    """The Prometheus source ``name`` (``ConfigError`` without ``[live] prometheus_url``)."""
    url = settings.live.prometheus_url
    if not url:
        raise ConfigError(
            f"telemetry source {name!r} reads Prometheus, and live.prometheus_url is empty",
            key="live.prometheus_url",
            path=settings.path,
            hint="set it to the site's Prometheus (http://host:9090; docs/install-prometheus.md)",
        )
    options = PromSourceOptions(
        idle_threshold_pct=settings.telemetry.idle_threshold_pct,
        timeline_points=settings.telemetry.timeline_points,
    )
    client = PrometheusClient(
        url,
        settings.live.prometheus_timeout_s,
        password_file=settings.live.prometheus_password_file,
    )
    source: TelemetrySource = _CLASSES[name](client, options)
    return source
