"""Telemetry sources by the name ``[source]`` uses, made on demand.

Each name maps to the module that makes it, imported only when a partition uses that name
(the Prometheus client is not imported by a site that reads only Slurm accounting, and the
collector does not import a source at its own import time). A module listed here provides::

    def make_source(settings: Settings, name: str) -> TelemetrySource

``name`` is the configured name (one module may make several). The names the collector
handles itself, ``hooks`` and ``none``, make no source.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from slurm_gpu.config import SOURCE_HOOKS, SOURCE_NONE, Settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.sources.base import TelemetrySource

Factory = Callable[[Settings, str], TelemetrySource]

#: Configured name -> module providing ``make_source``.
MODULES: Mapping[str, str] = {
    "slurm-tres": "slurm_gpu.sources.accounting",
    "dcgm": "slurm_gpu.sources.prometheus",
    "jobstats": "slurm_gpu.sources.prometheus",
    "exporter": "slurm_gpu.sources.prometheus",
}

#: Every name ``[source]`` accepts.
NAMES: tuple[str, ...] = (SOURCE_HOOKS, SOURCE_NONE, *MODULES)


def check_name(name: str, key: str) -> str:
    """``name`` when ``[source]`` accepts it; else ``ConfigError`` naming ``key``."""
    if name not in NAMES:
        raise ConfigError(
            f"unknown telemetry source {name!r}",
            key=key,
            hint="one of " + ", ".join(NAMES),
        )
    return name


def factory(name: str) -> Factory:
    """The ``make_source`` of ``name``'s module. Raises ``ConfigError`` when the name is
    unknown or its module is not installed (an optional part of this release)."""
    check_name(name, "source")
    module_name = MODULES.get(name)
    if module_name is None:
        raise ConfigError(
            f"the telemetry source {name!r} is handled by the collector itself",
            key="source",
            hint="only pulled sources are made here",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"telemetry source {name!r} is not available ({exc})",
            key="source",
            hint=f"install the release that provides {module_name}, or choose another source",
        ) from None
    make: Factory = module.make_source
    return make


def make(settings: Settings, name: str) -> TelemetrySource:
    """The source ``name`` for ``settings`` (``ConfigError`` as ``factory``)."""
    return factory(name)(settings, name)
