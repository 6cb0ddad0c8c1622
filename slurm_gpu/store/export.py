"""``slurm-gpu store export``: job summaries or findings of a period, to CSV or Parquet.

The jobs that ended in ``[since, until)`` are read in pages of ``page_jobs`` (keyset on
``(end_s, job_id)``: each page is one short indexed query, on SQLite and PostgreSQL alike, never
an ``OFFSET`` scan nor a transaction held open for the whole export), and each page is written
out before the next is read, so memory stays flat whatever the period holds.

The columns are ``JOB_COLUMNS`` and ``FINDING_COLUMNS`` (documented in ``docs/store.md``).
Parquet needs ``pyarrow`` (``pip install 'slurm-gpu[export]'``); CSV needs nothing.

The export holds every user's jobs and runs as root: ``--out`` is always a new file, mode 0600,
never a link followed nor an existing file overwritten (``slurm_gpu.privatefile``). CSV text
cells that a spreadsheet would read as a formula (a job name such as ``=HYPERLINK(...)``) get
a leading ``'``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from sqlalchemy import Connection, Engine, and_, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from slurm_gpu.errors import StoreError, UsageError
from slurm_gpu.privatefile import create_private, neutralise_cell
from slurm_gpu.store import schema

FORMATS = ("csv", "parquet")
WHAT = ("jobs", "findings")


@dataclass(frozen=True, slots=True)
class ExportColumn:
    """One exported column: its name, its type (``str``, ``int``, ``float``) and meaning."""

    name: str
    kind: str
    doc: str


def _c(name: str, kind: str, doc: str) -> ExportColumn:
    return ExportColumn(name, kind, doc)


#: One row per job.
JOB_COLUMNS: tuple[ExportColumn, ...] = (
    _c("job_id", "str", "Slurm's JobIDRaw"),
    _c("job_id_display", "str", "the id as users type it (1234, 1234_7, 1234+0)"),
    _c("user", "str", "user name"),
    _c("account", "str", "Slurm account"),
    _c("partition", "str", "partition"),
    _c("qos", "str", "QOS"),
    _c("job_name", "str", "job name (cleaned at ingest)"),
    _c("state", "str", "final state (COMPLETED, FAILED, ...)"),
    _c("exit_code", "int", "exit code"),
    _c("exit_signal", "int", "signal that ended the job (9: SIGKILL); empty for none"),
    _c("node_count", "int", "nodes allocated"),
    _c("alloc_cpus", "int", "CPUs allocated"),
    _c("alloc_mem_bytes", "int", "memory allocated, bytes"),
    _c("alloc_gpus", "int", "GPUs allocated"),
    _c("gpu_type", "str", "typed GPU name when Slurm reported one"),
    _c("submit_s", "float", "submit time, seconds since the epoch (UTC)"),
    _c("start_s", "float", "start time, seconds since the epoch"),
    _c("end_s", "float", "end time, seconds since the epoch"),
    _c("elapsed_s", "int", "run time, seconds"),
    _c("time_limit_s", "int", "time limit, seconds"),
    _c("total_cpu_s", "float", "CPU time used, seconds"),
    _c("max_rss_bytes", "int", "peak resident memory, bytes"),
    _c("gpu_hours", "float", "allocated GPUs x elapsed hours"),
    _c("telemetry", "str", "complete, recovered, missing or none"),
    _c("gpu_count_seen", "int", "GPUs with a stored summary"),
    _c("gpu_util_mean_pct", "float", "mean over those GPUs of their mean busy (duty) %"),
    _c("gpu_util_min_pct", "float", "the least busy GPU's mean busy %"),
    _c("gpu_idle_fraction", "float", "mean over GPUs of the share of readings at idle (0-1)"),
    _c("gpu_memory_used_max_bytes", "int", "highest GPU memory peak of any GPU, bytes"),
    _c("gpu_energy_j", "float", "energy of all GPUs, joules"),
    _c("finding_codes", "str", "the job's finding codes, most important first, ';'-separated"),
    _c("timeline_pruned_s", "float", "when retention removed the timelines; empty if kept"),
)

#: One row per finding.
FINDING_COLUMNS: tuple[ExportColumn, ...] = (
    _c("job_id", "str", "Slurm's JobIDRaw"),
    _c("user", "str", "the job's user"),
    _c("account", "str", "the job's account"),
    _c("partition", "str", "the job's partition"),
    _c("end_s", "float", "the job's end time, seconds since the epoch"),
    _c("seq", "int", "order in the job's findings (0 = most important)"),
    _c("code", "str", "finding code"),
    _c("severity", "str", "critical, warning or info"),
    _c("cause", "int", "which of the seven causes of low GPU use (1-7); empty for none"),
    _c("scope", "str", "job, node or gpu"),
    _c("subject", "str", "the host name or GPU UUID it is about"),
    _c("evidence", "str", "JSON object of the numbers behind the finding"),
    _c("recommendation", "str", "JSON object of the suggested request; empty for none"),
    _c("analysis_version", "str", "version of the analysis that produced it"),
)

#: The columns read from ``jobs`` as stored; those after them are computed per page.
_COMPUTED = (
    "gpu_count_seen",
    "gpu_util_mean_pct",
    "gpu_util_min_pct",
    "gpu_idle_fraction",
    "gpu_memory_used_max_bytes",
    "gpu_energy_j",
    "finding_codes",
    "timeline_pruned_s",
)
_JOB_FIELDS = [c.name for c in JOB_COLUMNS if c.name not in _COMPUTED]


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    rows: int
    jobs: int
    pages: int
    path: str


def _pages(conn: Connection, since_s: float, until_s: float, page_jobs: int) -> Iterator[list[Any]]:
    """The period's ``jobs`` rows in pages, oldest end first (keyset pagination)."""
    j = schema.jobs
    cols = [j.c[name] for name in _JOB_FIELDS] + [j.c.timeline_pruned_s]
    after: tuple[float, str] | None = None
    while True:
        cond = and_(j.c.end_s >= since_s, j.c.end_s < until_s)
        if after is not None:
            # ``end_s >= last`` on its own, so that the index range starts at the last page's
            # end (an OR of the two keys made both SQLite and PostgreSQL start every page at
            # ``since``: quadratic in the period's size); ties on ``end_s`` by job id.
            cond = and_(
                cond,
                j.c.end_s >= after[0],
                or_(j.c.end_s > after[0], j.c.job_id > after[1]),
            )
        page = conn.execute(
            select(*cols).where(cond).order_by(j.c.end_s, j.c.job_id).limit(page_jobs)
        ).all()
        if not page:
            return
        yield list(page)
        after = (page[-1].end_s, page[-1].job_id)


