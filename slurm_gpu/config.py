"""Configuration: one TOML file parsed into typed, validated, frozen settings.

The file is ``/etc/slurm-gpu/config.toml`` unless ``SLURM_GPU_CONFIG`` names another. A missing
default file means "all defaults"; a missing file that was named explicitly is an error. Every
key is declared once, below, as a field of a section dataclass with its default, its unit in
the name and its constraints in ``metadata``; ``share/config.example.toml`` lists every key and
a test checks the two agree.

Only the composition roots (the CLI and the hooks) call ``load_settings``. Privileged code
(anything running as root, and the hooks, sampler, collector and ship always) reads only a
trusted file (``slurm_gpu.trust``): the environment may choose which file, never supply one.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu.errors import ConfigError

DEFAULT_PATH = "/etc/slurm-gpu/config.toml"
ENV_VAR = "SLURM_GPU_CONFIG"


def _opt(default: Any, doc: str, **constraints: Any) -> Any:
    """A setting: its default, a one-line doc, and constraints (min, max, choices)."""
    if isinstance(default, list | dict):
        frozen = tuple(default) if isinstance(default, list) else default
        return field(default_factory=lambda: frozen, metadata={"doc": doc, **constraints})
    return field(default=default, metadata={"doc": doc, **constraints})


@dataclass(frozen=True)
class PathsSettings:
    spool_dir: str = _opt(
        "/var/spool/slurm-gpu",
        "Per-job telemetry written by the hooks (root-owned; job files 0600).",
    )
    state_dir: str = _opt(
        "/var/lib/slurm-gpu",
        "Collector state: lock, done/, quarantine, default store file. Root's alone: the "
        "collector refuses a directory that another account (or a parent) may write.",
    )
    log_file: str = _opt(
        "/var/log/slurm-gpu/hooks.log", "Hook and sampler log; empty string logs to syslog."
    )
    inbox_dir: str = _opt(
        "",
        "Shared directory where nodes ship sealed records (`slurm-gpu ship`) and the collector "
        "reads them; empty: the collector reads spool_dir (collector on the node itself).",
    )
    queue_dir: str = _opt(
        "/var/spool/slurm-gpu-queue",
        "Where EpilogSlurmctld (as SlurmUser) queues ended job ids for one 'collect --queue' "
        "drainer; SlurmUser's, mode 0700, in a root-owned parent. Must match QUEUE in "
        "epilog-slurmctld.sh. Empty: no queue.",
    )


@dataclass(frozen=True)
class TelemetrySettings:
    backend: str = _opt("nvml", "GPU telemetry source.", choices=("nvml", "virtual"))
    virtual_dir: str = _opt(
        "/var/lib/slurm-gpu/vgpu", "Directory of virtual GPUs (backend = virtual)."
    )
    interval_s: float = _opt(10.0, "Seconds between two readings of every GPU.", min=0.05, max=3600)
    idle_threshold_pct: float = _opt(
        1.0, "A reading at or below this duty cycle counts as idle.", min=0, max=100
    )
    timeline_points: int = _opt(
        512, "Most points kept in the per-job downsampled timeline.", min=16, max=100000
    )
    checkpoint_interval_s: float = _opt(
        60.0, "Seconds between sampler checkpoints (bounds epilog recovery).", min=1, max=86400
    )


@dataclass(frozen=True)
class HooksSettings:
    sampler_stop_timeout_s: float = _opt(
        3.0, "Epilog wait after SIGTERM before SIGKILL of the sampler.", min=0.1, max=60
    )
    hook_timeout_s: float = _opt(
        20.0, "Hard limit on one prolog or epilog run, seconds.", min=1, max=300
    )
    sampler_nice: int = _opt(10, "Nice value of the sampler process.", min=0, max=19)
    sampler_memory_max_bytes: int = _opt(
        268435456,
        "RLIMIT_DATA of a detached sampler (heap and private mappings; it needs about 20 MB); "
        "0: unlimited. systemd sites set MemoryMax in the unit.",
        min=0,
    )
    sampler_open_files_max: int = _opt(
        4096,
        "RLIMIT_NOFILE of a detached sampler (it keeps 2 per job process, at most 512); "
        "0: unchanged.",
        min=0,
        max=1048576,
    )
    sampler_launcher: str = _opt(
        "detach",
        "How the prolog starts the sampler: a detached process, or a systemd unit "
        "(slurm-gpu-sampler@<jobid>.service).",
        choices=("detach", "systemd"),
    )
    reap_stale_samplers: bool = _opt(
        True,
        "When a job's prolog finds one of its GPUs still claimed by another job's sampler (its "
        "epilog never reached it), stop and seal that sampler: gres GPUs are exclusive, so "
        "that job has ended. Set false where jobs share GPUs (gres/shard, MPS).",
    )


@dataclass(frozen=True)
class AccountingSettings:
    backend: str = _opt("sacct", "Where job metadata comes from.", choices=("sacct", "pyslurm"))
    sacct_path: str = _opt("sacct", "sacct executable (absolute path recommended).")
    timeout_s: float = _opt(60.0, "Timeout of one accounting query, seconds.", min=1, max=3600)
    batch_size: int = _opt(500, "Jobs asked of sacct in one call.", min=1, max=100000)


@dataclass(frozen=True)
class StoreSettings:
    url: str = _opt("", "SQLAlchemy URL; empty means SQLite at <state_dir>/slurm-gpu.db.")
    admin_group: str = _opt(
        "",
        "Group that may read a SQLite store (file 0640, state_dir 0750; e.g. admins and "
        "SlurmUser for the mail program); empty: root alone (0600, 0700). Users read their "
        "own reports from [gpueff] reports_dir.",
    )
    timeline_retention_days: float = _opt(
        180.0,
        "'store prune' deletes per-GPU timelines and rendered reports of jobs that ended this "
        "many days ago (summaries and findings stay); 0 keeps them for ever.",
        min=0,
    )
    summary_retention_days: float = _opt(
        0.0,
        "'store prune' deletes whole jobs (summaries, findings) that ended this many days ago; "
        "0 keeps them for ever.",
        min=0,
    )
    prune_batch_jobs: int = _opt(
        500, "Jobs per 'store prune' transaction (the longest a writer waits on it).", min=1
    )


@dataclass(frozen=True)
class ShipSettings:
    """How ``slurm-gpu ship`` moves a node's sealed records to the collector."""

    transport: str = _opt(
        "directory",
        "directory: copy into paths.inbox_dir (a shared filesystem); postgresql: insert into "
        "the store's inbox table (no shared filesystem; the store must be PostgreSQL).",
        choices=("directory", "postgresql"),
    )
    postgresql_dsn: str = _opt(
        "",
        "libpq connection string of the node's inbox role (host=... dbname=... user=...); no "
        "password here: password_file, or peer/certificate authentication (sslcert=...).",
    )
    password_file: str = _opt(
        "",
        "File holding the inbox role's password (root's, mode 0600 or 0400); empty: none "
        "(peer or certificate authentication).",
    )
    connect_timeout_s: int = _opt(
        10, "Longest wait for the PostgreSQL server to answer a connection.", min=2, max=300
    )
    statement_timeout_s: float = _opt(
        30.0, "Longest one INSERT may run (also bounds a silent network).", min=1, max=3600
    )


