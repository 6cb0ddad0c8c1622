"""Who is looking, and which jobs they may see: ``gpueff``'s visibility, on the server.

Two deployments (``[web] identity``, ``docs/web.md``):

- **As the user** (``process``, Open OnDemand): the page runs under the viewer's own account,
  so accounting (``sacct``) answers as that user and Slurm's ``PrivateData`` decides, exactly
  as for ``gpueff``. Nothing else is checked here.
- **As a service** (``remote_user`` or ``header``): one account serves every viewer, named by
  the front server (``REMOTE_USER``) or by a header from a trusted proxy. Accounting then
  answers as the service, so the page applies Slurm's rule itself (``may_see``): a viewer sees
  their own jobs, every job when jobs are not private or when they are root, SlurmUser or a
  Slurm operator or administrator, and the jobs of the accounts they coordinate. The rule's
  facts come from Slurm (``store.visibility.read_visibility``), as the PostgreSQL store's
  row-level security does.

A job the viewer may not see is answered 404, like a job that does not exist, never 403.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_gpu.config.web import IDENTITY_HEADER, IDENTITY_PROCESS, IDENTITY_REMOTE_USER
from slurm_gpu.store.visibility import Visibility

#: A user name as Slurm and POSIX take it; anything else in a header is refused.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")
_NAME_MAX = 64


@dataclass(frozen=True, slots=True)
class Viewer:
    """The authenticated viewer."""

    user: str
    trusted_by_slurm: bool
    """``True`` when accounting already answers as this user (the page runs as them)."""


def clean_name(raw: Any) -> str | None:
    """``raw`` when it is a plausible user name (``alice``, ``alice@EXAMPLE.ORG`` as the part
    before ``@``), else ``None``."""
    if not isinstance(raw, str) or not raw or len(raw) > _NAME_MAX:
        return None
    if not set(raw) <= _NAME_CHARS or raw.startswith(("-", ".")):
        return None
    # Kerberos principals from the front server: the user is the part before the realm.
    return raw.split("@", 1)[0] or None


def process_user() -> str:
    """The account this process runs as."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def viewer_of(
    environ: Mapping[str, Any],
    identity: str,
    *,
    user_header: str,
    trusted_proxies: frozenset[str],
) -> Viewer | None:
    """The viewer of one request (a WSGI ``environ``); ``None`` when not authenticated."""
    if identity == IDENTITY_PROCESS:
        return Viewer(process_user(), trusted_by_slurm=True)
    if identity == IDENTITY_REMOTE_USER:
        name = clean_name(environ.get("REMOTE_USER"))
        return Viewer(name, trusted_by_slurm=False) if name else None
    if identity == IDENTITY_HEADER:
        if environ.get("REMOTE_ADDR") not in trusted_proxies:
            return None
        key = "HTTP_" + user_header.upper().replace("-", "_")
        name = clean_name(environ.get(key))
        return Viewer(name, trusted_by_slurm=False) if name else None
    return None


def may_see(vis: Visibility, viewer: str, job_user: str, job_account: str | None) -> bool:
    """Slurm's rule: whether ``viewer`` may see a job of ``job_user`` in ``job_account``."""
    if viewer == job_user or not vis.private_jobs or viewer in vis.admins:
        return True
    return job_account is not None and job_account in vis.coordinated.get(viewer, frozenset())