def _job_rows(conn: Connection, page: Sequence[Any]) -> list[list[Any]]:
    g, f = schema.job_gpus, schema.findings
    ids = [r.job_id for r in page]
    agg = {
        r.job_id: r
        for r in conn.execute(
            select(
                g.c.job_id,
                func.count().label("n"),
                func.avg(g.c.util_mean_pct).label("util_mean"),
                func.min(g.c.util_mean_pct).label("util_min"),
                func.avg(g.c.idle_fraction).label("idle"),
                func.max(g.c.memory_used_max_bytes).label("mem_max"),
                func.sum(g.c.energy_j).label("energy"),
            )
            .where(g.c.job_id.in_(ids))
            .group_by(g.c.job_id)
        ).all()
    }
    codes: dict[str, list[str]] = {}
    for job_id, code in conn.execute(
        select(f.c.job_id, f.c.code).where(f.c.job_id.in_(ids)).order_by(f.c.job_id, f.c.seq)
    ).all():
        codes.setdefault(job_id, []).append(code)
    out = []
    for r in page:
        a = agg.get(r.job_id)
        out.append(
            [getattr(r, name) for name in _JOB_FIELDS]
            + [
                a.n if a else 0,
                a.util_mean if a else None,
                a.util_min if a else None,
                a.idle if a else None,
                int(a.mem_max) if a and a.mem_max is not None else None,
                a.energy if a else None,
                ";".join(codes.get(r.job_id, [])),
                r.timeline_pruned_s,
            ]
        )
    return out


def _finding_rows(conn: Connection, page: Sequence[Any]) -> list[list[Any]]:
    f = schema.findings
    jobs = {r.job_id: r for r in page}
    out = []
    for r in conn.execute(
        select(f).where(f.c.job_id.in_(list(jobs))).order_by(f.c.job_id, f.c.seq)
    ).all():
        j = jobs[r.job_id]
        out.append(
            [
                *(r.job_id, j.user, j.account, j.partition, j.end_s, r.seq, r.code, r.severity),
                *(r.cause, r.scope, r.subject, r.evidence, r.recommendation, r.analysis_version),
            ]
        )
    # The page's order (end time), then each job's findings in order.
    order = {job_id: i for i, job_id in enumerate(jobs)}
    out.sort(key=lambda row: (order[row[0]], row[5]))
    return out


