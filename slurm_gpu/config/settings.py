"""All sections together: the ``Settings`` record."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu.config.analysis import AnalysisSettings
from slurm_gpu.config.central import (
    AccountingSettings,
    CollectorSettings,
    SourceSettings,
    StoreSettings,
)
from slurm_gpu.config.energy import EnergySettings
from slurm_gpu.config.live import LiveSettings
from slurm_gpu.config.node import HooksSettings, PathsSettings, ShipSettings, TelemetrySettings
from slurm_gpu.config.people import GpueffSettings, MailSettings, ReportSettings
from slurm_gpu.config.stacks import StacksSettings
from slurm_gpu.config.web import WebSettings


@dataclass(frozen=True)
class Settings:
    """All settings. ``sources`` maps each dotted key to the file it came from, or 'default'."""

    paths: PathsSettings = field(default_factory=PathsSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    hooks: HooksSettings = field(default_factory=HooksSettings)
    accounting: AccountingSettings = field(default_factory=AccountingSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    ship: ShipSettings = field(default_factory=ShipSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    gpueff: GpueffSettings = field(default_factory=GpueffSettings)
    mail: MailSettings = field(default_factory=MailSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    source: SourceSettings = field(default_factory=SourceSettings)
    stacks: StacksSettings = field(default_factory=StacksSettings)
    energy: EnergySettings = field(default_factory=EnergySettings)
    web: WebSettings = field(default_factory=WebSettings)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    path: str | None = None
    """The file these settings were read from; ``None`` when every value is a default."""

    @property
    def store_url(self) -> str:
        """The store URL, with the SQLite default resolved."""
        return self.store.url or f"sqlite:///{self.paths.state_dir}/slurm-gpu.db"


def sections() -> dict[str, type[Any]]:
    """Section name -> its dataclass, in declaration order."""
    hints = typing.get_type_hints(Settings)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(Settings)
        if f.name not in ("sources", "path")
    }
