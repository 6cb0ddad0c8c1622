"""Settings of the per-job web page (``slurm-gpu web``, ``docs/web.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class WebSettings:
    """The per-job web page and the links to it."""

    base_url: str = setting(
        "",
        "Address of the job pages (https://ondemand.example.org/pun/sys/slurm-gpu); the "
        "e-mail and gpueff link to <base_url>/job/<id>; empty: no link.",
    )