class _CsvSink:
    def __init__(self, stream: IO[str], columns: Sequence[ExportColumn]) -> None:
        self._w = csv.writer(stream, lineterminator="\n")
        self._w.writerow([c.name for c in columns])

    def write(self, rows: list[list[Any]]) -> None:
        self._w.writerows([_cell(v) for v in row] for row in rows)

    def close(self) -> None:
        pass


def _cell(value: Any) -> Any:
    """A CSV cell: empty for None; text a spreadsheet would evaluate neutralised."""
    if value is None:
        return ""
    return neutralise_cell(value) if isinstance(value, str) else value


class _ParquetSink:
    def __init__(self, path: IO[bytes], columns: Sequence[ExportColumn]) -> None:
        pa, pq = _pyarrow()
        types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
        self._pa = pa
        self._columns = columns
        self._schema = pa.schema([(c.name, types[c.kind]) for c in columns])
        self._w = pq.ParquetWriter(path, self._schema)

    def write(self, rows: list[list[Any]]) -> None:
        if not rows:
            return
        arrays = [
            self._pa.array([row[i] for row in rows], type=self._schema.field(i).type)
            for i in range(len(self._columns))
        ]
        self._w.write_batch(self._pa.record_batch(arrays, schema=self._schema))

    def close(self) -> None:
        self._w.close()


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa  # type: ignore[import-not-found,import-untyped,unused-ignore]
        import pyarrow.parquet as pq  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise UsageError(
            "Parquet export needs pyarrow, which is not installed",
            hint="pip install 'slurm-gpu[export]' (or use --format csv)",
        ) from None
    return pa, pq


def _create_out(out_path: str) -> int:
    """A descriptor of the new output file (``slurm_gpu.privatefile``); ``UsageError``."""
    try:
        return create_private(out_path)
    except FileExistsError:
        raise UsageError(
            f"{out_path} already exists",
            hint="give a new file name: an export never overwrites a file or follows a link",
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot create {out_path} ({exc.strerror})") from None


def export(
    engine: Engine,
    out_path: str,
    *,
    since_s: float,
    until_s: float,
    fmt: str = "csv",
    what: str = "jobs",
    page_jobs: int = 1000,
) -> ExportResult:
    """Write the ``what`` rows (``jobs`` or ``findings``) of the jobs that ended in
    ``[since_s, until_s)`` to ``out_path`` as ``fmt``; ``-`` writes CSV to standard output.

    Raises ``UsageError`` (bad format, pyarrow missing) or ``StoreError``."""
    if fmt not in FORMATS or what not in WHAT:
        raise UsageError(f"cannot export {what} as {fmt}", hint=f"formats: {', '.join(FORMATS)}")
    if fmt == "parquet" and out_path == "-":
        raise UsageError("Parquet cannot be written to standard output", hint="give --out FILE")
    columns = JOB_COLUMNS if what == "jobs" else FINDING_COLUMNS
    to_rows = _job_rows if what == "jobs" else _finding_rows
    stream: IO[str] | IO[bytes] | None = None
    sink: _CsvSink | _ParquetSink
    if fmt == "parquet":
        _pyarrow()  # before a file is made: no empty file left when pyarrow is missing
        binary = os.fdopen(_create_out(out_path), "wb")
        stream = binary
        try:
            sink = _ParquetSink(binary, columns)
        except BaseException:
            binary.close()
            raise
    else:
        import sys

        text = (
            sys.stdout
            if out_path == "-"
            else os.fdopen(_create_out(out_path), "w", newline="", encoding="utf-8")
        )
        stream = text
        sink = _CsvSink(text, columns)
    rows = jobs = pages = 0
    try:
        with engine.connect() as conn:
            for page in _pages(conn, since_s, until_s, max(1, page_jobs)):
                # Each page in its own short read transaction: nothing held between pages.
                conn.commit()
                out = to_rows(conn, page)
                conn.commit()
                sink.write(out)
                rows += len(out)
                jobs += len(page)
                pages += 1
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise StoreError(
            f"store export: {detail}", hint="check the store with `slurm-gpu store info`"
        ) from None
    finally:
        sink.close()
        if stream is not None and out_path != "-":
            stream.close()
    return ExportResult(
        rows=rows,
        jobs=jobs,
        pages=pages,
        path=os.path.abspath(out_path) if out_path != "-" else "-",
    )
