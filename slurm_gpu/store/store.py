"""The store: jobs, per-GPU and per-host summaries, timelines and findings (SQLAlchemy Core).

SQLite file by default (rollback journal, a busy timeout, the parent directory created);
PostgreSQL by URL (``postgresql+psycopg://user@host/db``) for sites with many hosts reading
it. Only the collector writes. A batch is written in one transaction and keyed by job id: a job
already present is replaced, so ingesting the same records twice leaves the same rows
(idempotent)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from slurm_gpu.errors import StoreDeniedError, StoreError, StoreNotCreatedError
from slurm_gpu.records import (
    GpuSummary,
    JobRecord,
    NodeRecord,
    Tres,
)
from slurm_gpu.store import codec, migrations, rows, schema
from slurm_gpu.store.rows import CachedReport as CachedReport
from slurm_gpu.store.rows import StoredFinding as StoredFinding
from slurm_gpu.store.rows import StoredJob as StoredJob
from slurm_gpu.store.schema import (
    TELEMETRY_STATES,
)

#: Rows per INSERT statement batch and ids per ``IN (...)`` list; well under SQLite's limit of
#: 32766 bound parameters.
_CHUNK = 500


# --------------------------------------------------------------------------- records


class FindingLike(Protocol):
    """What the store needs of an analysis finding (``slurm_gpu.analysis`` returns these).

    ``code`` and ``severity`` may be strings or string enums. Optional attributes, read when
    present: ``recommendation`` (JSON-able), ``scope`` (``job``/``node``/``gpu``), ``subject``.
    """

    @property
    def code(self) -> Any: ...
    @property
    def severity(self) -> Any: ...
    @property
    def cause(self) -> int | None: ...
    @property
    def evidence(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class JobBundle:
    """Everything the collector hands the store for one job."""

    job: JobRecord
    nodes: tuple[NodeRecord, ...]
    telemetry: str
    """One of ``schema.TELEMETRY_STATES``."""
    missing_hosts: tuple[str, ...] = ()
    findings: tuple[FindingLike, ...] = ()
    analysis_version: str | None = None
    """Version of the analysis that produced ``findings``; ``None`` when none ran."""


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """What ``slurm-gpu store info`` shows."""

    url: str
    """The URL with any password masked."""
    dialect: str
    schema_version: int
    latest_version: int
    rows: Mapping[str, int]
    telemetry: Mapping[str, int]
    size_bytes: int | None
    """Database size on disk; ``None`` when it cannot be read."""


# --------------------------------------------------------------------------- derived metrics


def idle_head_tail_s(gpu: GpuSummary) -> tuple[float | None, float | None]:
    """Idle seconds at the start and end of a GPU's span.

    Never active: the whole span is idle head and the tail is 0. ``None`` without readings.
    """
    if gpu.first_time_s is None or gpu.last_time_s is None:
        return None, None
    if gpu.active_first_time_s is None or gpu.active_last_time_s is None:
        return gpu.last_time_s - gpu.first_time_s, 0.0
    return (
        max(0.0, gpu.active_first_time_s - gpu.first_time_s),
        max(0.0, gpu.last_time_s - gpu.active_last_time_s),
    )


def _gpu_type(tres: Tres) -> str | None:
    return ",".join(name for name, _ in tres.gpu_types) or None


def _tres_dict(tres: Tres) -> dict[str, Any]:
    return {
        "cpus": tres.cpus,
        "mem_bytes": tres.mem_bytes,
        "nodes": tres.nodes,
        "gpus": tres.gpus,
        "gpu_types": [list(t) for t in tres.gpu_types],
        "billing": tres.billing,
        "raw": tres.raw,
    }


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- rows


def _job_row(b: JobBundle, collected_at_s: float) -> dict[str, Any]:
    j = b.job
    alloc_gpus = j.alloc_tres.gpus
    first = b.nodes[0] if b.nodes else None
    return {
        "job_id": j.job_id,
        "job_id_display": j.job_id_display,
        "array_job_id": j.array_job_id,
        "array_task_id": j.array_task_id,
        "het_job_id": j.het_job_id,
        "het_job_offset": j.het_job_offset,
        "user": j.user,
        "uid": j.uid,
        "account": j.account,
        "partition": j.partition,
        "qos": j.qos,
        "job_name": j.job_name,
        "work_dir": j.work_dir,
        "nodelist": ",".join(j.nodelist),
        "node_count": len(j.nodelist),
        "state": j.state,
        "cancelled_by_uid": j.cancelled_by_uid,
        "exit_code": j.exit_code,
        "exit_signal": j.exit_signal,
        "derived_exit_code": j.derived_exit_code,
        "alloc_tres": j.alloc_tres.raw,
        "req_tres": j.req_tres.raw,
        "tres_json": _dumps({"alloc": _tres_dict(j.alloc_tres), "req": _tres_dict(j.req_tres)}),
        "alloc_cpus": j.alloc_cpus,
        "req_cpus": j.req_tres.cpus,
        "alloc_mem_bytes": j.alloc_tres.mem_bytes,
        "req_mem_bytes": j.req_mem_bytes,
        "alloc_gpus": alloc_gpus,
        "req_gpus": j.req_tres.gpus,
        "gpu_type": _gpu_type(j.alloc_tres) or _gpu_type(j.req_tres),
        "max_rss_bytes": j.max_rss_bytes,
        "total_cpu_s": j.total_cpu_s,
        "elapsed_s": j.elapsed_s,
        "time_limit_s": j.time_limit_s,
        "submit_s": j.submit_s,
        "start_s": j.start_s,
        "end_s": j.end_s,
        "restarts": j.restarts,
        "comment": j.comment,
        "admin_comment": j.admin_comment,
        "mail_user": j.mail_user,
        "mail_type": j.mail_type,
        "gres_gpu_detail": j.gres_gpu_detail,
        "steps_json": rows.steps_json(j.steps),
        "submit_line": j.submit_line,
        "batch_directives": j.batch_directives,
        "reason": j.reason,
        "telemetry": b.telemetry,
        "telemetry_source": first.source if first else None,
        "interval_s": first.interval_s if first else None,
        "missing_hosts": ",".join(b.missing_hosts),
        "gpu_hours": alloc_gpus * j.elapsed_s / 3600.0 if alloc_gpus else None,
        "analysis_version": b.analysis_version,
        "collected_at_s": collected_at_s,
    }


def _host_row(job_id: str, n: NodeRecord) -> dict[str, Any]:
    h = n.host
    return {
        "job_id": job_id,
        "host": n.hostname,
        "uid": n.uid,
        "source": n.source,
        "interval_s": n.interval_s,
        "started_s": n.started_s,
        "ended_s": n.ended_s,
        "complete": n.complete,
        "notes": "\n".join(n.notes),
        "gpu_count": len(n.gpus),
        "has_host_summary": h is not None,
        "method": h.method if h else None,
        "samples": h.samples if h else None,
        "cpu_time_s": h.cpu_time_s if h else None,
        "cpu_busy_mean_pct": h.cpu_cores_busy.mean if h else None,
        "cpu_busy_hist": codec.encode_distribution(h.cpu_cores_busy) if h else None,
        "allocated_cores": h.allocated_cores if h else None,
        "rss_max_bytes": h.rss_max_bytes if h else None,
        "rss_mean_bytes": h.rss_mean_bytes if h else None,
        "io_read_bytes": h.io_read_bytes if h else None,
        "io_write_bytes": h.io_write_bytes if h else None,
    }


def _gpu_row(job_id: str, host: str, position: int, g: GpuSummary) -> dict[str, Any]:
    info = g.info
    util = g.utilization
    head, tail = idle_head_tail_s(g)
    cc = info.compute_capability
    return {
        "job_id": job_id,
        "host": host,
        "uuid": info.uuid,
        "position": position,
        "gpu_index": info.index,
        "minor_number": info.minor_number,
        "model": info.name,
        "memory_total_bytes": info.memory_total_bytes,
        "power_limit_w": info.power_limit_w,
        "parent_uuid": info.parent_uuid,
        "mig_profile": info.mig_profile,
        "pci_bus_id": info.pci_bus_id,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "samples": g.samples,
        "samples_available": g.samples_available,
        "first_time_s": g.first_time_s,
        "last_time_s": g.last_time_s,
        "util_mean_pct": util.mean,
        "util_p10_pct": util.percentile(10),
        "util_p50_pct": util.percentile(50),
        "util_p90_pct": util.percentile(90),
        "util_p99_pct": util.percentile(99),
        "util_hist": codec.encode_distribution(util),
        "sub_util_mean_pct": g.sub_samples.mean,
        "sub_util_hist": codec.encode_distribution(g.sub_samples),
        "idle_samples": g.idle_samples,
        "idle_fraction": g.idle_samples / g.samples_available if g.samples_available else None,
        "idle_head_s": head,
        "idle_tail_s": tail,
        "active_first_time_s": g.active_first_time_s,
        "active_last_time_s": g.active_last_time_s,
        "memory_used_max_bytes": g.memory_used_max_bytes,
        "memory_used_mean_bytes": g.memory_used_mean_bytes,
        "power_mean_w": g.power_mean_w,
        "power_max_w": g.power_max_w,
        "energy_j": g.energy_j,
        "sm_clock_mean_mhz": g.sm_clock_mean_mhz,
        "temperature_max_c": g.temperature_max_c,
        "throttle_power_s": g.throttle_power_s,
        "throttle_thermal_s": g.throttle_thermal_s,
        "pcie_tx_mean_bytes_per_s": g.pcie_tx_mean_bytes_per_s,
        "pcie_rx_mean_bytes_per_s": g.pcie_rx_mean_bytes_per_s,
        "nvlink_bytes": g.nvlink_bytes,
        "nvlink_bytes_while_idle": g.nvlink_bytes_while_idle,
        "ecc_corrected": g.ecc_corrected,
        "ecc_uncorrected": g.ecc_uncorrected,
        "xid_events": ",".join(map(str, g.xid_events)),
        "process_seen": g.process_seen,
        "max_processes": g.max_processes,
        "pids": ",".join(map(str, g.pids)),
        "sm_active_mean_pct": g.sm_active_mean_pct,
        "tensor_active_mean_pct": g.tensor_active_mean_pct,
        "process_list_unread": g.process_list_unread,
        "stall_grid": rows.grid_text(g.stall_grid),
        "memory_util_mean_pct": g.memory_utilization_mean_pct,
    }


def _text(value: Any) -> str | None:
    """Strings and string enums as their plain value."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _finding_rows(b: JobBundle) -> list[dict[str, Any]]:
    version = b.analysis_version or ""
    rows = []
    for seq, f in enumerate(b.findings):
        rec = getattr(f, "recommendation", None)
        rows.append(
            {
                "job_id": b.job.job_id,
                "seq": seq,
                "code": _text(f.code),
                "severity": _text(f.severity),
                "cause": f.cause,
                "scope": _text(getattr(f, "scope", None)),
                "subject": getattr(f, "subject", None),
                "evidence": _dumps(dict(f.evidence) if f.evidence is not None else {}),
                "recommendation": None if rec is None else _dumps(rec),
                "analysis_version": version,
            }
        )
    return rows