@dataclass(frozen=True)
class CollectorSettings:
    node_wait_s: float = _opt(
        600.0, "Wait this long for every node's record of a multi-node job.", min=0
    )
    settle_timeout_s: float = _opt(
        3600.0, "Re-poll unsettled accounting this long, then store the job as it is.", min=0
    )
    missing_lookback_s: float = _opt(
        86400.0, "How far back to look for GPU jobs that left no telemetry.", min=0
    )
    missing_grace_s: float = _opt(
        600.0, "A GPU job without a record is 'missing' only this long after its end.", min=0
    )
    done_retention_s: float = _opt(
        259200.0, "Keep ingested spool files in <state_dir>/done this long.", min=0
    )
    interval_s: float = _opt(
        300.0, "Seconds between passes of 'slurm-gpu collect' without --once.", min=1
    )
    queue_wait_s: float = _opt(
        300.0,
        "'collect --queue': how long to keep looking for a queued job's record and settled "
        "accounting before leaving it to the timer (a CPU-only job waits this long).",
        min=0,
        max=86400,
    )
    admin_comment: bool = _opt(
        False,
        "After storing a GPU job, write its summary into Slurm's AdminComment (JS1: base64 of "
        "gzip of JSON, read by reportseff and jobstats) with sacctmgr, as root or a Slurm "
        "operator. Slurm 22.05's sacctmgr lower-cases the value, which breaks it: the "
        "collector detects that, says so once and stops writing; leave this off there.",
    )
    sacctmgr_path: str = _opt(
        "",
        "sacctmgr executable for admin_comment; empty: the sacctmgr next to an absolute "
        "accounting.sacct_path, else sacctmgr on PATH.",
    )
    report_worker: bool = _opt(
        True,
        "Render the stored jobs' gpueff reports (gpueff.cache_reports, SQLite store) in a "
        "second process while the collector stores the next jobs (from a batch of 64 jobs or "
        "more on); false: in the collector's process.",
    )


