"""Settings of the per-job web page (``slurm-gpu web``, ``docs/web.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting

#: The page runs as the user (Open OnDemand): accounting answers as that user.
IDENTITY_PROCESS = "process"
#: A front web server authenticated the user and set ``REMOTE_USER`` (mod_wsgi, uWSGI).
IDENTITY_REMOTE_USER = "remote_user"
#: A front proxy authenticated the user and names them in ``user_header``.
IDENTITY_HEADER = "header"


@dataclass(frozen=True)
class WebSettings:
    """The per-job web page and the links to it."""

    base_url: str = setting(
        "",
        "Address of the job pages (https://ondemand.example.org/pun/sys/slurm-gpu); the "
        "e-mail and gpueff link to <base_url>/job/<id>; empty: no link.",
    )
    identity: str = setting(
        IDENTITY_PROCESS,
        "Who the viewer is: the account the page runs as (Open OnDemand), the front server's "
        "REMOTE_USER, or the front proxy's user_header.",
        choices=(IDENTITY_PROCESS, IDENTITY_REMOTE_USER, IDENTITY_HEADER),
    )
    user_header: str = setting(
        "X-Forwarded-User", "Header naming the authenticated user (identity = header)."
    )
    trusted_proxies: tuple[str, ...] = setting(
        ["127.0.0.1", "::1"],
        "Addresses whose user_header is believed (identity = header); any other client is "
        "answered 401.",
    )
    grafana_url: str = setting(
        "",
        "Grafana's base URL; a running job's page links to its job dashboard "
        "(/d/slurm-gpu-job?var-job_id=<id>); empty: no link.",
    )
    recent_days: int = setting(14, "Days of jobs the recent jobs list covers.", min=1, max=366)
    recent_limit: int = setting(50, "Most jobs in the recent jobs list.", min=1, max=1000)
