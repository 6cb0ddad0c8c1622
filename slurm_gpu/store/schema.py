"""The store's tables (SQLAlchemy Core), as of the latest migration.

Column names carry units like the records do. Every per-job table is keyed by ``job_id``
(Slurm's ``JobIDRaw``) so that re-ingesting a job replaces its rows in one transaction.
Report queries filter on ``jobs.end_s``, ``user``, ``account`` and ``partition``; each has an
index. The bulky columns (histograms, timelines) are packed by ``slurm_gpu.store.codec``.

Changing a table means adding a migration in ``slurm_gpu.store.migrations``; this module always
describes the newest schema.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

#: Telemetry status of a stored job.
TELEMETRY_COMPLETE = "complete"
"""Every node sealed its record itself."""
TELEMETRY_RECOVERED = "recovered"
"""A record was recovered by the epilog (sampler killed or crashed), or a node's record never
arrived (``jobs.missing_hosts``)."""
TELEMETRY_MISSING = "missing"
"""A GPU job without any record: hooks not installed on its nodes, or the sampler never ran."""
TELEMETRY_NONE = "none"
"""The job had no GPUs."""
TELEMETRY_STATES = (TELEMETRY_COMPLETE, TELEMETRY_RECOVERED, TELEMETRY_MISSING, TELEMETRY_NONE)

_JOB_FK = "jobs.job_id"

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", String(200), nullable=False),
    Column("applied_at_s", Float, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(32), primary_key=True),
    Column("job_id_display", String(64), nullable=False),
    Column("array_job_id", String(32)),
    Column("array_task_id", String(32)),
    Column("het_job_id", String(32)),
    Column("het_job_offset", Integer),
    Column("user", String(128), nullable=False),
    Column("uid", BigInteger),
    Column("account", String(128)),
    Column("partition", String(128)),
    Column("qos", String(128)),
    Column("job_name", Text, nullable=False),
    Column("work_dir", Text),
    # Comma-separated expanded host names.
    Column("nodelist", Text, nullable=False),
    Column("node_count", Integer, nullable=False),
    Column("state", String(32), nullable=False),
    Column("cancelled_by_uid", BigInteger),
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("derived_exit_code", Integer),
    # Slurm's raw TRES strings, for reports and humans.
    Column("alloc_tres", Text, nullable=False),
    Column("req_tres", Text, nullable=False),
    # JSON {"alloc": {...}, "req": {...}}: every parsed Tres field, to rebuild the JobRecord.
    Column("tres_json", Text, nullable=False),
    Column("alloc_cpus", Integer),
    Column("req_cpus", Integer),
    Column("alloc_mem_bytes", BigInteger),
    Column("req_mem_bytes", BigInteger),
    Column("alloc_gpus", Integer),
    Column("req_gpus", Integer),
    # The typed GPU name when Slurm reported one (``a100``), else NULL.
    Column("gpu_type", String(64)),
    Column("max_rss_bytes", BigInteger),
    Column("total_cpu_s", Float),
    Column("elapsed_s", BigInteger, nullable=False),
    Column("time_limit_s", BigInteger),
    Column("submit_s", Float),
    Column("start_s", Float),
    Column("end_s", Float),
    Column("restarts", Integer, nullable=False),
    Column("comment", Text),
    Column("admin_comment", Text),
    Column("mail_user", Text),
    Column("mail_type", String(200)),
    Column("gres_gpu_detail", Text),
    # Since schema version 4: JSON list of the job's steps (``JobStep`` fields; no step name).
    Column("steps_json", Text),
    Column("telemetry", String(16), nullable=False),
    Column("telemetry_source", String(32)),
    Column("interval_s", Float),
    # Comma-separated nodes of the job whose record never arrived.
    Column("missing_hosts", Text, nullable=False),
    # Allocated GPUs times elapsed hours.
    Column("gpu_hours", Float),
    Column("analysis_version", String(64)),
    Column("collected_at_s", Float, nullable=False),
    # Since schema version 6: when ``slurm-gpu store prune`` removed the job's timelines and
    # rendered report (seconds since the epoch); NULL while they are kept.
    Column("timeline_pruned_s", Float),
    # Since schema version 11: the job's own request (its submit line and its batch script's
    # ``#SBATCH`` lines, cleaned user text) and Slurm's last state reason, so that a
    # re-analysis from the store writes advice in the job's form and knows a node failure.
    Column("submit_line", Text),
    Column("batch_directives", Text),
    Column("reason", Text),
)
Index("ix_jobs_end_s", jobs.c.end_s)
Index("ix_jobs_user_end", jobs.c.user, jobs.c.end_s)
Index("ix_jobs_account_end", jobs.c.account, jobs.c.end_s)
Index("ix_jobs_partition_end", jobs.c.partition, jobs.c.end_s)
Index("ix_jobs_array", jobs.c.array_job_id)
# Since schema version 3: with it, the lookup of a typed id (job, array or het id) is three
# index searches instead of a scan of every job.
ix_jobs_het = Index("ix_jobs_het", jobs.c.het_job_id)
# Since schema version 6: the prune's next batch (not yet pruned, oldest end first) is an index
# range, however many jobs earlier runs already pruned.
ix_jobs_pruned_end = Index("ix_jobs_pruned_end", jobs.c.timeline_pruned_s, jobs.c.end_s)

job_hosts = Table(
    "job_hosts",
    metadata,
    Column("job_id", String(32), ForeignKey(_JOB_FK, ondelete="CASCADE"), primary_key=True),
    Column("host", String(255), primary_key=True),
    Column("uid", BigInteger),
    Column("source", String(32), nullable=False),
    Column("interval_s", Float, nullable=False),
    Column("started_s", Float, nullable=False),
    Column("ended_s", Float, nullable=False),
    Column("complete", Boolean, nullable=False),
    # Newline-separated machine-readable notes.
    Column("notes", Text, nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("has_host_summary", Boolean, nullable=False),
    Column("method", String(16)),
    Column("samples", Integer),
    Column("cpu_time_s", Float),
    Column("cpu_busy_mean_pct", Float),
    Column("cpu_busy_hist", LargeBinary),
    Column("allocated_cores", Integer),
    Column("rss_max_bytes", BigInteger),
    Column("rss_mean_bytes", Float),
    Column("io_read_bytes", BigInteger),
    Column("io_write_bytes", BigInteger),
)

job_gpus = Table(
    "job_gpus",
    metadata,
    Column("job_id", String(32), ForeignKey(_JOB_FK, ondelete="CASCADE"), primary_key=True),
    Column("host", String(255), primary_key=True),
    Column("uuid", String(128), primary_key=True),
    # Order of the GPU in its node record (the timeline's column order).
    Column("position", Integer, nullable=False),
    Column("gpu_index", Integer),
    Column("minor_number", Integer),
    Column("model", String(128)),
    Column("memory_total_bytes", BigInteger),
    Column("power_limit_w", Float),
    Column("parent_uuid", String(128)),
    Column("mig_profile", String(32)),
    Column("pci_bus_id", String(32)),
    Column("compute_capability", String(8)),
    Column("samples", Integer, nullable=False),
    Column("samples_available", Integer, nullable=False),
    Column("first_time_s", Float),
    Column("last_time_s", Float),
    Column("util_mean_pct", Float),
    Column("util_p10_pct", Float),
    Column("util_p50_pct", Float),
    Column("util_p90_pct", Float),
    Column("util_p99_pct", Float),
    Column("util_hist", LargeBinary, nullable=False),
    Column("sub_util_mean_pct", Float),
    Column("sub_util_hist", LargeBinary, nullable=False),
    Column("idle_samples", Integer, nullable=False),
    Column("idle_fraction", Float),
    # Seconds from the first reading to the first active one (whole span if never active).
    Column("idle_head_s", Float),
    # Seconds from the last active reading to the last reading (0 if never active).
    Column("idle_tail_s", Float),
    Column("active_first_time_s", Float),
    Column("active_last_time_s", Float),
    Column("memory_used_max_bytes", BigInteger),
    Column("memory_used_mean_bytes", Float),
    Column("power_mean_w", Float),
    Column("power_max_w", Float),
    Column("energy_j", Float),
    Column("sm_clock_mean_mhz", Float),
    Column("temperature_max_c", Float),
    Column("throttle_power_s", Float, nullable=False),
    Column("throttle_thermal_s", Float, nullable=False),
    Column("pcie_tx_mean_bytes_per_s", Float),
    Column("pcie_rx_mean_bytes_per_s", Float),
    Column("nvlink_bytes", BigInteger),
    Column("nvlink_bytes_while_idle", BigInteger),
    Column("ecc_corrected", BigInteger),
    Column("ecc_uncorrected", BigInteger),
    # Comma-separated distinct XID codes.
    Column("xid_events", Text, nullable=False),
    Column("process_seen", Boolean, nullable=False),
    Column("max_processes", Integer, nullable=False),
    Column("pids", Text, nullable=False),
    Column("sm_active_mean_pct", Float),
    Column("tensor_active_mean_pct", Float),
    # Since schema version 4: readings whose process list could not be read (NULL: not
    # counted, sealed before), and the (duty, cores busy) grid as sparse "index:count" pairs.
    Column("process_list_unread", Integer),
    Column("stall_grid", Text),
    # Since schema version 9: mean memory-controller utilization, percent (NULL: not reported).
    Column("memory_util_mean_pct", Float),
)
Index("ix_job_gpus_uuid", job_gpus.c.uuid)

timelines = Table(
    "timelines",
    metadata,
    Column("job_id", String(32), ForeignKey(_JOB_FK, ondelete="CASCADE"), primary_key=True),
    Column("host", String(255), primary_key=True),
    # Comma-separated GPU UUIDs in the order of the per-GPU columns.
    Column("gpu_uuids", Text, nullable=False),
    Column("points", Integer, nullable=False),
    # ``slurm_gpu.store.codec.encode_timeline``.
    Column("data", LargeBinary, nullable=False),
)

findings = Table(
    "findings",
    metadata,
    Column("job_id", String(32), ForeignKey(_JOB_FK, ondelete="CASCADE"), primary_key=True),
    # Order in which the analysis returned the finding (most important first).
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("code", String(64), nullable=False),
    Column("severity", String(16), nullable=False),
    # Which of the seven causes of low GPU utilization (1–7); NULL for none.
    Column("cause", Integer),
    # ``job``, ``node`` or ``gpu``, and the host name or GPU UUID it is about.
    Column("scope", String(16)),
    Column("subject", String(255)),
    # JSON object of the numbers behind the finding.
    Column("evidence", Text, nullable=False),
    # JSON object (e.g. the suggested request), or NULL.
    Column("recommendation", Text),
    Column("analysis_version", String(64), nullable=False),
)
Index("ix_findings_code", findings.c.code)

job_reports = Table(
    "job_reports",
    metadata,
    Column("job_id", String(32), ForeignKey(_JOB_FK, ondelete="CASCADE"), primary_key=True),
    # The id as a user types it for this one job: ``1234``, ``1234_7`` (array task) or
    # ``1234+0`` (het component); what ``gpueff``'s cached path looks up.
    Column("typed_id", String(64), nullable=False),
    # ``slurm_gpu.jobreport.reportcache.render_key`` of the release, templates and settings
    # that rendered the texts; a reader with another key renders afresh.
    Column("render_key", String(64), nullable=False),
    # ``gpueff``'s terminal report of the job, without and with colour.
    Column("plain", Text, nullable=False),
    Column("colour", Text, nullable=False),
    Column("rendered_at_s", Float, nullable=False),
)
Index("ix_job_reports_typed", job_reports.c.typed_id)

live_actions = Table(
    "live_actions",
    metadata,
    # Every action of the live policy (``slurm-gpu police``) on a running job: not keyed to
    # ``jobs`` (the job is stored only after it ends). ``action`` is ``warned``, ``cancelled``,
    # ``would_warn`` or ``would_cancel`` (dry run); ``rule`` ``never_used`` or ``idle``.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), nullable=False),
    Column("rule", String(32), nullable=False),
    Column("action", String(16), nullable=False),
    Column("user", String(128), nullable=False),
    Column("account", String(128), nullable=False),
    Column("at_s", Float, nullable=False),
    # GPUs the rule found idle, and their idle GPU-seconds at the time: what the action stops.
    Column("gpus", Integer, nullable=False),
    Column("idle_gpu_s", Float, nullable=False),
    Column("detail", Text, nullable=False),
)
Index("ix_live_actions_job", live_actions.c.job_id)
Index("ix_live_actions_user_at", live_actions.c.user, live_actions.c.at_s)

#: The tables migration 1 created (schema version 1).
V1_TABLES = ("jobs", "job_hosts", "job_gpus", "timelines", "findings")

#: Columns added to a table after migration 1 (by the migration that added them), which
#: migration 1 leaves out so that a fresh store passes through every step.
LATER_COLUMNS = {"jobs": ("timeline_pruned_s", "submit_line", "batch_directives", "reason")}

#: Child tables first: the order in which a job's rows are deleted.
JOB_CHILD_TABLES = (job_reports, findings, timelines, job_gpus, job_hosts)