@dataclass(frozen=True)
class AnalysisSettings:
    """Thresholds of the diagnosis rules and the headroom of recommendations (units in names)."""

    min_elapsed_s: int = _opt(
        120, "Jobs shorter than this get 'not enough data' instead of a diagnosis.", min=0
    )
    min_samples: int = _opt(3, "GPU readings needed before a GPU is diagnosed.", min=1)
    idle_pct: float = _opt(
        5.0, "A timeline bucket at or below this duty cycle counts as idle.", min=0, max=100
    )
    unused_max_duty_pct: float = _opt(
        1.0, "An allocated GPU whose mean duty cycle stays at or below this is unused.", min=0
    )
    low_duty_pct: float = _opt(
        50.0, "A mean duty cycle below this is low utilization.", min=0, max=100
    )
    small_memory_pct: float = _opt(
        40.0, "A GPU memory peak below this share of capacity is little memory.", min=0, max=100
    )
    steady_max_idle_pct: float = _opt(
        50.0, "Low duty cycle is 'steady' when at most this share of readings is idle.", min=0
    )
    low_sm_active_pct: float = _opt(
        25.0, "SM activity below this on a busy GPU means kernels too small to fill it.", min=0
    )
    cpu_saturated_pct: float = _opt(
        75.0, "Host cores busy at or above this share of the allocation saturate it.", min=0
    )
    stall_share_pct: float = _opt(
        25.0,
        "Share of time with low GPU duty cycle and saturated CPUs that makes a job input-bound.",
        min=0,
        max=100,
    )
    min_cpus_per_gpu: int = _opt(
        4, "Fewer allocated cores per GPU than this is too few when the CPUs are busy.", min=1
    )
    tensor_idle_pct: float = _opt(
        5.0,
        "Tensor activity at or below this share of busy time means unused.",
        min=0,
        max=100,
    )
    tensor_busy_min_duty_pct: float = _opt(
        30.0, "Tensor cores are judged only on GPUs at least this busy.", min=0, max=100
    )
    tensor_min_compute_major: int = _opt(
        7, "Lowest compute capability (major) that has tensor cores.", min=1
    )
    near_full_memory_pct: float = _opt(
        95.0, "A GPU memory peak at or above this share of capacity is near OOM.", min=0, max=100
    )
    oversized_memory_pct: float = _opt(
        25.0, "A GPU memory peak below this share of capacity fits a smaller GPU.", min=0, max=100
    )
    oversized_duty_pct: float = _opt(
        30.0, "... when the mean duty cycle is also below this.", min=0, max=100
    )
    imbalance_spread_pct: float = _opt(
        30.0, "Spread (max - min) of the used GPUs' mean duty cycles that is imbalance.", min=0
    )
    comm_idle_traffic_pct: float = _opt(
        20.0,
        "Share of NVLink bytes moved while the GPU was idle that is a communication wait.",
        min=0,
        max=100,
    )
    time_used_max_pct: float = _opt(
        40.0, "Elapsed below this share of the time limit is over-requested time.", min=0
    )
    time_unused_min_s: int = _opt(
        3600, "... and only when at least this much of the limit went unused.", min=0
    )
    cpu_efficiency_max_pct: float = _opt(
        25.0, "CPU efficiency (as seff) below this is over-requested cores.", min=0, max=100
    )
    cpu_idle_min_cores: int = _opt(
        4, "... and only when at least this many cores went unused.", min=0
    )
    mem_efficiency_max_pct: float = _opt(
        25.0, "Memory efficiency (as seff) below this is over-requested memory.", min=0, max=100
    )
    mem_unused_min_bytes: int = _opt(
        8 * 1024**3, "... and only when at least this much memory went unused.", min=0
    )
    idle_edge_min_s: float = _opt(
        600.0, "An idle head or tail at least this long is reported ...", min=0
    )
    idle_edge_min_pct: float = _opt(
        10.0, "... when it is also at least this share of the job.", min=0, max=100
    )
    idle_edge_major_pct: float = _opt(
        30.0,
        "An idle head or tail at least this share of the job is reported however short it is.",
        min=0,
        max=100,
    )
    near_threshold_band_pct: float = _opt(
        20.0,
        "Over-request values within this share of their threshold give an info note, "
        "not a warning.",
        min=0,
        max=100,
    )
    dataloader_max_duty_pct: float = _opt(
        80.0,
        "Input-bound is judged up to this mean duty cycle: timeline buckets below it with "
        "saturated cores are stalls.",
        min=0,
        max=100,
    )
    cpu_saturated_strict_pct: float = _opt(
        90.0,
        "Up to dataloader_max_duty_pct (above low_duty_pct), cores busy at or above this share "
        "of the allocation count as saturated.",
        min=0,
        max=100,
    )
    busy_low_power_pct: float = _opt(
        35.0,
        "A busy GPU drawing less than this share of its power limit is nearly empty "
        "(used where SM activity is not reported).",
        min=0,
        max=100,
    )
    busy_low_memory_util_pct: float = _opt(
        20.0,
        "Where SM activity is not reported, a busy GPU at low power is nearly empty only if "
        "its memory controller was busy less than this share of the time (memory-bound "
        "kernels also draw little power); not checked where memory utilization is unknown.",
        min=0,
        max=100,
    )
    main_process_min_cores: float = _opt(
        0.85,
        "Cores busy per used GPU that count as one core kept busy: a GPU with no kernel in a "
        "reading while this many cores worked waited on one process (a DataLoader with "
        "num_workers=0), whatever the allocation.",
        min=0,
    )
    starved_min_span_pct: float = _opt(
        25.0,
        "A GPU at or below unused_max_duty_pct still counts as used (starved, not unused) when "
        "readings with kernels span at least this share of the job's time.",
        min=0,
        max=100,
    )
    idle_phase_min_s: float = _opt(
        300.0,
        "A mid-job run of idle timeline buckets at least this long is an idle phase.",
        min=0,
    )
    idle_phases_min_count: int = _opt(
        3, "Idle phases on one GPU from which they are reported as recurring.", min=1
    )
    idle_phases_min_pct: float = _opt(
        10.0,
        "... when they also add up to at least this share of the used GPUs' time.",
        min=0,
        max=100,
    )
    ragged_tail_min_pct: float = _opt(
        3.0,
        "GPUs that stopped working before the job's last one (by idle_phase_min_s or more) "
        "are a ragged tail when the GPU-hours they sat idle reach this share of the job's.",
        min=0,
        max=100,
    )
    exclusive_partitions: tuple[str, ...] = _opt(
        [], "Partitions that allocate whole nodes: no CPU, memory or GPU-count reductions there."
    )
    exclusive_partitions_from_slurm: bool = _opt(
        True,
        "The collector also treats the partitions Slurm configures OverSubscribe=EXCLUSIVE "
        "as whole-node partitions (scontrol show partition, read once per pass).",
    )
    whole_node_alloc_factor: float = _opt(
        2.0,
        "Allocated CPUs or memory more than this many times the request mark a whole-node "
        "allocation (--exclusive or an exclusive partition).",
        min=1,
    )
    throttle_min_pct: float = _opt(
        10.0, "Throttled for at least this share of the job is reported to the site.", min=0
    )
    headroom_time_pct: float = _opt(30.0, "Headroom over the longest run for --time.", min=0)
    headroom_mem_pct: float = _opt(25.0, "Headroom over the peak resident memory for --mem.", min=0)
    headroom_gpu_mem_pct: float = _opt(
        20.0, "Headroom over the GPU memory peak when choosing a MIG slice.", min=0
    )
    headroom_cpu_pct: float = _opt(
        25.0, "Headroom over the busiest cores for --cpus-per-gpu.", min=0
    )
    time_round_s: int = _opt(900, "--time is rounded up to a multiple of this.", min=60)
    time_round_long_s: int = _opt(
        3600, "... or of this, for times longer than time_round_long_after_s.", min=60
    )
    time_round_long_after_s: int = _opt(14400, "Where the coarser --time rounding begins.", min=0)
    mem_round_bytes: int = _opt(1024**3, "--mem is rounded up to a multiple of this.", min=1)
    mig_partitions: tuple[str, ...] = _opt(
        [], "Partitions whose GPUs are MIG slices; empty: never recommend a MIG profile."
    )
    mig_profiles: tuple[str, ...] = _opt(
        ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "MIG profiles offered in mig_partitions (memory read from the name).",
    )