# --------------------------------------------------------------------------- engine


def mask_url(url: str) -> str:
    """The URL with its password hidden, for logs and ``store info``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"


def _sqlite_setup(engine: Engine, busy_timeout_s: float) -> None:
    # pysqlite's own transaction handling issues BEGIN lazily and runs DDL outside any
    # transaction; take control so migrations are atomic and writers queue on BEGIN IMMEDIATE
    # (SQLAlchemy's documented recipe).
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        # A rollback journal, not WAL: one writer (the collector) and many readers who may
        # not write the store's directory. A WAL file cannot be opened by such a reader, not
        # even mode=ro (it must create the -shm file), while with a rollback journal a mode=ro
        # reader takes an ordinary shared lock (docs/store.md). This also switches a store
        # created in WAL mode by an earlier release, the next time the collector opens it.
        # A read-only connection cannot switch mode; reading still works.
        with contextlib.suppress(Exception):
            cur.execute("PRAGMA journal_mode = DELETE")
        cur.execute("PRAGMA foreign_keys = ON")
        # FULL: with a rollback journal, NORMAL could corrupt the file on a power cut.
        cur.execute("PRAGMA synchronous = FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def open_engine(url: str, *, busy_timeout_s: float = 30.0, create: bool = True) -> Engine:
    """Create the engine for ``url`` (SQLite: create the parent directory, rollback journal,
    busy timeout). Without ``create`` (readers), a SQLite file that does not exist raises
    ``StoreNotCreatedError`` and nothing is created: neither the directory nor an empty
    file that would then fail the visibility check with the default 0644."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"bad store URL {url!r} ({exc})",
            hint="use sqlite:////path/file.db or postgresql+psycopg://user@host/db",
        ) from None
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            path = parsed.database
            if path and path != ":memory:" and not path.startswith("file:") and not create:
                # Not os.path.lexists: it answers False where the caller may not look
                # (EACCES), which is no "not created yet".
                try:
                    os.lstat(path)
                except FileNotFoundError:
                    raise StoreNotCreatedError(
                        f"store {path} does not exist yet",
                        hint="the first 'slurm-gpu collect' (or 'slurm-gpu store migrate') "
                        "creates it",
                    ) from None
                except OSError as exc:
                    denied = exc.errno in (errno.EACCES, errno.EPERM)
                    raise (StoreDeniedError if denied else StoreError)(
                        f"store {path}: {exc.strerror}",
                        hint="the store is readable by root and [store] admin_group only; "
                        "run this as one of them",
                    ) from None
            elif path and path != ":memory:" and not path.startswith("file:"):
                parent = os.path.dirname(os.path.abspath(path))
                try:
                    os.makedirs(parent, mode=0o755, exist_ok=True)
                except OSError as exc:
                    raise StoreError(
                        f"cannot create the store directory {parent} ({exc.strerror})",
                        hint="create it or set [store] url",
                    ) from None
            engine = create_engine(
                parsed, poolclass=NullPool, connect_args={"timeout": busy_timeout_s}
            )
            _sqlite_setup(engine, busy_timeout_s)
            return engine
        return create_engine(parsed, pool_pre_ping=True)
    except ImportError as exc:
        raise StoreError(
            f"the database driver for {backend} is not installed ({exc})",
            hint="install slurm-gpu[postgresql] for PostgreSQL",
        ) from None
    except ArgumentError as exc:
        raise StoreError(f"bad store URL ({exc})", hint="check [store] url") from None


