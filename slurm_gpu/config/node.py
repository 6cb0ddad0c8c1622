"""Settings of the node side: paths, the GPU source, the hooks and the record transport."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class PathsSettings:
    spool_dir: str = setting(
        "/var/spool/slurm-gpu",
        "Per-job telemetry written by the hooks (root-owned; job files 0600).",
    )
    state_dir: str = setting(
        "/var/lib/slurm-gpu",
        "Collector state: lock, done/, quarantine, default store file. Root's alone: the "
        "collector refuses a directory that another account (or a parent) may write.",
    )
    log_file: str = setting(
        "/var/log/slurm-gpu/hooks.log", "Hook and sampler log; empty string logs to syslog."
    )
    inbox_dir: str = setting(
        "",
        "Shared directory where nodes ship sealed records (`slurm-gpu ship`) and the collector "
        "reads them; empty: the collector reads spool_dir (collector on the node itself).",
    )
    queue_dir: str = setting(
        "/var/spool/slurm-gpu-queue",
        "Where EpilogSlurmctld (as SlurmUser) queues ended job ids for one 'collect --queue' "
        "drainer; SlurmUser's, mode 0700, in a root-owned parent. Must match QUEUE in "
        "epilog-slurmctld.sh. Empty: no queue.",
    )


@dataclass(frozen=True)
class TelemetrySettings:
    backend: str = setting("nvml", "GPU telemetry source.", choices=("nvml", "virtual"))
    virtual_dir: str = setting(
        "/var/lib/slurm-gpu/vgpu", "Directory of virtual GPUs (backend = virtual)."
    )
    interval_s: float = setting(
        10.0, "Seconds between two readings of every GPU.", min=0.05, max=3600
    )
    idle_threshold_pct: float = setting(
        1.0, "A reading at or below this duty cycle counts as idle.", min=0, max=100
    )
    timeline_points: int = setting(
        512, "Most points kept in the per-job downsampled timeline.", min=16, max=100000
    )
    checkpoint_interval_s: float = setting(
        60.0, "Seconds between sampler checkpoints (bounds epilog recovery).", min=1, max=86400
    )
    counters_interval_s: float = setting(
        60.0,
        "Seconds between two reads of the cumulative counters that cost milliseconds per GPU "
        "in the driver (NVML: total energy, power and thermal violation times, PCIe and ECC "
        "totals; and the driver's utilization samples, over the interval before that "
        "reading); they are also read at a GPU's first reading and when the sampler seals, so "
        "job totals stay exact. 0: at every reading.",
        min=0,
        max=86400,
    )


@dataclass(frozen=True)
class HooksSettings:
    sampler_stop_timeout_s: float = setting(
        3.0, "Epilog wait after SIGTERM before SIGKILL of the sampler.", min=0.1, max=60
    )
    hook_timeout_s: float = setting(
        20.0, "Hard limit on one prolog or epilog run, seconds.", min=1, max=300
    )
    sampler_nice: int = setting(10, "Nice value of the sampler process.", min=0, max=19)
    sampler_memory_max_bytes: int = setting(
        268435456,
        "RLIMIT_DATA of a detached sampler (heap and private mappings; it needs about 20 MB); "
        "0: unlimited. systemd sites set MemoryMax in the unit.",
        min=0,
    )
    sampler_open_files_max: int = setting(
        4096,
        "RLIMIT_NOFILE of a detached sampler (it keeps 2 per job process, at most 512); "
        "0: unchanged.",
        min=0,
        max=1048576,
    )
    sampler_launcher: str = setting(
        "detach",
        "How the prolog starts the sampler: a detached process, or a systemd unit "
        "(slurm-gpu-sampler@<jobid>.service).",
        choices=("detach", "systemd"),
    )
    reap_stale_samplers: bool = setting(
        True,
        "When a job's prolog finds one of its GPUs still claimed by another job's sampler (its "
        "epilog never reached it), stop and seal that sampler: gres GPUs are exclusive, so "
        "that job has ended. Set false where jobs share GPUs (gres/shard, MPS).",
    )


@dataclass(frozen=True)
class ShipSettings:
    """How ``slurm-gpu ship`` moves a node's sealed records to the collector."""

    transport: str = setting(
        "directory",
        "directory: copy into paths.inbox_dir (a shared filesystem); postgresql: insert into "
        "the store's inbox table (no shared filesystem; the store must be PostgreSQL).",
        choices=("directory", "postgresql"),
    )
    postgresql_dsn: str = setting(
        "",
        "libpq connection string of the node's inbox role (host=... dbname=... user=...); no "
        "password here: password_file, or peer/certificate authentication (sslcert=...).",
    )
    password_file: str = setting(
        "",
        "File holding the inbox role's password (root's, mode 0600 or 0400); empty: none "
        "(peer or certificate authentication).",
    )
    connect_timeout_s: int = setting(
        10, "Longest wait for the PostgreSQL server to answer a connection.", min=2, max=300
    )
    statement_timeout_s: float = setting(
        30.0, "Longest one INSERT may run (also bounds a silent network).", min=1, max=3600
    )