@dataclass(frozen=True)
class GpueffSettings:
    """The ``gpueff`` command users run."""

    min_elapsed_s: float = _opt(
        30.0, "Jobs shorter than this get 'too short for a GPU reading', not numbers.", min=0
    )
    template_dir: str = _opt(
        "", "Directory whose templates override templates/gpueff, file by file; empty: none."
    )
    cache_reports: bool = _opt(
        True,
        "The collector renders each stored job's report so that gpueff prints it from one read "
        "(SQLite stores; used while the templates, these settings and the release are unchanged).",
    )
    reports_dir: str = _opt(
        "",
        "Where the collector writes each user's rendered reports (<uid>/<job>.report, readable "
        "by that user alone) for gpueff; empty: <state_dir>-reports.",
    )


@dataclass(frozen=True)
class MailSettings:
    """The e-mail after each job (``slurm-gpu mail``, Slurm's MailProg)."""

    fallback_mailprog: str = _opt(
        "/usr/bin/mail", "Mail program run, with the same arguments, for every other mail."
    )
    state_dir: str = _opt(
        "/var/lib/slurm-gpu-mail",
        "The mail program's own state (mail-state.db, mail-drain.lock): a directory of "
        "SlurmUser's, mode 0700, never paths.state_dir (root's alone).",
    )
    transport: str = _opt("smtp", "How messages leave.", choices=("smtp", "sendmail"))
    smtp_host: str = _opt("localhost", "SMTP server.")
    smtp_port: int = _opt(25, "SMTP port.", min=1, max=65535)
    smtp_starttls: bool = _opt(
        False, "Upgrade the SMTP connection with STARTTLS (certificate and host name verified)."
    )
    smtp_ca_file: str = _opt(
        "", "PEM file of the CA(s) that sign the SMTP server's certificate; empty: the system's."
    )
    smtp_user: str = _opt(
        "", "SMTP login; empty: none. Without smtp_starttls the password travels in clear."
    )
    smtp_password_file: str = _opt(
        "", "File holding the SMTP password, readable by SlurmUser only (not world-readable)."
    )
    smtp_timeout_s: float = _opt(30.0, "SMTP connection timeout, seconds.", min=1, max=600)
    sendmail_path: str = _opt("/usr/sbin/sendmail", "Local sendmail (transport = sendmail).")
    from_address: str = _opt("slurm-gpu@localhost", "From: address of every message.")
    recipient_domain: str = _opt(
        "", "Domain added to a bare user name (--mail-user alice, or none given)."
    )
    docs_url: str = _opt("", "Site page on GPU jobs, linked from every message; empty: none.")
    template_dir: str = _opt(
        "", "Directory whose templates override templates/mail, file by file; empty: none."
    )
    charts: bool = _opt(True, "Attach utilization charts as inline PNG images.")
    wait_for_record_s: float = _opt(
        120.0, "Longest wait for the job's stored record before mailing without it.", min=0
    )
    poll_interval_s: float = _opt(3.0, "Seconds between two looks for the record.", min=0.1)
    max_pending: int = _opt(
        10000,
        "Most END/FAIL mails waiting for their record at once; more go out plain at once.",
        min=1,
    )
    digest_window_s: float = _opt(
        3600.0,
        "Array tasks and bursts of one user within this window share one digest.",
        min=0,
    )
    max_per_user_per_window: int = _opt(
        3, "Single messages per user per window before the rest go into a digest.", min=1
    )
    waste_policy: bool = _opt(
        False, "Mail users whose job wasted GPU-hours even without --mail-type."
    )
    waste_min_gpu_hours: float = _opt(
        4.0, "Idle GPU-hours of one job that trigger the policy mail.", min=0
    )
    waste_period_s: float = _opt(
        7 * 86400.0, "At most one policy mail per user per this period.", min=0
    )
    opt_out_file: str = _opt(
        "", "File with one user name per line who never get policy mails; empty: none."
    )


