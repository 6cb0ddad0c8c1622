"""Settings of the central side: accounting, the store, the collector and telemetry sources."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class AccountingSettings:
    backend: str = setting("sacct", "Where job metadata comes from.", choices=("sacct", "pyslurm"))
    sacct_path: str = setting("sacct", "sacct executable (absolute path recommended).")
    timeout_s: float = setting(60.0, "Timeout of one accounting query, seconds.", min=1, max=3600)
    batch_size: int = setting(500, "Jobs asked of sacct in one call.", min=1, max=100000)
    batch_scripts: bool = setting(
        True,
        "Read the #SBATCH lines of each job's batch script (sacct --batch-script), so that "
        "advice keeps the options the script used. Slurm keeps scripts only with "
        "AccountingStoreFlags=job_script; without it each batch costs one more sacct call per "
        "user that finds nothing. The collector reads them; gpueff on a job not yet "
        "collected does not (it is waited on).",
    )


@dataclass(frozen=True)
class StoreSettings:
    url: str = setting("", "SQLAlchemy URL; empty means SQLite at <state_dir>/slurm-gpu.db.")
    admin_group: str = setting(
        "",
        "Group that may read a SQLite store (file 0640, state_dir 0750; e.g. admins and "
        "SlurmUser for the mail program); empty: root alone (0600, 0700). Users read their "
        "own reports from [gpueff] reports_dir.",
    )
    timeline_retention_days: float = setting(
        180.0,
        "'store prune' deletes per-GPU timelines and rendered reports of jobs that ended this "
        "many days ago (summaries and findings stay); 0 keeps them for ever.",
        min=0,
    )
    summary_retention_days: float = setting(
        0.0,
        "'store prune' deletes whole jobs (summaries, findings) that ended this many days ago; "
        "0 keeps them for ever.",
        min=0,
    )
    prune_batch_jobs: int = setting(
        500, "Jobs per 'store prune' transaction (the longest a writer waits on it).", min=1
    )


@dataclass(frozen=True)
class CollectorSettings:
    node_wait_s: float = setting(
        600.0, "Wait this long for every node's record of a multi-node job.", min=0
    )
    settle_timeout_s: float = setting(
        3600.0, "Re-poll unsettled accounting this long, then store the job as it is.", min=0
    )
    missing_lookback_s: float = setting(
        86400.0, "How far back to look for GPU jobs that left no telemetry.", min=0
    )
    missing_grace_s: float = setting(
        600.0, "A GPU job without a record is 'missing' only this long after its end.", min=0
    )
    done_retention_s: float = setting(
        259200.0, "Keep ingested spool files in <state_dir>/done this long.", min=0
    )
    interval_s: float = setting(
        300.0, "Seconds between passes of 'slurm-gpu collect' without --once.", min=1
    )
    queue_wait_s: float = setting(
        300.0,
        "'collect --queue': how long to keep looking for a queued job's record and settled "
        "accounting before leaving it to the timer (a CPU-only job waits this long).",
        min=0,
        max=86400,
    )
    admin_comment: bool = setting(
        False,
        "After storing a GPU job, write its summary into Slurm's AdminComment (JS1: base64 of "
        "gzip of JSON, read by reportseff and jobstats) with sacctmgr, as root or a Slurm "
        "operator. Slurm 22.05's sacctmgr lower-cases the value, which breaks it: the "
        "collector detects that, says so once and stops writing; leave this off there.",
    )
    sacctmgr_path: str = setting(
        "",
        "sacctmgr executable for admin_comment; empty: the sacctmgr next to an absolute "
        "accounting.sacct_path, else sacctmgr on PATH.",
    )
    report_worker: bool = setting(
        True,
        "Render the stored jobs' gpueff reports (gpueff.cache_reports, SQLite store) in a "
        "second process while the collector stores the next jobs (from a batch of 64 jobs or "
        "more on); false: in the collector's process.",
    )


#: Source names of ``[source]`` that the collector itself handles: the node hooks' records
#: (push), and no telemetry at all (the partition is not collected).
SOURCE_HOOKS = "hooks"
SOURCE_NONE = "none"


@dataclass(frozen=True)
class SourceSettings:
    """Where each partition's telemetry comes from (``docs/telemetry.md``, "Sources")."""

    default: str = setting(
        SOURCE_HOOKS,
        "Telemetry source of partitions not named in 'partitions': hooks (the node hooks' "
        "records), slurm-tres (Slurm accounting's per-step GPU TRES), dcgm, jobstats or "
        "exporter (Prometheus), none (not collected).",
    )
    partitions: Mapping[str, str] = setting(
        {},
        'Per-partition source, e.g. { a100 = "dcgm", cpu = "none" }; names as in default.',
    )
    pull_lookback_s: float = setting(
        86400.0,
        "How far back the first pull pass looks for ended jobs of partitions whose source is "
        "not the hooks.",
        min=0,
    )
    pull_relook_s: float = setting(
        3600.0,
        "Each pull pass looks this far before its last watermark again (accounting learns of "
        "some ends late); jobs already stored are skipped.",
        min=0,
    )
