"""The store: SQLite by default, PostgreSQL by URL. Only the collector writes it.

The names below load their module on first use (PEP 562): ``Store`` and the schema import
SQLAlchemy, which costs about 0.4 s, and ``gpueff`` reads SQLite stores through
``slurm_gpu.store.sqlite_reader`` without it. Importing this package stays free of SQLAlchemy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from slurm_gpu.lazy import lazy_exports

if TYPE_CHECKING:
    from slurm_gpu.config import Settings
    from slurm_gpu.store.rows import StoredFinding, StoredJob
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
        StoreInfo,
        idle_head_tail_s,
        mask_url,
        migrate_store,
    )

#: Exported name -> the module that defines it.
_HOMES = {
    "TELEMETRY_COMPLETE": "schema",
    "TELEMETRY_MISSING": "schema",
    "TELEMETRY_NONE": "schema",
    "TELEMETRY_RECOVERED": "schema",
    "TELEMETRY_STATES": "schema",
    "StoredFinding": "rows",
    "StoredJob": "rows",
    "FindingLike": "store",
    "JobBundle": "store",
    "Store": "store",
    "StoreInfo": "store",
    "idle_head_tail_s": "store",
    "mask_url": "store",
    "migrate_store": "store",
}


__getattr__ = lazy_exports(globals(), _HOMES)


def open_store(settings: Settings, *, readonly: bool = False) -> Store:
    """The configured store. Writers migrate it first; readers (``readonly``) only check that
    it is at the schema version this release needs (``StoreError`` otherwise).

    A writer of a SQLite store creates the file 0600 and keeps it, and the state directory
    holding it, readable by root and ``[store] admin_group`` only (``filemode``)."""
    from slurm_gpu.store.store import Store
    from slurm_gpu.store.urls import sqlite_path

    path = sqlite_path(settings.store_url)
    if path is not None and not readonly:
        from slurm_gpu.store.filemode import secure_sqlite_file

        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        secure_sqlite_file(path, settings.store.admin_group, state_dir=settings.paths.state_dir)
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