@dataclass(frozen=True)
class ReportSettings:
    """The weekly admin report (``slurm-gpu report weekly``)."""

    site_name: str = _opt("slurm-gpu", "Site or cluster name in the report's title.")
    admin_emails: tuple[str, ...] = _opt([], "Addresses that get the weekly report with --mail.")
    trend_weeks: int = _opt(8, "Weeks shown in the trend section.", min=1, max=104)
    top_n: int = _opt(10, "Rows in the top users and top accounts tables.", min=1, max=1000)
    worst_jobs_per_user: int = _opt(5, "Worst jobs listed per top user.", min=1, max=100)
    table_rows: int = _opt(
        25, "Most rows of the never-used GPU and idle head/tail tables.", min=1, max=10000
    )
    idle_edge_min_s: float = _opt(
        600.0, "Idle head or tail of at least this many seconds lists a job.", min=0
    )
    template_dir: str = _opt(
        "", "Directory whose templates override templates/report, file by file; empty: none."
    )
    output_group: str = _opt(
        "",
        "Group that may read the files written with --out (mode 0640); empty: only their "
        "owner (mode 0600).",
    )


@dataclass(frozen=True)
class LiveSettings:
    """Running jobs: the node exporter and ``slurm-gpu live`` (``docs/live.md``)."""

    exporter_address: str = _opt(
        "127.0.0.1",
        "Address slurm-gpu exporter listens on; the node's management address for a "
        "Prometheus on another host.",
    )
    exporter_port: int = _opt(9817, "Port slurm-gpu exporter listens on.", min=1, max=65535)
    exporter_allowed_users: tuple[str, ...] = _opt(
        ["prometheus"],
        "Accounts besides root whose connections from this host (loopback) the exporter "
        "serves (the local Prometheus); other local users get 403.",
    )
    stale_after_s: float = _opt(
        180.0,
        "A live summary whose last reading is older than this is left out, seconds.",
        min=10,
    )
    prometheus_url: str = _opt(
        "",
        "Prometheus' base URL (http://host:9090) that slurm-gpu live asks; empty: read this "
        "node's live files instead.",
    )
    prometheus_timeout_s: float = _opt(
        10.0, "Timeout of one Prometheus query, seconds.", min=1, max=300
    )
    idle_min_s: float = _opt(
        900.0,
        "A GPU idle for at least this long is listed as idle by slurm-gpu live, seconds.",
        min=0,
    )
    police_grace_s: float = _opt(
        1800.0, "slurm-gpu police leaves a job alone this long after it starts, seconds.", min=0
    )
    police_idle_s: float = _opt(
        3600.0,
        "slurm-gpu police warns when a GPU is idle (or never used) this long, seconds.",
        min=60,
    )
    police_max_sample_age_s: float = _opt(
        120.0,
        "slurm-gpu police judges a job only if every node's last reading is this recent, seconds.",
        min=10,
    )
    police_coverage_min: float = _opt(
        0.9,
        "slurm-gpu police judges a GPU only if readings cover this share of its job's time.",
        min=0.5,
        max=1.0,
    )
    police_user_interval_s: float = _opt(
        3600.0, "At most one warning per user within this many seconds (others wait).", min=0
    )
    police_admin_emails: tuple[str, ...] = _opt(
        [], "Addresses that get the digest of each pass that warned or cancelled."
    )
    police_dry_run: bool = _opt(
        False, "Record what slurm-gpu police would do (would_warn, would_cancel); act on nothing."
    )
    police_cancel: bool = _opt(False, "Let slurm-gpu police cancel jobs (off: warnings only).")
    police_cancel_after_warnings: int = _opt(
        2, "Warnings a job gets before it may be cancelled.", min=1, max=100
    )
    police_cancel_grace_s: float = _opt(
        1800.0, "Seconds after the last warning before a cancellation.", min=0
    )
    police_max_cancels_per_pass: int = _opt(
        5, "Most jobs one pass of slurm-gpu police cancels.", min=0, max=10000
    )
    police_exempt_users: tuple[str, ...] = _opt([], "Users whose jobs are warned, never cancelled.")
    police_exempt_accounts: tuple[str, ...] = _opt(
        [], "Accounts whose jobs are warned, never cancelled."
    )
    police_exempt_partitions: tuple[str, ...] = _opt(
        [], "Partitions whose jobs are warned, never cancelled."
    )
    police_exempt_qos: tuple[str, ...] = _opt([], "QOS whose jobs are warned, never cancelled.")


