"""The store: jobs, per-GPU and per-host summaries, timelines and findings (SQLAlchemy Core).

SQLite file by default (WAL, a busy timeout, the parent directory created); PostgreSQL by URL
(``postgresql+psycopg://user@host/db``) for sites with many hosts reading it. Only the collector
writes. A batch is written in one transaction and keyed by job id: a job already present is
replaced, so ingesting the same records twice leaves the same rows (idempotent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    create_engine,
    delete,
    event,
    func,
    select,
    tuple_,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from slurm_gpu.errors import StoreError
from slurm_gpu.records import (
    GpuInfo,
    GpuSummary,
    HostSummary,
    JobRecord,
    NodeRecord,
    Tres,
)
from slurm_gpu.store import codec, migrations, schema
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
class StoredFinding:
    """A finding as stored: evidence and recommendation are decoded JSON."""

    code: str
    severity: str
    cause: int | None
    """Which of the seven causes (1–7); ``None`` when the finding is not one of them."""
    evidence: Mapping[str, Any]
    recommendation: Mapping[str, Any] | None
    analysis_version: str
    scope: str | None = None
    """``job``, ``node`` or ``gpu``; ``None`` when the analysis did not say."""
    subject: str | None = None
    """Host name or GPU UUID the finding is about, for node and GPU scope."""


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
class StoredJob:
    """One stored job: its accounting, its node records, its findings.

    ``nodes`` are rebuilt exactly as ingested (timelines only when asked for, and then at the
    store's quantised precision), so the analysis can be re-run from the store.
    """

    job: JobRecord
    telemetry: str
    telemetry_source: str | None
    interval_s: float | None
    missing_hosts: tuple[str, ...]
    nodes: tuple[NodeRecord, ...]
    findings: tuple[StoredFinding, ...]
    analysis_version: str | None
    gpu_hours: float | None
    """Allocated GPUs times elapsed hours; ``None`` without GPUs."""
    collected_at_s: float

    @property
    def gpus(self) -> tuple[tuple[str, GpuSummary], ...]:
        """Every GPU of the job as (host, summary), in node and device order."""
        return tuple((n.hostname, g) for n in self.nodes for g in n.gpus)


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


def _tres_from(d: Mapping[str, Any]) -> Tres:
    return Tres(
        cpus=d["cpus"],
        mem_bytes=d["mem_bytes"],
        nodes=d["nodes"],
        gpus=d["gpus"],
        gpu_types=tuple((str(n), int(c)) for n, c in d["gpu_types"]),
        billing=d["billing"],
        raw=d["raw"],
    )


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


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else ()


def _gpu_from(r: Row[Any]) -> GpuSummary:
    cc = r.compute_capability
    info = GpuInfo(
        uuid=r.uuid,
        index=r.gpu_index,
        minor_number=r.minor_number,
        name=r.model,
        memory_total_bytes=r.memory_total_bytes,
        power_limit_w=r.power_limit_w,
        parent_uuid=r.parent_uuid,
        mig_profile=r.mig_profile,
        pci_bus_id=r.pci_bus_id,
        compute_capability=tuple(int(x) for x in cc.split(".")) if cc else None,  # type: ignore[arg-type]
    )
    return GpuSummary(
        info=info,
        samples=r.samples,
        samples_available=r.samples_available,
        first_time_s=r.first_time_s,
        last_time_s=r.last_time_s,
        utilization=codec.decode_distribution(r.util_hist),
        sub_samples=codec.decode_distribution(r.sub_util_hist),
        idle_samples=r.idle_samples,
        active_first_time_s=r.active_first_time_s,
        active_last_time_s=r.active_last_time_s,
        memory_used_max_bytes=r.memory_used_max_bytes,
        memory_used_mean_bytes=r.memory_used_mean_bytes,
        power_mean_w=r.power_mean_w,
        power_max_w=r.power_max_w,
        energy_j=r.energy_j,
        sm_clock_mean_mhz=r.sm_clock_mean_mhz,
        temperature_max_c=r.temperature_max_c,
        throttle_power_s=r.throttle_power_s,
        throttle_thermal_s=r.throttle_thermal_s,
        pcie_tx_mean_bytes_per_s=r.pcie_tx_mean_bytes_per_s,
        pcie_rx_mean_bytes_per_s=r.pcie_rx_mean_bytes_per_s,
        nvlink_bytes=r.nvlink_bytes,
        nvlink_bytes_while_idle=r.nvlink_bytes_while_idle,
        ecc_corrected=r.ecc_corrected,
        ecc_uncorrected=r.ecc_uncorrected,
        xid_events=_ints(r.xid_events),
        process_seen=bool(r.process_seen),
        max_processes=r.max_processes,
        pids=_ints(r.pids),
        sm_active_mean_pct=r.sm_active_mean_pct,
        tensor_active_mean_pct=r.tensor_active_mean_pct,
    )


def _host_summary_from(r: Row[Any]) -> HostSummary | None:
    if not r.has_host_summary:
        return None
    return HostSummary(
        method=r.method,
        samples=r.samples,
        cpu_time_s=r.cpu_time_s,
        cpu_cores_busy=codec.decode_distribution(r.cpu_busy_hist),
        allocated_cores=r.allocated_cores,
        rss_max_bytes=r.rss_max_bytes,
        rss_mean_bytes=r.rss_mean_bytes,
        io_read_bytes=r.io_read_bytes,
        io_write_bytes=r.io_write_bytes,
    )


def _job_from(r: Row[Any]) -> JobRecord:
    tres = json.loads(r.tres_json)
    return JobRecord(
        job_id=r.job_id,
        job_id_display=r.job_id_display,
        array_job_id=r.array_job_id,
        array_task_id=r.array_task_id,
        het_job_id=r.het_job_id,
        het_job_offset=r.het_job_offset,
        user=r.user,
        uid=r.uid,
        account=r.account,
        partition=r.partition,
        qos=r.qos,
        job_name=r.job_name,
        work_dir=r.work_dir,
        nodelist=_split(r.nodelist),
        state=r.state,
        cancelled_by_uid=r.cancelled_by_uid,
        exit_code=r.exit_code,
        exit_signal=r.exit_signal,
        derived_exit_code=r.derived_exit_code,
        alloc_tres=_tres_from(tres["alloc"]),
        req_tres=_tres_from(tres["req"]),
        alloc_cpus=r.alloc_cpus,
        req_mem_bytes=r.req_mem_bytes,
        max_rss_bytes=r.max_rss_bytes,
        total_cpu_s=r.total_cpu_s,
        elapsed_s=r.elapsed_s,
        time_limit_s=r.time_limit_s,
        submit_s=r.submit_s,
        start_s=r.start_s,
        end_s=r.end_s,
        restarts=r.restarts,
        comment=r.comment,
        admin_comment=r.admin_comment,
        mail_user=r.mail_user,
        mail_type=r.mail_type,
        gres_gpu_detail=r.gres_gpu_detail,
    )


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
        # A read-only file cannot switch mode; reading still works.
        with contextlib.suppress(Exception):
            cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def open_engine(url: str, *, busy_timeout_s: float = 30.0) -> Engine:
    """Create the engine for ``url`` (SQLite: create the parent directory, WAL, busy timeout)."""
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
            if path and path != ":memory:" and not path.startswith("file:"):
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
        store = cls(open_engine(url, busy_timeout_s=busy_timeout_s), url)
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

    def write_batch(self, bundles: Sequence[JobBundle], *, collected_at_s: float) -> None:
        """Insert or replace every job of ``bundles`` in one transaction.

        Raises ``StoreError`` (and writes nothing) on any database error.
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

    def get_job(self, job_id: str, *, timelines: bool = False) -> StoredJob | None:
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

    def _load(self, cond: Any, *, timelines: bool) -> list[StoredJob]:
        j = schema.jobs
        ids_sel = select(j.c.job_id).where(cond)
        try:
            with self.engine.connect() as conn:
                job_rows = conn.execute(select(j).where(cond).order_by(j.c.end_s, j.c.job_id)).all()
                if not job_rows:
                    return []
                hosts = _group(
                    conn.execute(
                        select(schema.job_hosts)
                        .where(schema.job_hosts.c.job_id.in_(ids_sel))
                        .order_by(schema.job_hosts.c.job_id, schema.job_hosts.c.host)
                    ).all()
                )
                gpus = _group(
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
                findings = _group(
                    conn.execute(
                        select(schema.findings)
                        .where(schema.findings.c.job_id.in_(ids_sel))
                        .order_by(schema.findings.c.job_id, schema.findings.c.seq)
                    ).all()
                )
                tls = (
                    _group(
                        conn.execute(
                            select(schema.timelines).where(schema.timelines.c.job_id.in_(ids_sel))
                        ).all()
                    )
                    if timelines
                    else {}
                )
        except SQLAlchemyError as exc:
            raise _store_error(self.url, exc) from None
        return [
            _stored_job(
                r,
                hosts.get(r.job_id, []),
                gpus.get(r.job_id, []),
                findings.get(r.job_id, []),
                tls.get(r.job_id, []),
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


def _group(rows: Sequence[Row[Any]]) -> dict[str, list[Row[Any]]]:
    out: dict[str, list[Row[Any]]] = {}
    for r in rows:
        out.setdefault(r.job_id, []).append(r)
    return out


def _stored_job(
    r: Row[Any],
    host_rows: list[Row[Any]],
    gpu_rows: list[Row[Any]],
    finding_rows: list[Row[Any]],
    tl_rows: list[Row[Any]],
) -> StoredJob:
    gpus_by_host: dict[str, list[GpuSummary]] = {}
    for g in gpu_rows:
        gpus_by_host.setdefault(g.host, []).append(_gpu_from(g))
    tl_by_host = {t.host: codec.decode_timeline(t.data) for t in tl_rows}
    nodes = tuple(
        NodeRecord(
            job_id=r.job_id,
            hostname=h.host,
            uid=h.uid,
            interval_s=h.interval_s,
            source=h.source,
            started_s=h.started_s,
            ended_s=h.ended_s,
            gpus=tuple(gpus_by_host.get(h.host, [])),
            host=_host_summary_from(h),
            timeline=tl_by_host.get(h.host, ()),
            complete=bool(h.complete),
            notes=tuple(h.notes.split("\n")) if h.notes else (),
        )
        for h in host_rows
    )
    findings = tuple(
        StoredFinding(
            code=f.code,
            severity=f.severity,
            cause=f.cause,
            evidence=json.loads(f.evidence),
            recommendation=None if f.recommendation is None else json.loads(f.recommendation),
            analysis_version=f.analysis_version,
            scope=f.scope,
            subject=f.subject,
        )
        for f in finding_rows
    )
    return StoredJob(
        job=_job_from(r),
        telemetry=r.telemetry,
        telemetry_source=r.telemetry_source,
        interval_s=r.interval_s,
        missing_hosts=_split(r.missing_hosts),
        nodes=nodes,
        findings=findings,
        analysis_version=r.analysis_version,
        gpu_hours=r.gpu_hours,
        collected_at_s=r.collected_at_s,
    )


def _store_error(url: str, exc: SQLAlchemyError) -> StoreError:
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return StoreError(
        f"store {mask_url(url)}: {detail}",
        hint="check that the database is reachable and writable, then run `slurm-gpu store info`",
    )
