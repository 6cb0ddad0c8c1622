"""Render ``gpueff``'s report of stored jobs into the store, so that ``gpueff`` prints it.

The collector calls ``ReportPrerenderer.publish`` after each committed batch (and
``slurm-gpu store reports`` renders the jobs stored before, or under other templates). Each
report is produced exactly as ``gpueff`` produces it on the owner's own settled job: the same
lookup (``service.start_lookup`` answered from the store alone, as the job's owner), the same
SQLite reader, the same renderer, so the stored text is byte for byte what ``gpueff`` would
print (a test compares them). ``gpueff`` uses it only while ``reportcache.render_key``
matches (``slurm_gpu.jobreport.reportcache``).

Only SQLite stores: for PostgreSQL, ``gpueff`` imports SQLAlchemy and renders anyway, so a
cache would not make it faster. Rendering is best effort: a job that cannot be rendered is
logged and skipped, and ``gpueff`` then renders it itself.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any

from slurm_gpu.accounting.base import is_settled
from slurm_gpu.config import Settings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.jobreport import adapter, jsonout, output, service
from slurm_gpu.jobreport.readers import TIMELINES, StoreAndSpoolReader
from slurm_gpu.jobreport.renderpool import RenderPool
from slurm_gpu.jobreport.reportcache import render_key
from slurm_gpu.jobreport.reportfiles import reports_root
from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.records import JobRecord
from slurm_gpu.store.rows import StoredJob
from slurm_gpu.store.sqlite_reader import SqliteReader, Timelines, sqlite_path
from slurm_gpu.store.store import CachedReport

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
        self._clock = clock
        self._files = files or ReportFileWriter(
            reports_root(settings.paths.state_dir, settings.gpueff.reports_dir)
        )
        self.path = sqlite_path(settings.store_url)
        self.key = render_key(settings.gpueff)
        self._plain: TerminalRenderer | None = None
        self._colour: TerminalRenderer | None = None
        self._wording: adapter.Wording | None = None
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
        return self._files

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
        """The reports of these stored jobs for the store and the owners' files, rendered
        from the store as ``gpueff`` reads it (settled jobs of users other than root; a job
        that cannot be rendered is logged and left out). Also run by the report worker
        (``renderworker``), which has no store of its own: SQLite stores only there."""
        todo = eligible(jobs)
        out: list[CachedReport] = []
        files: list[ReportFile] = []
        if not todo:
            return out, files
        now = self._clock()
        # The store as gpueff reads it, after the commit: on SQLite the standard-library
        # reader, asked once for the whole batch (one set of queries and one snapshot instead of
        # one per job); on PostgreSQL the store itself.
        reading: Any = (
            SqliteReader.open(self.path) if self.path is not None else nullcontext(self._store)
        )
        with reading as sq:
            batch = _BatchReader(sq, [j.job_id_display for j in todo]) if self.path else sq
            for job in todo:
                try:
                    rendered = self._render(batch, job, now)
                except (SlurmGpuError, service.AccountingNeeded, OSError, ValueError) as exc:
                    log.warning("job %s: report not rendered (%s)", job.job_id, exc)
                    continue
                if rendered is not None:
                    cached, job_json, telemetry = rendered
                    out.append(cached)
                    assert job.uid is not None
                    files.append(
                        ReportFile(
                            uid=job.uid,
                            typed_id=cached.typed_id,
                            render_key=cached.render_key,
                            plain=cached.plain,
                            colour=cached.colour,
                            job=job_json,
                            json_version=jsonout.SCHEMA_VERSION,
                            telemetry=telemetry,
                        )
                    )
        return out, files

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
            self._files.write(files)
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

    def _render(
        self, sq: Any, job: JobRecord, now: float
    ) -> tuple[CachedReport, dict[str, Any], dict[str, Any] | None] | None:
        s = self._settings.gpueff
        if self._wording is None:
            self._wording = adapter.findings_wording(s.template_dir)
            self._plain = TerminalRenderer(colour=False, template_dir=s.template_dir)
            self._colour = TerminalRenderer(colour=True, template_dir=s.template_dir)
        assert self._plain is not None and self._colour is not None
        # How users type this one job: accounting's display id (1234, 1234_7, 1234+0).
        typed = job.job_id_display
        reader = StoreAndSpoolReader(self._settings, store=sq, wording=self._wording)
        pending = service.start_lookup([typed], service.NoAccounting(), reader, caller_uid=job.uid)
        if pending.asked_accounting:
            return None  # the store alone does not answer it: gpueff asks accounting
        found = pending.finish(min_elapsed_s=s.min_elapsed_s)
        if found.missing or len(found.groups) != 1 or len(found.groups[0][1]) != 1:
            return None
        colour = output.render_groups(self._colour, found.groups)
        # The built-in templates add colour only through ``c()``, which wraps a text in one
        # SGR sequence and a reset: the plain text is the coloured one without them (a test
        # renders both ways over the report fixtures). A site's templates might pad or measure
        # a coloured text, so theirs are rendered twice.
        plain = (
            output.render_groups(self._plain, found.groups) if s.template_dir else strip_sgr(colour)
        )
        cached = CachedReport(
            job_id=job.job_id,
            typed_id=typed,
            render_key=self.key,
            plain=plain,
            colour=colour,
            rendered_at_s=now,
        )
        # The GPU part as the reader built it (already read: no second store read), for the
        # owner's full ``gpueff`` (listings, arrays) when the store is closed to them.
        tel = reader.final(job)
        telemetry = None if tel is None else as_dict(tel)
        return cached, jsonout.job_json(found.groups[0][1][0]), telemetry


#: The smallest batch for which the report worker is started: smaller passes (the collector's
#: usual few jobs) render here rather than pay a process start (about 0.3 s of CPU).
MIN_WORKER_JOBS = 64


def eligible(jobs: Iterable[JobRecord]) -> list[JobRecord]:
    """The jobs that get a stored report: settled jobs of users other than root."""
    return [j for j in jobs if j.uid is not None and j.uid != 0 and is_settled(j)]


def as_dict(obj: Any) -> Any:
    """``dataclasses.asdict(obj)`` for the report model's values (dataclasses, tuples, lists,
    dicts and immutable leaves: str, int, float, bool, enums, None), equal to it: the leaves
    are shared instead of deep-copied, which made ``asdict`` a quarter of a 4-GPU report."""
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    fields = _FIELDS.get(kind)
    if fields is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj))
    if fields is not None:
        return {name: as_dict(getattr(obj, name)) for name in fields}
    if kind is tuple or kind is list:
        # A sparkline's values are leaves: copied as one sequence, not one call per value.
        if all(type(v) in _LEAVES for v in obj):
            return kind(obj)
        return kind(as_dict(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple, as asdict does
        return kind(*(as_dict(v) for v in obj))
    if isinstance(obj, tuple | list):
        return kind(as_dict(v) for v in obj)
    if isinstance(obj, dict):
        return {as_dict(k): as_dict(v) for k, v in obj.items()}
    return obj


_LEAVES = frozenset({str, int, float, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}

_SGR = re.compile("\x1b\\[[0-9;]*m")


def strip_sgr(text: str) -> str:
    """``text`` without ANSI SGR (colour) sequences."""
    return _SGR.sub("", text)


def _lookup_key(typed: str) -> tuple[str, ...] | None:
    """What ``SqliteReader.jobs_for_ids([typed])`` looks a typed id up by."""
    job, _, task = typed.partition("_")
    if task:
        return ("task", job, task) if task.isdigit() else ("plain", job)  # a range: plain
    het, _, offset = typed.partition("+")
    if offset.isdigit():
        return ("het", het, str(int(offset)))
    return ("plain", typed) if typed.isdigit() else None


def _keys(s: StoredJob) -> Iterable[tuple[str, ...]]:
    """Every lookup key under which ``SqliteReader.jobs_for_ids`` returns the job ``s``."""
    j = s.job
    for plain in dict.fromkeys(i for i in (j.job_id, j.array_job_id, j.het_job_id) if i):
        yield ("plain", plain)
    if j.array_job_id is not None and j.array_task_id is not None:
        yield ("task", j.array_job_id, j.array_task_id)
    if j.het_job_id is not None and j.het_job_offset is not None:
        yield ("het", j.het_job_id, str(j.het_job_offset))


class _BatchReader:
    """``SqliteReader`` for the typed ids of one batch: their jobs read in one
    ``jobs_for_ids`` call, then each id answered from those as ``jobs_for_ids([id])`` would
    answer it (the same jobs, in the same order: the batch query sorts the jobs a plain id
    names by end time as the single query does). Anything else goes to the reader."""

    def __init__(self, reader: SqliteReader, typed_ids: Sequence[str]) -> None:
        self._reader = reader
        self._typed = set(typed_ids)
        self._index: dict[tuple[str, ...], list[StoredJob]] = {}
        seen: set[str] = set()
        for s in reader.jobs_for_ids(list(dict.fromkeys(typed_ids)), timelines=TIMELINES):
            if s.job.job_id in seen:
                continue
            seen.add(s.job.job_id)
            for key in _keys(s):
                self._index.setdefault(key, []).append(s)

    def jobs_for_ids(self, ids: Iterable[str], *, timelines: Timelines = False) -> list[StoredJob]:
        wanted = list(ids)
        if len(wanted) != 1 or wanted[0] not in self._typed or timelines != TIMELINES:
            return self._reader.jobs_for_ids(wanted, timelines=timelines)
        key = _lookup_key(wanted[0])
        return list(self._index.get(key, ())) if key is not None else []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