#: Source names of ``[source]`` that the collector itself handles: the node hooks' records
#: (push), and no telemetry at all (the partition is not collected).
SOURCE_HOOKS = "hooks"
SOURCE_NONE = "none"


@dataclass(frozen=True)
class SourceSettings:
    """Where each partition's telemetry comes from (``docs/telemetry.md``, "Sources")."""

    default: str = _opt(
        SOURCE_HOOKS,
        "Telemetry source of partitions not named in 'partitions': hooks (the node hooks' "
        "records), slurm-tres (Slurm accounting's per-step GPU TRES), dcgm, jobstats or "
        "exporter (Prometheus), none (not collected).",
    )
    partitions: Mapping[str, str] = _opt(
        {},
        'Per-partition source, e.g. { a100 = "dcgm", cpu = "none" }; names as in default.',
    )
    pull_lookback_s: float = _opt(
        86400.0,
        "How far back the first pull pass looks for ended jobs of partitions whose source is "
        "not the hooks.",
        min=0,
    )
    pull_relook_s: float = _opt(
        3600.0,
        "Each pull pass looks this far before its last watermark again (accounting learns of "
        "some ends late); jobs already stored are skipped.",
        min=0,
    )


@dataclass(frozen=True)
class Settings:
    """All settings. ``sources`` maps each dotted key to the file it came from, or 'default'."""

    paths: PathsSettings = field(default_factory=PathsSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    hooks: HooksSettings = field(default_factory=HooksSettings)
    accounting: AccountingSettings = field(default_factory=AccountingSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    ship: ShipSettings = field(default_factory=ShipSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    gpueff: GpueffSettings = field(default_factory=GpueffSettings)
    mail: MailSettings = field(default_factory=MailSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    source: SourceSettings = field(default_factory=SourceSettings)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    path: str | None = None
    """The file these settings were read from; ``None`` when every value is a default."""

    @property
    def store_url(self) -> str:
        """The store URL, with the SQLite default resolved."""
        return self.store.url or f"sqlite:///{self.paths.state_dir}/slurm-gpu.db"


def sections() -> dict[str, type[Any]]:
    """Section name -> its dataclass, in declaration order."""
    hints = typing.get_type_hints(Settings)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(Settings)
        if f.name not in ("sources", "path")
    }


def config_path() -> tuple[str, bool]:
    """The file to read and whether it was named explicitly (by ``SLURM_GPU_CONFIG``).

    The variable may name any file; privileged code still reads it only when it is trusted
    (``load_settings``), so the environment can choose among root's files, never supply one.
    """
    env = os.environ.get(ENV_VAR)
    return (env, True) if env else (DEFAULT_PATH, False)


#: Largest configuration file read, bytes: a real one is a few KiB.
MAX_CONFIG_BYTES = 1 << 20


def must_be_trusted(trusted: bool | None) -> bool:
    """Whether a load with this ``trusted`` argument requires a trusted file: ``None`` means
    "when running as root" (root taking its settings from another account's file would run
    that account's choices, such as ``accounting.sacct_path``, as root)."""
    return os.geteuid() == 0 if trusted is None else trusted


def load_settings(path: str | None = None, *, trusted: bool | None = None) -> Settings:
    """Read and validate the configuration file.

    ``path`` overrides ``SLURM_GPU_CONFIG`` and the default. Raises ``ConfigError`` naming the
    key and the file for any bad value, unknown key or unreadable file.

    ``trusted``: ``True`` for privileged entry points (hooks, sampler, collector, ship): the
    file must be trusted (``slurm_gpu.trust``: owned by root or the caller, not writable by
    group or others, nor any directory above it), else ``ConfigError``. ``None`` (default):
    required when the effective uid is 0, so the admin CLI run by root is held to the same
    rule. ``False``: never required; only ``slurm-gpu doctor``, which reports an untrusted
    file instead of acting on it. A missing default file still means "all defaults".
    """
    explicit = path is not None
    if path is None:
        path, explicit = config_path()
    if must_be_trusted(trusted):
        data = _read_trusted(path, explicit)
        if data is None:
            return parse_settings({}, path=None)
        return parse_settings(_parse_toml(data, path), path=path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if explicit:
            raise _not_found(path) from None
        return parse_settings({}, path=None)
    except PermissionError:
        raise ConfigError(
            "configuration file is not readable",
            path=path,
            hint="make it readable (mode 0644) by the users who run gpueff",
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read ({exc.strerror})", path=path) from None
    return parse_settings(_parse_toml(raw, path), path=path)


def _not_found(path: str) -> ConfigError:
    return ConfigError(
        "configuration file not found",
        path=path,
        hint=f"create it from share/config.example.toml or unset {ENV_VAR}",
    )


def _read_trusted(path: str, explicit: bool) -> bytes | None:
    """The bytes of ``path`` if it is a trusted file; ``None`` when the default file is
    absent. The check runs on the resolved path, whose directories no other account can
    write, and is repeated on the opened descriptor, so the file read is the file checked."""
    from slurm_gpu.trust import require_trusted_file

    if not os.path.exists(path):
        if explicit:
            raise _not_found(path)
        return None
    real = require_trusted_file(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"cannot read ({exc.strerror})", path=path) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid not in (0, os.geteuid())
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            # Replaced between the check and the open: only root could have done that.
            raise ConfigError(
                "not a trusted file: it changed while being opened",
                path=path,
                hint="run again; check who else manages the configuration",
            )
        try:
            return fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read ({exc.strerror})", path=path) from None


def _parse_toml(raw: bytes, path: str) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"larger than {MAX_CONFIG_BYTES} bytes",
            path=path,
            hint="a configuration file is a few KiB; check that this is the right file",
        )
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", path=path, hint="save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not valid TOML ({exc})", path=path, hint="check the line named above"
        ) from None


def parse_settings(data: Mapping[str, Any], *, path: str | None) -> Settings:
    """Validate a parsed TOML mapping into ``Settings`` (no I/O)."""
    known = sections()
    where = path or "<defaults>"
    for name in data:
        if name not in known:
            raise ConfigError(
                f"unknown section [{name}]",
                key=name,
                path=where,
                hint=f"known sections: {', '.join(known)}",
            )
    built: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, cls in known.items():
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError("must be a table", key=name, path=where, hint=f"write it as [{name}]")
        built[name], section_sources = _parse_section(name, cls, table, where)
        sources.update(section_sources)
    return Settings(**built, sources=sources, path=path)


def _parse_section(
    name: str, cls: type[Any], table: Mapping[str, Any], where: str
) -> tuple[Any, dict[str, str]]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            raise ConfigError(
                "unknown key",
                key=f"{name}.{key}",
                path=where,
                hint=f"keys of [{name}]: {', '.join(fields)}",
            )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, f in fields.items():
        dotted = f"{name}.{key}"
        if key in table:
            values[key] = _coerce(table[key], hints[key], f.metadata, dotted, where)
            sources[dotted] = where
        else:
            sources[dotted] = "default"
    return cls(**values), sources


def _coerce(value: Any, hint: Any, meta: Mapping[str, Any], key: str, where: str) -> Any:
    def bad(msg: str, hint_text: str | None = None) -> ConfigError:
        return ConfigError(msg, key=key, path=where, hint=hint_text or meta.get("doc"))

    origin = typing.get_origin(hint)
    if hint is bool:
        if not isinstance(value, bool):
            raise bad(f"must be true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"must be a whole number, not {value!r}")
        out: Any = value
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"must be a number, not {value!r}")
        out = float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise bad(f"must be a string, not {value!r}")
        out = value
    elif origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(f"must be a list of strings, not {value!r}")
        out = tuple(value)
    elif origin is dict or hint is dict or origin is Mapping:
        if not isinstance(value, Mapping):
            raise bad(f"must be a table, not {value!r}")
        out = dict(value)
    else:  # pragma: no cover - a declaration error, caught by the example-config test
        raise bad(f"unsupported setting type {hint!r}")
    if "choices" in meta and out not in meta["choices"]:
        raise bad(f"must be one of {', '.join(map(repr, meta['choices']))}, not {out!r}")
    if "min" in meta and out < meta["min"]:
        raise bad(f"must be at least {meta['min']}, not {out!r}")
    if "max" in meta and out > meta["max"]:
        raise bad(f"must be at most {meta['max']}, not {out!r}")
    return out


def describe(settings: Settings) -> list[tuple[str, Any, str, str]]:
    """Rows of (dotted key, effective value, where it came from, doc) for ``config show``."""
    rows: list[tuple[str, Any, str, str]] = []
    for name in sections():
        section = getattr(settings, name)
        for f in dataclasses.fields(section):
            dotted = f"{name}.{f.name}"
            rows.append(
                (
                    dotted,
                    getattr(section, f.name),
                    settings.sources.get(dotted, "default"),
                    f.metadata.get("doc", ""),
                )
            )
    return rows


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")  # pragma: no cover


def example_toml() -> str:
    """A commented configuration file holding every key at its default value."""
    out = [
        "# slurm-gpu configuration: every key, at its default value.",
        f"# Default location {DEFAULT_PATH}; ${ENV_VAR} names another file.",
        "# Generated by `slurm-gpu config example`; a test keeps it in step with the code.",
    ]
    defaults = Settings()
    for name in sections():
        out += ["", f"[{name}]"]
        section = getattr(defaults, name)
        for f in dataclasses.fields(section):
            doc = f.metadata.get("doc", "")
            limits = []
            if "choices" in f.metadata:
                limits.append("one of " + ", ".join(f.metadata["choices"]))
            if "min" in f.metadata:
                limits.append(f"min {f.metadata['min']}")
            if "max" in f.metadata:
                limits.append(f"max {f.metadata['max']}")
            out.append(f"# {doc}" + (f" ({'; '.join(limits)})" if limits else ""))
            out.append(f"{f.name} = {_toml_value(getattr(section, f.name))}")
    return "\n".join(out) + "\n"
