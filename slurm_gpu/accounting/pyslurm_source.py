"""``PyslurmSource``: job metadata through pyslurm's slurmdbd API (optional ``pyslurm`` extra).

Written against pyslurm 25.11 (``pyslurm.db.JobFilter``, ``pyslurm.db.Jobs.load``, the
attributes documented on ``pyslurm.db.Job`` and ``pyslurm.db.JobStatistics``). pyslurm builds
only against its own Slurm release, so it is imported lazily: a site without it can still use
the ``sacct`` backend. Tested through a contract suite against a fake ``pyslurm.db`` module of
the same shape; never against a live slurmdbd (see docs/accounting.md).
"""

from __future__ import annotations

import importlib
import pwd
from collections.abc import Callable, Sequence
from typing import Any

from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.jobids import JobId, parse_job_id
from slurm_gpu.accounting.tres import parse_tres
from slurm_gpu.accounting.usertext import COMMENT_MAX_LEN, JOB_NAME_MAX_LEN, WORK_DIR_MAX_LEN
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import JobRecord, Tres
from slurm_gpu.textsafe import clean_optional, clean_user_text

_NO_VAL = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}


def _import_pyslurm() -> Any:
    try:
        return importlib.import_module("pyslurm")
    except ImportError as exc:
        raise AccountingError(
            f"accounting.backend = 'pyslurm' but pyslurm cannot be imported ({exc})",
            hint="pip install 'slurm-gpu[pyslurm]' (pyslurm must match your Slurm release), "
            "or set accounting.backend = 'sacct'",
        ) from None


def _uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


class PyslurmSource:
    """``AccountingSource`` backed by pyslurm's database API.

    ``module`` replaces ``import pyslurm`` (tests pass a fake); ``uid_of`` turns the user name
    pyslurm reports in ``cancelled_by`` into a uid (sacct reports the uid itself).
    """

    name = "pyslurm"

    def __init__(
        self,
        *,
        batch_size: int = 500,
        module: Any = None,
        uid_of: Callable[[str], int | None] = _uid_of,
    ) -> None:
        self._module = module
        self.batch_size = max(1, batch_size)
        self.uid_of = uid_of

    @property
    def pyslurm(self) -> Any:
        if self._module is None:
            self._module = _import_pyslurm()
        return self._module

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """See ``AccountingSource.get_jobs``. pyslurm filters by plain job id only, so array
        tasks and het components are asked by their base id and picked out here."""
        wanted = [parse_job_id(j) for j in job_ids]
        bases = list(dict.fromkeys(int(w.job) for w in wanted))
        out: dict[str, JobRecord] = {}
        for i in range(0, len(bases), self.batch_size):
            db_filter = self.pyslurm.db.JobFilter(ids=bases[i : i + self.batch_size])
            for job in self._load(db_filter):
                record = self._record_or_none(job)
                if record is not None and any(_matches(record, w) for w in wanted):
                    out[record.job_id] = record
        return out

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """See ``AccountingSource.jobs_between``."""
        kwargs: dict[str, Any] = {"start_time": int(start_s), "end_time": int(end_s)}
        if users:
            kwargs["users"] = list(users)
        db_filter = self.pyslurm.db.JobFilter(**kwargs)
        records = [r for r in map(self._record_or_none, self._load(db_filter)) if r is not None]
        return sorted(records, key=lambda j: (j.submit_s or 0.0, int(j.job_id)))

    def _load(self, db_filter: Any) -> list[Any]:
        try:
            jobs = self.pyslurm.db.Jobs.load(db_filter)
        except Exception as exc:  # pyslurm raises RPCError and friends; keep our vocabulary
            raise AccountingError(
                f"pyslurm could not load jobs from slurmdbd: {exc}",
                hint="check that slurmdbd runs (sacctmgr ping) and that pyslurm matches "
                "the Slurm release",
            ) from None
        # 25.11 returns a MultiClusterMap (dict-like); older releases a list.
        values = jobs.values() if hasattr(jobs, "values") else jobs
        return list(values)

    def _record_or_none(self, job: Any) -> JobRecord | None:
        """``_to_record``, or ``None`` for a job whose record cannot be read (e.g. a node list
        naming more than ``hostlist.MAX_HOSTS`` hosts): one job, never the whole batch."""
        try:
            return self._to_record(job)
        except (AccountingError, ValueError, TypeError, OverflowError):
            return None

    def _to_record(self, job: Any) -> JobRecord:
        array_id = _int(getattr(job, "array_id", None))
        task_id = _int(getattr(job, "array_task_id", None))
        waiting = getattr(job, "array_tasks_waiting", None)
        het_id = _int(getattr(job, "heterogeneous_id", None))
        het_offset = _int(getattr(job, "heterogeneous_offset", None))
        raw_id = str(job.id)
        array_job_id = array_task = het_job_id = None
        if array_id:
            array_job_id = str(array_id)
            if task_id is not None:
                array_task = str(task_id)
            elif waiting:
                array_task = str(waiting)
        if het_id:
            het_job_id = str(het_id)
        else:
            het_offset = None
        if array_task is not None and array_task.isdigit():
            display = f"{array_job_id}_{array_task}"
        elif array_task is not None:
            display = f"{array_job_id}_[{array_task}]"
        elif het_job_id is not None:
            display = f"{het_job_id}+{het_offset}"
        else:
            display = raw_id
        cancelled_by = getattr(job, "cancelled_by", None)
        state = str(job.state or "UNKNOWN").split()[0]
        stats = getattr(job, "stats", None)
        alloc = _tres(getattr(job, "allocated_tres", None))
        req = _tres(getattr(job, "requested_tres", None))
        mem_mib = _int(getattr(job, "memory", None))
        time_limit = _int(getattr(job, "time_limit", None))
        max_rss = _int(getattr(stats, "max_resident_memory", None)) if stats else None
        total_cpu = getattr(stats, "total_cpu_time", None) if stats else None
        nodelist = getattr(job, "nodelist", None) or ""
        return JobRecord(
            job_id=raw_id,
            job_id_display=display,
            array_job_id=array_job_id,
            array_task_id=array_task,
            het_job_id=het_job_id,
            het_job_offset=het_offset,
            user=job.user_name or "",
            uid=_int(job.user_id),
            account=job.account or None,
            partition=job.partition or None,
            qos=job.qos or None,
            job_name=clean_user_text(job.name or "", JOB_NAME_MAX_LEN),
            work_dir=clean_optional(job.working_directory or None, WORK_DIR_MAX_LEN),
            nodelist=expand_hostlist(nodelist),
            state=state,
            cancelled_by_uid=self.uid_of(cancelled_by)
            if cancelled_by and state == "CANCELLED"
            else None,
            exit_code=_int(job.exit_code),
            exit_signal=_int(job.exit_code_signal),
            derived_exit_code=_int(job.derived_exit_code),
            alloc_tres=alloc,
            req_tres=req,
            alloc_cpus=_int(job.cpus),
            req_mem_bytes=req.mem_bytes or (mem_mib * 1024**2 if mem_mib else None),
            max_rss_bytes=max_rss if max_rss else None,
            total_cpu_s=float(total_cpu) if total_cpu is not None else None,
            elapsed_s=_int(job.elapsed_time) or 0,
            time_limit_s=time_limit * 60 if time_limit is not None else None,
            submit_s=_epoch(job.submit_time),
            start_s=_epoch(job.start_time),
            end_s=_epoch(job.end_time),
            restarts=_int(getattr(job, "requeue_count", None)) or 0,
            comment=clean_optional(job.comment or None, COMMENT_MAX_LEN),
            admin_comment=job.admin_comment or None,
            mail_user=None,
            mail_type=None,
        )