def migrate_store(url: str) -> list[migrations.Migration]:
    """Create or migrate the store at ``url``; the migrations applied (empty: already current).

    Raises ``StoreError``.
    """
    engine = open_engine(url)
    try:
        return migrations.migrate(engine)
    except SQLAlchemyError as exc:
        raise _store_error(url, exc) from None
    finally:
        engine.dispose()


def _chunks(seq: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


# --------------------------------------------------------------------------- the store


class Store:
    """Read and write the store. Open with ``Store.open(url)``; it migrates unless told not to."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        """The SQLAlchemy engine, for report SQL."""
        self.url = url

    @classmethod
    def open(cls, url: str, *, migrate: bool = True, busy_timeout_s: float = 30.0) -> Store:
        """Connect (and by default migrate to the latest schema).

        Readers pass ``migrate=False``: a store that is not migrated yet raises ``StoreError``.
        """
        store = cls(open_engine(url, busy_timeout_s=busy_timeout_s, create=migrate), url)
        try:
            if migrate:
                migrations.migrate(store.engine)
            else:
                with store.engine.connect() as conn:
                    version = migrations.current_version(conn)
                if version < migrations.LATEST_VERSION:
                    raise StoreError(
                        f"store at {mask_url(url)} is at schema version {version}, "
                        f"this release needs {migrations.LATEST_VERSION}",
                        hint="run: slurm-gpu store migrate",
                    )
        except SQLAlchemyError as exc:
            store.close()
            raise _store_error(url, exc) from None
        return store

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- writes

    def write_batch(
        self,
        bundles: Sequence[JobBundle],
        *,
        collected_at_s: float,
        also: Callable[[Connection], None] | None = None,
    ) -> None:
        """Insert or replace every job of ``bundles`` in one transaction.

        ``also`` runs last inside that transaction (the collector takes the jobs' records out
        of the PostgreSQL inbox there, ``inbox.PgInbox.take``): its changes commit with the
        jobs or not at all. Raises ``StoreError`` (and writes nothing) on any database error,
        or passes on the ``StoreError`` that ``also`` raised.
        """
        if not bundles:
            return
        by_id: dict[str, JobBundle] = {}
        for b in bundles:
            if b.telemetry not in TELEMETRY_STATES:
                raise StoreError(f"job {b.job.job_id}: bad telemetry status {b.telemetry!r}")
            by_id[b.job.job_id] = b  # the last one wins inside a batch, as across batches
        jobs_rows, host_rows, gpu_rows, tl_rows, finding_rows = [], [], [], [], []
        for b in by_id.values():
            jid = b.job.job_id
            jobs_rows.append(_job_row(b, collected_at_s))
            for n in b.nodes:
                host_rows.append(_host_row(jid, n))
                for pos, g in enumerate(n.gpus):
                    gpu_rows.append(_gpu_row(jid, n.hostname, pos, g))
                if n.timeline:
                    tl_rows.append(
                        {
                            "job_id": jid,
                            "host": n.hostname,
                            "gpu_uuids": ",".join(g.info.uuid for g in n.gpus),
                            "points": len(n.timeline),
                            "data": codec.encode_timeline(n.timeline, len(n.gpus)),
                        }
                    )
            finding_rows += _finding_rows(b)
        ids = list(by_id)
        try:
            with self._write() as conn:
                for chunk in _chunks(ids):
                    for table in schema.JOB_CHILD_TABLES:
                        conn.execute(delete(table).where(table.c.job_id.in_(chunk)))
                    conn.execute(delete(schema.jobs).where(schema.jobs.c.job_id.in_(chunk)))
                for table, rows in (
                    (schema.jobs, jobs_rows),
                    (schema.job_hosts, host_rows),
                    (schema.job_gpus, gpu_rows),
                    (schema.timelines, tl_rows),
                    (schema.findings, finding_rows),
                ):
                    for part in _chunks(rows):
                        conn.execute(table.insert(), list(part))
                if also is not None:
                    also(conn)
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None

    def write_reports(self, reports: Sequence[CachedReport]) -> None:
        """Insert or replace the rendered ``gpueff`` reports of stored jobs in one transaction
        (a job deleted meanwhile is skipped). Raises ``StoreError`` on a database error."""
        if not reports:
            return
        r = schema.job_reports
        ids = [c.job_id for c in reports]
        try:
            with self._write() as conn:
                stored: set[str] = set()
                for chunk in _chunks(ids):
                    conn.execute(delete(r).where(r.c.job_id.in_(chunk)))
                    stored.update(
                        conn.execute(
                            select(schema.jobs.c.job_id).where(schema.jobs.c.job_id.in_(chunk))
                        ).scalars()
                    )
                rows_ = [dataclasses.asdict(c) for c in reports if c.job_id in stored]
                for part in _chunks(rows_):
                    conn.execute(r.insert(), list(part))
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None

    def jobs_needing_reports(self, render_key: str, *, limit: int = 10_000) -> list[str]:
        """Ids of stored jobs without a report rendered under ``render_key`` (none yet, or
        one from other templates or another release), at most ``limit``, newest end first."""
        j, r = schema.jobs, schema.job_reports
        query = (
            select(j.c.job_id)
            .select_from(j.outerjoin(r, r.c.job_id == j.c.job_id))
            .where(or_(r.c.job_id.is_(None), r.c.render_key != render_key))
            .order_by(j.c.end_s.desc(), j.c.job_id)
            .limit(limit)
        )
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(query).scalars())
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None

    def _write(self) -> AbstractContextManager[Connection]:
        return migrations.write_transaction(self.engine)

    # ----------------------------------------------------------------- reads

    def existing_job_ids(self, job_ids: Iterable[str]) -> set[str]:
        """Which of ``job_ids`` are already stored."""
        ids = list(job_ids)
        found: set[str] = set()
        try:
            with self.engine.connect() as conn:
                for chunk in _chunks(ids):
                    found.update(
                        conn.execute(
                            select(schema.jobs.c.job_id).where(schema.jobs.c.job_id.in_(chunk))
                        ).scalars()
                    )
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None
        return found

    def get_job(self, job_id: str, *, timelines: bool | str = False) -> StoredJob | None:
        """The stored job, or ``None`` when it is not in the store."""
        jobs = self._load(schema.jobs.c.job_id == job_id, timelines=timelines)
        return jobs[0] if jobs else None

    def jobs_between(
        self, start_s: float, end_s: float, *, timelines: bool = False
    ) -> list[StoredJob]:
        """Jobs that ended in ``[start_s, end_s)``, oldest end first."""
        cond = (schema.jobs.c.end_s >= start_s) & (schema.jobs.c.end_s < end_s)
        return self._load(cond, timelines=timelines)

    def similar_jobs(
        self, keys: Iterable[tuple[str, str]], *, per_key: int = 20
    ) -> list[StoredJob]:
        """The newest ``per_key`` stored jobs of each (user, job name) in ``keys``, newest
        first, in one query per chunk of keys (the collector asks once per batch, for the
        history the recommendations draw on)."""
        pairs = sorted(set(keys))
        if not pairs:
            return []
        j = schema.jobs
        out: list[StoredJob] = []
        for chunk in _chunks(pairs, _CHUNK // 2):
            rank = (
                func.row_number()
                .over(
                    partition_by=(j.c.user, j.c.job_name),
                    order_by=(j.c.end_s.desc(), j.c.job_id.desc()),
                )
                .label("rank")
            )
            ranked = (
                select(j.c.job_id, rank)
                .where(tuple_(j.c.user, j.c.job_name).in_(list(chunk)))
                .subquery()
            )
            ids = select(ranked.c.job_id).where(ranked.c.rank <= per_key)
            out += self._load(j.c.job_id.in_(ids), timelines=False)
        out.sort(key=lambda s: (s.job.end_s or 0.0, s.job.job_id), reverse=True)
        return out

    def job_ids(self) -> list[str]:
        """Every stored job id (for tests and maintenance), sorted."""
        with self.engine.connect() as conn:
            return sorted(conn.execute(select(schema.jobs.c.job_id)).scalars())

    def _load(self, cond: Any, *, timelines: bool | str) -> list[StoredJob]:
        j = schema.jobs
        ids_sel = select(j.c.job_id).where(cond)
        try:
            with self.engine.connect() as conn:
                job_rows = conn.execute(select(j).where(cond).order_by(j.c.end_s, j.c.job_id)).all()
                if not job_rows:
                    return []
                hosts = rows.group_by_job(
                    conn.execute(
                        select(schema.job_hosts)
                        .where(schema.job_hosts.c.job_id.in_(ids_sel))
                        .order_by(schema.job_hosts.c.job_id, schema.job_hosts.c.host)
                    ).all()
                )
                gpus = rows.group_by_job(
                    conn.execute(
                        select(schema.job_gpus)
                        .where(schema.job_gpus.c.job_id.in_(ids_sel))
                        .order_by(
                            schema.job_gpus.c.job_id,
                            schema.job_gpus.c.host,
                            schema.job_gpus.c.position,
                        )
                    ).all()
                )
                findings = rows.group_by_job(
                    conn.execute(
                        select(schema.findings)
                        .where(schema.findings.c.job_id.in_(ids_sel))
                        .order_by(schema.findings.c.job_id, schema.findings.c.seq)
                    ).all()
                )
                tls = (
                    rows.group_by_job(
                        conn.execute(
                            select(schema.timelines).where(schema.timelines.c.job_id.in_(ids_sel))
                        ).all()
                    )
                    if timelines
                    else {}
                )
                la = schema.live_actions
                actions = rows.group_by_job(
                    conn.execute(
                        select(la)
                        .where(la.c.job_id.in_(ids_sel))
                        .order_by(la.c.job_id, la.c.at_s, la.c.id)
                    ).all()
                )
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None
        return [
            rows.stored_job(
                r,
                hosts.get(r.job_id, []),
                gpus.get(r.job_id, []),
                findings.get(r.job_id, []),
                tls.get(r.job_id, []),
                # "utilization": GPU utilization alone, as ``SqliteReader``.
                utilization_only=timelines == "utilization",
                action_rows=actions.get(r.job_id, []),
            )
            for r in job_rows
        ]

    def info(self) -> StoreInfo:
        """Schema version, row counts, telemetry status counts and size on disk."""
        try:
            with self.engine.connect() as conn:
                version = migrations.current_version(conn)
                rows = (
                    {
                        t.name: int(conn.execute(select(func.count()).select_from(t)).scalar() or 0)
                        for t in (
                            schema.jobs,
                            schema.job_hosts,
                            schema.job_gpus,
                            schema.timelines,
                            schema.findings,
                            # Since schema version 2; an older store shows without it.
                            *((schema.job_reports,) if version >= 2 else ()),
                        )
                    }
                    if version
                    else {}
                )
                telemetry = (
                    {
                        str(k): int(v)
                        for k, v in conn.execute(
                            select(schema.jobs.c.telemetry, func.count()).group_by(
                                schema.jobs.c.telemetry
                            )
                        ).all()
                    }
                    if version
                    else {}
                )
                size = self._size_bytes(conn)
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None
        return StoreInfo(
            url=mask_url(self.url),
            dialect=self.engine.dialect.name,
            schema_version=version,
            latest_version=migrations.LATEST_VERSION,
            rows=rows,
            telemetry=telemetry,
            size_bytes=size,
        )

    def _size_bytes(self, conn: Connection) -> int | None:
        if self.engine.dialect.name == "sqlite":
            path = self.engine.url.database
            if not path or path == ":memory:":
                return None
            return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        if self.engine.dialect.name == "postgresql":
            size = conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar()
            return int(size) if size is not None else None
        return None


def _store_error(url: str, exc: SQLAlchemyError) -> StoreError:
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return StoreError(
        f"store {mask_url(url)}: {detail}",
        hint="check that the database is reachable and writable, then run `slurm-gpu store info`",
    )
