"""Configuration: one TOML file parsed into typed, validated, frozen settings.

The file is ``/etc/slurm-gpu/config.toml`` unless ``SLURM_GPU_CONFIG`` names another. A missing
default file means "all defaults"; a missing file that was named explicitly is an error. Every
key is declared once, below, as a field of a section dataclass with its default, its unit in
the name and its constraints in ``metadata``; ``share/config.example.toml`` lists every key and
a test checks the two agree.

Only the composition roots (the CLI and the hooks) call ``load_settings``. Privileged code
(anything running as root, and the hooks, sampler, collector and ship always) reads only a
trusted file (``slurm_gpu.trust``): the environment may choose which file, never supply one.

The declarations live in one module per side (``node``, ``central``, ``analysis``, ``people``,
``live``, ``stacks``, ``energy``, ``web``), ``settings`` gathers them, ``loading`` reads the
file and ``example`` writes it out; this package's face hands the names on so that callers
import from ``slurm_gpu.config``.
"""

from slurm_gpu.config.analysis import AnalysisSettings
from slurm_gpu.config.central import (
    SOURCE_HOOKS,
    SOURCE_NONE,
    AccountingSettings,
    CollectorSettings,
    SourceSettings,
    StoreSettings,
)
from slurm_gpu.config.energy import EnergySettings
from slurm_gpu.config.example import describe, example_toml
from slurm_gpu.config.live import LiveSettings
from slurm_gpu.config.loading import (
    DEFAULT_PATH,
    ENV_VAR,
    MAX_CONFIG_BYTES,
    config_path,
    load_settings,
    must_be_trusted,
    parse_settings,
)
from slurm_gpu.config.node import HooksSettings, PathsSettings, ShipSettings, TelemetrySettings
from slurm_gpu.config.people import GpueffSettings, MailSettings, ReportSettings
from slurm_gpu.config.settings import Settings, sections
from slurm_gpu.config.stacks import OPT_IN_TOKEN, StacksSettings
from slurm_gpu.config.web import WebSettings

__all__ = [
    "DEFAULT_PATH",
    "ENV_VAR",
    "MAX_CONFIG_BYTES",
    "OPT_IN_TOKEN",
    "SOURCE_HOOKS",
    "SOURCE_NONE",
    "AccountingSettings",
    "AnalysisSettings",
    "CollectorSettings",
    "EnergySettings",
    "GpueffSettings",
    "HooksSettings",
    "LiveSettings",
    "MailSettings",
    "PathsSettings",
    "ReportSettings",
    "Settings",
    "ShipSettings",
    "SourceSettings",
    "StacksSettings",
    "StoreSettings",
    "TelemetrySettings",
    "WebSettings",
    "config_path",
    "describe",
    "example_toml",
    "load_settings",
    "must_be_trusted",
    "parse_settings",
    "sections",
]
