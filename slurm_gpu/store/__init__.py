"""The store: SQLite by default, PostgreSQL by URL. Only the collector writes it."""

from __future__ import annotations

from slurm_gpu.config import Settings
from slurm_gpu.store.schema import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_NONE,
    TELEMETRY_RECOVERED,
    TELEMETRY_STATES,
)
from slurm_gpu.store.store import (
    FindingLike,
    JobBundle,
    Store,
    StoredFinding,
    StoredJob,
    StoreInfo,
    idle_head_tail_s,
    mask_url,
    migrate_store,
)


def open_store(settings: Settings, *, readonly: bool = False) -> Store:
    """The configured store. Writers migrate it first; readers (``readonly``) only check that
    it is at the schema version this release needs (``StoreError`` otherwise)."""
    return Store.open(settings.store_url, migrate=not readonly)


__all__ = [
    "TELEMETRY_COMPLETE",
    "TELEMETRY_MISSING",
    "TELEMETRY_NONE",
    "TELEMETRY_RECOVERED",
    "TELEMETRY_STATES",
    "FindingLike",
    "JobBundle",
    "Store",
    "StoreInfo",
    "StoredFinding",
    "StoredJob",
    "idle_head_tail_s",
    "mask_url",
    "migrate_store",
    "open_store",
]
