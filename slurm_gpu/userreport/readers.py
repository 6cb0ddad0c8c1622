"""The real backends behind ``gpueff``: accounting as the caller, the store, the live spool.

Composition helpers for the CLI. Each import happens inside the function that needs it, so a
``gpueff`` on a job without GPUs never loads the store's database libraries.
"""

from __future__ import annotations

import os
from typing import Any

from slurm_gpu.config import Settings
from slurm_gpu.records import JobRecord
from slurm_gpu.userreport import adapter
from slurm_gpu.userreport.model import Telemetry


def reader_url(url: str) -> str:
    """The store URL for a reader that may not write where the store lives.

    A WAL-mode SQLite file cannot be opened, not even with ``mode=ro``, by a user who cannot
    create its ``-shm`` file next to it, which is every ordinary user of ``gpueff``. Such a
    reader opens the file ``immutable``: no locks and no ``-shm``. The price: a read racing a
    collector's commit can fail ("database disk image is malformed"; gpueff exits 6, and
    running it again works) or miss that commit. Other URLs are returned unchanged.
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return url
    path = url[len(prefix) :]
    if not path or path.startswith("file:") or path == ":memory:" or "?" in path:
        return url
    directory = os.path.dirname(os.path.abspath(path)) or "."
    eff = os.access in os.supports_effective_ids

    def writable(p: str) -> bool:
        return os.access(p, os.W_OK, effective_ids=eff)

    if writable(directory) and (not os.path.exists(path) or writable(path)):
        return url
    return f"{prefix}file:{path}?mode=ro&immutable=1&uri=true"


def make_accounting(settings: Settings) -> Any:
    """The configured accounting source, asking as the calling user."""
    from slurm_gpu.accounting import open_accounting

    return open_accounting(settings)


class StoreAndSpoolReader:
    """``TelemetryReader`` over the store (ended jobs) and the live spool (running jobs)."""

    def __init__(self, settings: Settings, *, spark_points: int = adapter.SPARK_POINTS) -> None:
        self._settings = settings
        self._spark_points = spark_points
        self._store: Any = None
        self._wording: adapter.Wording | None = None

    def _words(self) -> adapter.Wording:
        if self._wording is None:
            self._wording = adapter.findings_wording(self._settings.gpueff.template_dir)
        return self._wording

    def _open_store(self) -> Any:
        if self._store is None:
            from slurm_gpu.store import Store

            # Readers never migrate: a store behind this release is the admin's to upgrade.
            self._store = Store.open(reader_url(self._settings.store_url), migrate=False)
        return self._store

    def final(self, job: JobRecord) -> Telemetry | None:
        """The stored record of an ended job, with its findings; ``None`` if not stored."""
        stored = self._open_store().get_job(job.job_id, timelines=True)
        if stored is None:
            return None
        return adapter.telemetry_from_stored(stored, self._words(), spark_points=self._spark_points)

    def live(self, job: JobRecord) -> Telemetry | None:
        """The live summaries of a running job on every node readable; ``None`` if none."""
        from slurm_gpu import spool
        from slurm_gpu.errors import SpoolFormatError

        summaries = []
        # The job directory is 0711: the user cannot list it, but can open their own
        # <host>.live.json (0400, owned by them) when they know the host, which sacct told us.
        for host in job.nodelist:
            try:
                path = spool.JobSpool(self._settings.paths.spool_dir, job.job_id, host).live
                summaries.append(spool.read_live(path))
            except SpoolFormatError:
                continue  # not on this host's file system, not written yet, or not ours
        if not summaries:
            return None
        return adapter.telemetry_from_live(summaries)

    def close(self) -> None:
        """Release the store's connections, if it was opened."""
        if self._store is not None:
            self._store.close()


def make_reader(settings: Settings) -> StoreAndSpoolReader:
    """The reader ``gpueff`` uses outside tests."""
    return StoreAndSpoolReader(settings)
