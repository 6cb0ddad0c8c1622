"""The collector's report step: ``gpueff``'s report of stored jobs, into the store, so that
``gpueff`` prints it.

The collector calls ``ReportPrerenderer.publish`` after each committed batch (and
``slurm-gpu store reports`` renders the jobs stored before, or under other templates). Each
report is rendered by ``storedreports`` exactly as ``gpueff`` renders it, here or in the report
worker (``renderpool``). ``gpueff`` uses it only while ``reportcache.render_key`` matches
(``slurm_gpu.jobreport.reportcache``).

Only SQLite stores: for PostgreSQL, ``gpueff`` imports SQLAlchemy and renders anyway, so a
cache would not make it faster. Rendering is best effort: a job that cannot be rendered is
logged and skipped, and ``gpueff`` then renders it itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from slurm_gpu.config import Settings
from slurm_gpu.jobreport.renderpool import RenderPool
from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter
from slurm_gpu.jobreport.storedreports import StoredReportRenderer, eligible
from slurm_gpu.records import JobRecord
from slurm_gpu.store.rows import CachedReport
from slurm_gpu.store.sqlite_reader import SqliteReader

log = logging.getLogger("slurm_gpu.prerender")


class ReportPrerenderer:
    """Renders reports of stored jobs and writes them with ``store.write_reports``.

    ``store`` is the open ``Store`` the collector writes to; ``settings`` must be those
    ``gpueff`` reads (the same configuration file), or the key will not match theirs.
    Each report is also written for its owner alone (``reportfiles``), where ``gpueff`` reads
    it when the store is not readable by users; ``files`` replaces that writer in tests.
    """

    def __init__(
        self,
        settings: Settings,
        store: Any,
        *,
        clock: Callable[[], float] = time.time,
        files: ReportFileWriter | None = None,
        pool: RenderPool | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._renderer = StoredReportRenderer(settings, store, clock=clock, files=files)
        self.path = self._renderer.path
        self.key = self._renderer.key
        self._writing: threading.Thread | None = None
        # The report worker (``[collector] report_worker``): SQLite stores only, where the
        # worker reads the store as gpueff does; a PostgreSQL store's reports are rendered here,
        # and so are those of a prerenderer given its own file writer (tests): the worker has
        # the default one.
        self._pool = pool
        if pool is None and files is None and self.path and settings.collector.report_worker:
            self._pool = RenderPool(settings)

    @property
    def files(self) -> ReportFileWriter:
        """The writer of the owners' report files."""
        return self._renderer.files

    @property
    def enabled(self) -> bool:
        """Whether reports are rendered: ``[gpueff] cache_reports`` (SQLite or PostgreSQL)."""
        return self._settings.gpueff.cache_reports

    def publish(self, jobs: Iterable[JobRecord]) -> int:
        """Render and store the reports of these just-stored jobs, or hand them to the report
        worker (``renderpool``: a batch of ``MIN_WORKER_JOBS`` or more, or any batch once the
        worker runs in this pass); returns how many were written or handed over. Never raises:
        the jobs are stored whatever happens here."""
        if not self.enabled:
            return 0
        try:
            self._store_done()
            todo = eligible(jobs)
            pool = self._pool
            if (
                pool is not None
                and todo
                and (pool.running or len(todo) >= MIN_WORKER_JOBS)
                and pool.submit(todo)
            ):
                return len(todo)
            return self._render_and_write(todo)
        except Exception:  # a rendering or store problem must not end the collector's pass
            log.exception("rendering gpueff reports failed; gpueff will render them itself")
            return 0

    def refresh(self, *, limit: int = 10_000) -> tuple[int, int]:
        """Render the stored jobs whose report is missing or was rendered under another key,
        newest first, at most ``limit``; returns (candidates, written). Raises ``StoreError``."""
        if not self.enabled:
            return (0, 0)
        ids = self._store.jobs_needing_reports(self.key, limit=limit)
        if not ids:
            return (0, 0)
        if self.path is None:  # PostgreSQL: the store's own reader
            found = (self._store.get_job(i) for i in ids)
            return (len(ids), self._render_and_write([s.job for s in found if s is not None]))
        with SqliteReader.open(self.path) as reader:
            jobs = [s.job for s in reader.jobs_for_ids(ids)]
        written = self._render_and_write(jobs)
        self.flush()
        return (len(ids), written)

    def render(self, jobs: Sequence[JobRecord]) -> tuple[list[CachedReport], list[ReportFile]]:
        """The reports of these stored jobs for the store and the owners' files
        (``StoredReportRenderer.render``)."""
        return self._renderer.render(jobs)

    def _render_and_write(self, jobs: Sequence[JobRecord]) -> int:
        out, files = self.render(jobs)
        if not out:
            return 0
        self._store.write_reports(out)
        # After the commit, as the store's rows: the owner's copy, readable by the owner alone.
        # A PostgreSQL store needs none: its row-level security shows users their own rows.
        if self.path is None:
            return len(out)
        # Written by a thread while the collector goes on with its next batch: the writing is
        # mostly system calls (creating, writing and renaming files, one syncfs), which run
        # without the interpreter lock, so on a machine with two cores they overlap the
        # collector's own work. One batch at a time, in order; ``_join_files`` waits for it.
        self._join_files()
        self._writing = threading.Thread(
            target=self._write_files, args=(files,), name="report-files", daemon=False
        )
        self._writing.start()
        return len(out)

    def _write_files(self, files: list[ReportFile]) -> None:
        try:
            self._renderer.files.write(files)
        except Exception:  # the writer logs its own errors; anything else must not be lost
            log.exception("writing report files failed; gpueff falls back to the store")

    def flush(self) -> None:
        """Wait until every report handed over is stored and its file written, rendering here
        the units the report worker has not started (the collector calls it at the end of
        each pass; ``refresh`` before it returns), and stop the worker. Never raises."""
        if self._pool is not None:
            try:
                self._pool.finish(self._render_here)
            except Exception:  # must not end the pass: the jobs are stored
                log.exception("the report worker's reports were not all rendered")
            self._store_done()
        self._join_files()

    def _render_here(self, jobs: list[JobRecord]) -> None:
        """A unit the worker did not render, rendered in this process at the end of a pass."""
        try:
            self._render_and_write(jobs)
        except Exception:  # as in ``publish``: logged, and the next unit goes on
            log.exception("rendering gpueff reports failed; gpueff will render them itself")
        self._store_done()

    def _store_done(self) -> None:
        """Store the reports the worker has rendered (the collector is the store's only
        writer: short transactions, none held while rendering)."""
        if self._pool is None:
            return
        done = self._pool.take_done()
        if not done:
            return
        try:
            self._store.write_reports(done)
        except Exception:  # the files are written; gpueff renders from the store otherwise
            log.exception("%d rendered report(s) not stored; gpueff renders them", len(done))

    def _join_files(self) -> None:
        """Wait until the report files of the last batch rendered here are written."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.join()


#: The smallest batch for which the report worker is started: smaller passes (the collector's
#: usual few jobs) render here rather than pay a process start (about 0.3 s of CPU).
MIN_WORKER_JOBS = 64
