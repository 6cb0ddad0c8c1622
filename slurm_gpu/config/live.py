"""Settings of running jobs: the exporter, the live view and the live policy."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class LiveSettings:
    """Running jobs: the node exporter and ``slurm-gpu live`` (``docs/live.md``)."""

    exporter_address: str = setting(
        "127.0.0.1",
        "Address slurm-gpu exporter listens on; the node's management address for a "
        "Prometheus on another host.",
    )
    exporter_port: int = setting(9817, "Port slurm-gpu exporter listens on.", min=1, max=65535)
    exporter_allowed_users: tuple[str, ...] = setting(
        ["prometheus"],
        "Accounts besides root whose connections from any of this host's addresses the "
        "exporter serves (the local Prometheus); other local users get 403.",
    )
    exporter_textfile_group: str = setting(
        "",
        "Group that may read the file `slurm-gpu exporter --textfile` writes (the account "
        "node_exporter runs as; Debian: prometheus): mode 0640 with that group; empty: 0600, "
        "root's alone.",
    )
    stale_after_s: float = setting(
        180.0,
        "A live summary whose last reading is older than this is left out, seconds.",
        min=10,
    )
    prometheus_url: str = setting(
        "",
        "Prometheus' base URL (http://host:9090) that slurm-gpu live asks; empty: read this "
        "node's live files instead.",
    )
    prometheus_password_file: str = setting(
        "",
        "File holding the password of the user named in prometheus_url (http://user@host:9090) "
        "for a Prometheus that asks for one (HTTP basic authentication): root's, 0600; "
        "empty: none, or the password in the URL when this file is root's alone.",
    )
    prometheus_timeout_s: float = setting(
        10.0, "Timeout of one Prometheus query, seconds.", min=1, max=300
    )
    idle_min_s: float = setting(
        900.0,
        "A GPU idle for at least this long is listed as idle by slurm-gpu live, seconds.",
        min=0,
    )
    police_grace_s: float = setting(
        1800.0, "slurm-gpu police leaves a job alone this long after it starts, seconds.", min=0
    )
    police_idle_s: float = setting(
        3600.0,
        "slurm-gpu police warns when a GPU is idle (or never used) this long, seconds.",
        min=60,
    )
    police_max_sample_age_s: float = setting(
        120.0,
        "slurm-gpu police judges a job only if every node's last reading is this recent, seconds.",
        min=10,
    )
    police_target_label: str = setting(
        "instance",
        "Label Prometheus' scrape target sets (never the exporter: honor_labels off) whose host "
        "must be the series' host label; slurm-gpu police ignores series where it is not.",
    )
    police_scrape_job: str = setting(
        "slurm-gpu",
        "Prometheus job name of the exporters' scrape; series of another job are ignored by "
        "slurm-gpu police (empty: any).",
    )
    police_bind_gpus: str = setting(
        "index",
        "index: slurm-gpu police acts on a job only where the GPU numbers its series name on a "
        "node (gpu_index) are the GPU indices Slurm allocated it there; count: only as many "
        "(for MIG slices, or gres.conf files not in /dev/nvidiaN order).",
        choices=("index", "count"),
    )
    police_coverage_min: float = setting(
        0.9,
        "slurm-gpu police judges a GPU only if readings cover this share of its job's time.",
        min=0.5,
        max=1.0,
    )
    police_user_interval_s: float = setting(
        3600.0, "At most one warning per user within this many seconds (others wait).", min=0
    )
    police_admin_emails: tuple[str, ...] = setting(
        [], "Addresses that get the digest of each pass that warned or cancelled."
    )
    police_dry_run: bool = setting(
        False, "Record what slurm-gpu police would do (would_warn, would_cancel); act on nothing."
    )
    police_cancel: bool = setting(False, "Let slurm-gpu police cancel jobs (off: warnings only).")
    police_cancel_after_warnings: int = setting(
        2, "Warnings a job gets before it may be cancelled.", min=1, max=100
    )
    police_cancel_grace_s: float = setting(
        1800.0, "Seconds after the last warning before a cancellation.", min=0
    )
    police_max_cancels_per_pass: int = setting(
        5, "Most jobs one pass of slurm-gpu police cancels.", min=0, max=10000
    )
    police_exempt_users: tuple[str, ...] = setting(
        [], "Users whose jobs are warned, never cancelled."
    )
    police_exempt_accounts: tuple[str, ...] = setting(
        [], "Accounts whose jobs are warned, never cancelled."
    )
    police_exempt_partitions: tuple[str, ...] = setting(
        [], "Partitions whose jobs are warned, never cancelled."
    )
    police_exempt_qos: tuple[str, ...] = setting([], "QOS whose jobs are warned, never cancelled.")
