"""The ``gpueff`` report of stored jobs, rendered exactly as ``gpueff`` renders it.

Each report is produced as ``gpueff`` produces it on the owner's own settled job: the same
lookup (``service.start_lookup`` answered from the store alone, as the job's owner), the same
SQLite reader, the same renderer, so the stored text is byte for byte what ``gpueff`` would
print (a test compares them). Used by the collector's report step (``prerender``) and by the
report worker (``renderworker``), which is why it imports neither.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any

from slurm_gpu.accounting.base import is_settled
from slurm_gpu.config import Settings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.jobreport import adapter, jsonout, output, service
from slurm_gpu.jobreport.readers import TIMELINES, StoreAndSpoolReader
from slurm_gpu.jobreport.reportcache import render_key
from slurm_gpu.jobreport.reportfiles import reports_root
from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.records import JobRecord
from slurm_gpu.store.rows import CachedReport, StoredJob
from slurm_gpu.store.sqlite_reader import SqliteReader, Timelines, sqlite_path

log = logging.getLogger("slurm_gpu.prerender")


class StoredReportRenderer:
    """Renders the reports of stored jobs for the store and for their owners' files.

    ``store`` is the open ``Store`` (``None`` in the report worker, which reads a SQLite store
    as ``gpueff`` does); ``settings`` must be those ``gpueff`` reads (the same configuration
    file), or the key will not match theirs. ``files`` replaces the owners' file writer in
    tests.
    """

    def __init__(
        self,
        settings: Settings,
        store: Any,
        *,
        clock: Callable[[], float] = time.time,
        files: ReportFileWriter | None = None,
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

    @property
    def files(self) -> ReportFileWriter:
        """The writer of the owners' report files."""
        return self._files

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