def _matches(record: JobRecord, wanted: JobId) -> bool:
    if wanted.array_task is not None:
        if record.array_job_id != wanted.job:
            return False
        if wanted.array_task.isdigit():
            return record.array_task_id == wanted.array_task
        return True
    if wanted.het_offset is not None:
        return record.het_job_id == wanted.job and record.het_job_offset == wanted.het_offset
    return wanted.job in (record.job_id, record.array_job_id, record.het_job_id)


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None  # "UNLIMITED", "PartitionLimit"
    return None if number in _NO_VAL else number


def _epoch(value: Any) -> float | None:
    number = _int(value)
    return float(number) if number and number > 0 else None


def _humanize_mib(mib: int) -> str:
    """Memory in sacct's spelling: the largest binary unit that divides it exactly."""
    units = ["M", "G", "T", "P"]
    unit = 0
    while mib and mib % 1024 == 0 and unit < len(units) - 1:
        mib //= 1024
        unit += 1
    return f"{mib}{units[unit]}"


def _tres(value: Any) -> Tres:
    """Turn pyslurm's ``TrackableResources`` (or a plain TRES string) into ``Tres``.

    The string is rebuilt in sacct's order and spelling so that both sources give equal
    records: ``cpu``, ``mem``, ``energy``, ``node``, ``billing``, then ``gres/…``.
    """
    if value is None:
        return Tres()
    if isinstance(value, str):
        return parse_tres(value)
    parts: list[str] = []
    for name in ("cpu", "mem", "energy", "node", "billing"):
        item = getattr(value, name, None)
        count = _int(getattr(item, "count", None)) if item is not None else None
        if count is None:
            continue
        parts.append(f"mem={_humanize_mib(count)}" if name == "mem" else f"{name}={count}")
    gres = getattr(value, "gres", None) or {}
    for key in sorted(gres, key=lambda k: (":" in k, k)):
        count = _int(getattr(gres[key], "count", None))
        if count is not None:
            parts.append(f"gres/{key}={count}")
    return parse_tres(",".join(parts))
