"""Settings of what people read: gpueff, the e-mail after a job and the weekly report."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class GpueffSettings:
    """The ``gpueff`` command users run."""

    min_elapsed_s: float = setting(
        30.0, "Jobs shorter than this get 'too short for a GPU reading', not numbers.", min=0
    )
    template_dir: str = setting(
        "", "Directory whose templates override templates/gpueff, file by file; empty: none."
    )
    cache_reports: bool = setting(
        True,
        "The collector renders each stored job's report so that gpueff prints it from one read "
        "(SQLite stores; used while the templates, these settings and the release are unchanged).",
    )
    reports_dir: str = setting(
        "",
        "Where the collector writes each user's rendered reports (<uid>/<job>.report, readable "
        "by that user alone) for gpueff; empty: <state_dir>-reports.",
    )


@dataclass(frozen=True)
class MailSettings:
    """The e-mail after each job (``slurm-gpu mail``, Slurm's MailProg)."""

    fallback_mailprog: str = setting(
        "/usr/bin/mail", "Mail program run, with the same arguments, for every other mail."
    )
    state_dir: str = setting(
        "/var/lib/slurm-gpu-mail",
        "The mail program's own state (mail-state.db, mail-drain.lock): a directory of "
        "SlurmUser's, mode 0700, never paths.state_dir (root's alone).",
    )
    transport: str = setting("smtp", "How messages leave.", choices=("smtp", "sendmail"))
    smtp_host: str = setting("localhost", "SMTP server.")
    smtp_port: int = setting(25, "SMTP port.", min=1, max=65535)
    smtp_starttls: bool = setting(
        False, "Upgrade the SMTP connection with STARTTLS (certificate and host name verified)."
    )
    smtp_ca_file: str = setting(
        "", "PEM file of the CA(s) that sign the SMTP server's certificate; empty: the system's."
    )
    smtp_user: str = setting(
        "", "SMTP login; empty: none. Without smtp_starttls the password travels in clear."
    )
    smtp_password_file: str = setting(
        "", "File holding the SMTP password, readable by SlurmUser only (not world-readable)."
    )
    smtp_timeout_s: float = setting(30.0, "SMTP connection timeout, seconds.", min=1, max=600)
    sendmail_path: str = setting("/usr/sbin/sendmail", "Local sendmail (transport = sendmail).")
    from_address: str = setting("slurm-gpu@localhost", "From: address of every message.")
    recipient_domain: str = setting(
        "", "Domain added to a bare user name (--mail-user alice, or none given)."
    )
    docs_url: str = setting("", "Site page on GPU jobs, linked from every message; empty: none.")
    template_dir: str = setting(
        "", "Directory whose templates override templates/mail, file by file; empty: none."
    )
    charts: bool = setting(True, "Attach utilization charts as inline PNG images.")
    wait_for_record_s: float = setting(
        120.0, "Longest wait for the job's stored record before mailing without it.", min=0
    )
    poll_interval_s: float = setting(3.0, "Seconds between two looks for the record.", min=0.1)
    max_pending: int = setting(
        10000,
        "Most END/FAIL mails waiting for their record at once; more go out plain at once.",
        min=1,
    )
    digest_window_s: float = setting(
        3600.0,
        "Array tasks and bursts of one user within this window share one digest.",
        min=0,
    )
    max_per_user_per_window: int = setting(
        3, "Single messages per user per window before the rest go into a digest.", min=1
    )
    waste_policy: bool = setting(
        False, "Mail users whose job wasted GPU-hours even without --mail-type."
    )
    waste_min_gpu_hours: float = setting(
        4.0, "Idle GPU-hours of one job that trigger the policy mail.", min=0
    )
    waste_period_s: float = setting(
        7 * 86400.0, "At most one policy mail per user per this period.", min=0
    )
    opt_out_file: str = setting(
        "", "File with one user name per line who never get policy mails; empty: none."
    )


@dataclass(frozen=True)
class ReportSettings:
    """The weekly admin report (``slurm-gpu report weekly``)."""

    site_name: str = setting("slurm-gpu", "Site or cluster name in the report's title.")
    admin_emails: tuple[str, ...] = setting([], "Addresses that get the weekly report with --mail.")
    trend_weeks: int = setting(8, "Weeks shown in the trend section.", min=1, max=104)
    top_n: int = setting(10, "Rows in the top users and top accounts tables.", min=1, max=1000)
    worst_jobs_per_user: int = setting(5, "Worst jobs listed per top user.", min=1, max=100)
    table_rows: int = setting(
        25, "Most rows of the never-used GPU and idle head/tail tables.", min=1, max=10000
    )
    idle_edge_min_s: float = setting(
        600.0, "Idle head or tail of at least this many seconds lists a job.", min=0
    )
    template_dir: str = setting(
        "", "Directory whose templates override templates/report, file by file; empty: none."
    )
    output_group: str = setting(
        "",
        "Group that may read the files written with --out (mode 0640); empty: only their "
        "owner (mode 0600).",
    )
