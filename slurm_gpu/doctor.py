"""``slurm-gpu doctor``: checks an installation, one independent check at a time.

Each check returns a ``Check`` and never raises: a broken piece is reported with a hint, and
the other checks still run. Dependencies (telemetry source, accounting, store, disk usage) are
injected by the CLI, so the checks are testable with fakes at the seams.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.config import Settings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.telemetry.base import TelemetrySource


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check: a one-line detail, and a hint when it is not OK."""

    name: str
    status: Status
    detail: str
    hint: str | None = None


#: Below this much free space in the spool, readings of long jobs may be lost (the sampler
#: writes ~0.5 KB per reading per node at 8 GPUs, so 100 MiB holds ~2 days of one 8-GPU job).
MIN_SPOOL_FREE_BYTES = 100 * 1024 * 1024


def check_telemetry(open_source: Callable[[], TelemetrySource]) -> Check:
    """The GPUs the configured source sees, and whether each answers one reading."""
    try:
        source = open_source()
        try:
            gpus = list(source.list_gpus())
            samples = list(source.sample([g.uuid for g in gpus])) if gpus else []
        finally:
            source.close()
    except SlurmGpuError as err:
        return Check("telemetry", Status.FAIL, err.message, err.hint)
    if not gpus:
        return Check(
            "telemetry",
            Status.WARN,
            "no GPU found on this node",
            "fine on a login or collector host; on a GPU node check the driver",
        )
    lost = [s.uuid for s in samples if not s.available]
    names = sorted({g.name or "unknown model" for g in gpus})
    detail = f"{len(gpus)} GPU(s): {', '.join(names)}"
    if lost:
        return Check(
            "telemetry",
            Status.FAIL,
            f"{detail}; not answering: {', '.join(lost)}",
            "check `nvidia-smi` and the kernel log for XID errors",
        )
    return Check("telemetry", Status.OK, detail)


def check_spool(
    settings: Settings, disk_free: Callable[[str], int] = lambda p: shutil.disk_usage(p).free
) -> Check:
    """The spool directory exists, is root-owned, not writable by others, and has space."""
    path = settings.paths.spool_dir
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Check(
            "spool",
            Status.WARN,
            f"{path} does not exist yet",
            "the prolog creates it on the first GPU job; or mkdir -m 0711 it now",
        )
    except OSError as exc:
        return Check("spool", Status.FAIL, f"{path}: {exc.strerror}")
    problems = []
    if st.st_uid != 0:
        problems.append(f"owned by uid {st.st_uid}, not root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if problems:
        return Check(
            "spool",
            Status.FAIL,
            f"{path}: " + "; ".join(problems),
            f"chown root:root {path} && chmod 0711 {path}",
        )
    free = disk_free(path)
    if free < MIN_SPOOL_FREE_BYTES:
        return Check(
            "spool",
            Status.WARN,
            f"{path}: only {free // 2**20} MiB free",
            "long jobs may lose readings; free space or move paths.spool_dir",
        )
    return Check("spool", Status.OK, f"{path}: {free // 2**30} GiB free")


def check_log(settings: Settings) -> Check:
    """The hook log's directory exists and is writable (by whoever runs this check)."""
    path = settings.paths.log_file
    if not path:
        return Check("log", Status.OK, "hooks log to syslog")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return Check(
            "log",
            Status.WARN,
            f"{directory} does not exist",
            "the hooks fall back to syslog until it is created",
        )
    if not os.access(directory, os.W_OK):
        return Check(
            "log",
            Status.WARN,
            f"{directory} is not writable by this user",
            "the hooks run as root; run doctor as root to check this for real",
        )
    return Check("log", Status.OK, path)


def check_accounting(
    open_accounting: Callable[[], AccountingSource], now_s: Callable[[], float] = time.time
) -> Check:
    """Slurm accounting answers a query for the last minute."""
    try:
        jobs = open_accounting().jobs_between(now_s() - 60, now_s())
    except SlurmGpuError as err:
        return Check("accounting", Status.FAIL, err.message, err.hint)
    return Check("accounting", Status.OK, f"answers ({len(jobs)} job(s) in the last minute)")


def check_store(open_info: Callable[[], tuple[str, int, int]]) -> Check:
    """The store opens and its schema is current. ``open_info`` gives (url, version, latest)."""
    try:
        url, version, latest = open_info()
    except SlurmGpuError as err:
        return Check("store", Status.FAIL, err.message, err.hint)
    if version < latest:
        return Check(
            "store",
            Status.WARN,
            f"{url}: schema {version}, this release needs {latest}",
            "run `slurm-gpu store migrate` (the collector also migrates)",
        )
    return Check("store", Status.OK, f"{url}: schema {version}")


def run_checks(checks: list[Callable[[], Check]]) -> list[Check]:
    """Run each check; an unexpected exception becomes a FAIL, never a crash."""
    results = []
    for check in checks:
        try:
            results.append(check())
        except Exception as exc:  # a doctor must report, not die
            name = getattr(check, "__name__", "check")
            results.append(
                Check(
                    name,
                    Status.FAIL,
                    f"{type(exc).__name__}: {exc}",
                    "run with --debug and report it",
                )
            )
    return results
