"""``slurm-gpu doctor``: checks an installation, one independent check at a time.

Each check returns a ``Check`` and never raises: a broken piece is reported with a hint, and
the other checks still run. Dependencies (telemetry source, accounting, store, disk usage) are
injected by the CLI, so the checks are testable with fakes at the seams.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import slurm_gpu
from slurm_gpu.accounting.base import AccountingSource
from slurm_gpu.config import Settings
from slurm_gpu.errors import SlurmGpuError, StoreDeniedError, StoreNotCreatedError
from slurm_gpu.prometheus.client import Sample
from slurm_gpu.prometheus.windows import same_host, target_host
from slurm_gpu.telemetry.base import TelemetrySource
from slurm_gpu.textsafe import has_password, without_password
from slurm_gpu.trust import UntrustedPathError, open_trusted_dir, untrusted, untrusted_reason


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

#: The hint of a check this account cannot make.
RUN_AS_ROOT = "closed to this account; run doctor as root to check this for real"


#: The spool root's mode: root's alone, not even traversable by others.
SPOOL_ROOT_MODE = 0o700


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
    """The spool directory exists, is root-owned, not writable by others, mode 0700 (warned
    otherwise), and has space."""
    path = settings.paths.spool_dir
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Check(
            "spool",
            Status.WARN,
            f"{path} does not exist yet",
            f"the prolog creates it on the first GPU job; or mkdir -m 0700 {path} now",
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
            f"chown root:root {path} && chmod 0700 {path}",
        )
    if stat.S_IMODE(st.st_mode) != SPOOL_ROOT_MODE:
        return Check(
            "spool",
            Status.WARN,
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o}: other accounts can look inside",
            f"chmod {SPOOL_ROOT_MODE:04o} {path} (only root reads the spool)",
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
    except StoreNotCreatedError as err:
        # A fresh install before the first collection, like a spool not made yet.
        return Check("store", Status.WARN, err.message, err.hint)
    except StoreDeniedError as err:
        if os.geteuid() != 0:  # closed to this account, as it should be: not checked
            return Check("store", Status.WARN, err.message, RUN_AS_ROOT)
        return Check("store", Status.FAIL, err.message, err.hint)
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


def dir_untrusted_reason(path: str) -> str | None:
    """Why another account could change what is in directory ``path``, or None.

    The directory must be a real directory (not a symbolic link), owned by root or the caller
    and not writable by group or others; every directory traversed to reach it the same,
    except that a sticky one (``/tmp``) may be writable when the entry below it is root's or
    the caller's. The rule of ``slurm_gpu.trust`` for files, applied to a directory, on the
    path as configured (never its ``realpath``).
    """
    found = _dir_untrusted(path)
    return None if found is None else found.reason


def _dir_untrusted(path: str) -> UntrustedPathError | None:
    """``dir_untrusted_reason``'s verdict, with whether the walk was refused a look."""
    try:
        fd = open_trusted_dir(path, final_link=False)
    except UntrustedPathError as exc:
        return exc
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return UntrustedPathError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        )
    return None


def _not_for_this_account(exc: UntrustedPathError) -> bool:
    """Whether ``exc`` only says that this account, not root, may not look: root's code reads
    the path, and its being closed to an ordinary user is no fault of it."""
    return exc.denied and os.geteuid() != 0


def check_config(path: str | None, store_url: str = "", prometheus_url: str = "") -> Check:
    """The configuration file is one privileged code will read (``slurm_gpu.trust``), and
    holds no password that every user can read: users' tools (``gpueff``) read the file, so a
    password in ``store_url`` there would be the collector's credential handed to them, and
    one in ``prometheus_url`` the site's Prometheus account."""
    if path is None:
        return Check("config", Status.OK, "no file: every setting is a default")
    reason = untrusted_reason(path)
    if reason is not None:
        return Check(
            "config",
            Status.FAIL,
            f"{path}: not trusted: {reason}; the hooks, sampler, collector and ship refuse it",
            f"chown root {path} && chmod go-w {path} and each directory above it",
        )
    try:
        others_read = bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        others_read = False
    if others_read and has_password(store_url):
        return Check(
            "config",
            Status.FAIL,
            f"{path}: store.url holds a password ({without_password(store_url)}) in a file "
            "every user can read",
            "connect the collector by peer or GSSAPI authentication (docs/store.md), or give "
            "its password in root's ~/.pgpass, and remove it from store.url",
        )
    if others_read and has_password(prometheus_url):
        return Check(
            "config",
            Status.FAIL,
            f"{path}: live.prometheus_url holds a password ({without_password(prometheus_url)}) "
            "in a file every user can read",
            "put the password in a root-owned file of mode 0600 named by "
            "live.prometheus_password_file, and keep only the user in the URL "
            "(http://user@host:9090)",
        )
    return Check("config", Status.OK, f"{path}: owned by root, not writable by others")


def check_code(python: str = sys.executable, package_file: str = slurm_gpu.__file__ or "") -> Check:
    """The interpreter and the installed package that root runs cannot be changed by another
    account (a venv in a user's home would run that user's code as root)."""
    problems: list[str] = []
    unchecked: list[str] = []
    for what, path in (("interpreter", python), ("package", package_file)):
        found = untrusted(path) if path else UntrustedPathError(f"{what} path unknown")
        if found is not None:
            (unchecked if _not_for_this_account(found) else problems).append(
                f"{what}: {found.reason}"
            )
    if problems:
        return Check(
            "code",
            Status.FAIL,
            "; ".join(problems),
            "install slurm-gpu in a root-owned virtual environment (e.g. /opt/slurm-gpu)",
        )
    if unchecked:
        return Check("code", Status.WARN, "; ".join(unchecked), RUN_AS_ROOT)
    return Check("code", Status.OK, f"{python} and {os.path.dirname(package_file)}")


def check_state_dir(settings: Settings) -> Check:
    """The collector's state directory is root's alone: not writable by another account (such
    as SlurmUser, which runs the mail program) and not the mail program's state directory."""
    path = settings.paths.state_dir
    mail_dir = getattr(settings.mail, "state_dir", "")
    shared = isinstance(mail_dir, str) and bool(mail_dir)
    if shared and os.path.realpath(mail_dir) == os.path.realpath(path):
        return Check(
            "state",
            Status.FAIL,
            f"mail.state_dir is paths.state_dir ({path}): the collector (root) and the "
            "mail program (SlurmUser) share it",
            "give the mail program a directory of its own (mail.state_dir)",
        )
    if not os.path.lexists(path):
        return Check(
            "state",
            Status.WARN,
            f"{path} does not exist yet",
            f"the collector creates it; or mkdir -m 0700 {path} now",
        )
    found = _dir_untrusted(path)
    if found is not None and _not_for_this_account(found):
        return Check("state", Status.WARN, f"{path}: {found.reason}", RUN_AS_ROOT)
    if found is not None:
        return Check(
            "state",
            Status.FAIL,
            f"{path}: {found.reason}; another account could redirect what the collector writes",
            f"chown root:root {path} && chmod 0700 {path}",
        )
    return Check("state", Status.OK, f"{path}: root's alone")


def check_backend(
    settings: Settings, has_nvidia: Callable[[], bool] = lambda: os.path.exists("/dev/nvidiactl")
) -> Check:
    """Telemetry comes from the GPUs (``nvml``); the virtual backend is for test setups."""
    backend = settings.telemetry.backend
    if backend != "virtual":
        return Check("backend", Status.OK, f"telemetry from {backend}")
    vdir = settings.telemetry.virtual_dir
    if has_nvidia():
        return Check(
            "backend",
            Status.FAIL,
            f"virtual GPUs ({vdir}) on a host with NVIDIA GPUs: its jobs' telemetry is simulated",
            'set telemetry.backend = "nvml"',
        )
    writable = dir_untrusted_reason(vdir) if os.path.lexists(vdir) else None
    detail = f"virtual GPUs ({vdir}): telemetry is simulated, for tests and demos only"
    if writable:
        detail += f"; {writable}, so others can write the readings"
    return Check("backend", Status.WARN, detail, 'on a real cluster set telemetry.backend = "nvml"')


def sampler_limits(settings: Settings) -> dict[str, int]:
    """The resource limits the ``detach`` launcher applies to the sampler (``[hooks]``
    ``sampler_memory_max_bytes``, bytes, and ``sampler_open_files_max``), those set (> 0)."""
    hooks = settings.hooks
    found = {
        "hooks.sampler_memory_max_bytes": hooks.sampler_memory_max_bytes,
        "hooks.sampler_open_files_max": hooks.sampler_open_files_max,
    }
    return {k: v for k, v in found.items() if v > 0}


def check_launcher(settings: Settings) -> Check:
    """A detached sampler runs as root with the configured limits; without a memory limit, a
    bug or a hostile job's /proc could make it take the node's memory."""
    launcher = settings.hooks.sampler_launcher
    limits = sampler_limits(settings)
    if launcher == "detach" and "hooks.sampler_memory_max_bytes" not in limits:
        return Check(
            "launcher",
            Status.WARN,
            "the sampler is started detached with no memory limit",
            "set hooks.sampler_memory_max_bytes (default 256 MiB), or use sampler_launcher = "
            '"systemd" with share/systemd/slurm-gpu-sampler@.service',
        )
    if launcher == "systemd":
        return Check("launcher", Status.OK, "systemd: the unit's MemoryMax, CPUQuota, TasksMax")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(limits.items()))
    return Check("launcher", Status.OK, f"{launcher}: {shown}")


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


# ----------------------------------------------------------------- who can read whose data


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def check_visibility(
    settings: Settings,
    read_private_data: Callable[[], frozenset[str] | None],
    rls_missing: Callable[[], list[str]] | None = None,
) -> Check:
    """Whether the site's settings let an ordinary user read other users' stored data.

    ``read_private_data`` gives Slurm's ``PrivateData`` flags (``None``: Slurm could not be
    asked, checked as if ``jobs`` were set). SQLite: the store file and the state directory
    must not be readable by others, and with ``PrivateData=jobs`` users need the report files
    (``[gpueff] cache_reports``, a reports directory 0711). PostgreSQL: ``rls_missing`` gives
    the store's tables without forced row-level security."""
    from slurm_gpu.jobreport.reportfiles import ROOT_MODE, reports_root
    from slurm_gpu.store.urls import sqlite_path

    flags = read_private_data()
    private = flags is None or "jobs" in flags
    policy = (
        "PrivateData unknown (scontrol failed)"
        if flags is None
        else f"PrivateData={','.join(sorted(flags)) or 'none'}"
    )
    path = sqlite_path(settings.store_url)
    if path is None:
        if rls_missing is None:
            return Check("visibility", Status.WARN, f"{policy}; store rows not checked")
        missing = rls_missing()
        if missing and private:
            return Check(
                "visibility",
                Status.FAIL,
                f"{policy}, but PostgreSQL tables without row-level security: "
                f"{', '.join(missing)}; any role that may connect reads every user's jobs",
                "run `slurm-gpu store migrate` as the store's owner (it enables row-level "
                "security), then `slurm-gpu store sync-roles`; docs/store.md",
            )
        return Check("visibility", Status.OK, f"{policy}; PostgreSQL rows guarded by policies")
    problems: list[tuple[str, str]] = []
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return Check("visibility", Status.WARN, f"{path}: {exc.strerror}", "run doctor as root")
    group = settings.store.admin_group
    if st is not None and st.st_mode & stat.S_IROTH:
        problems.append(
            (
                f"{path} is readable by every user (mode {_mode(st)}): `sqlite3` shows them "
                "every job",
                f"chmod 0600 {path} (or set [store] admin_group; the collector narrows it "
                "at its next run)",
            )
        )
    elif st is not None and st.st_mode & stat.S_IRGRP and not group:
        problems.append(
            (
                f"{path} is readable by its group (gid {st.st_gid}, mode {_mode(st)})",
                "set [store] admin_group to the group meant to read it, or chmod 0600",
            )
        )
    state = settings.paths.state_dir
    try:
        dst = os.stat(state)
        if dst.st_mode & stat.S_IROTH:
            problems.append(
                (
                    f"{state} can be listed by every user (mode {_mode(dst)})",
                    f"chmod {'0750' if group else '0700'} {state}",
                )
            )
    except OSError:
        pass
    root = reports_root(state, settings.gpueff.reports_dir)
    try:
        rst = os.stat(root)
        if stat.S_IMODE(rst.st_mode) & ~ROOT_MODE:
            problems.append(
                (
                    f"{root} is mode {_mode(rst)}: users can list whose reports are there",
                    f"chmod 0711 {root}",
                )
            )
    except OSError:
        pass
    if not problems and private and not settings.gpueff.cache_reports:
        return Check(
            "visibility",
            Status.WARN,
            f"{policy}: the store is closed to users, and with [gpueff] cache_reports off no "
            "report files are written: users get a store error for their ended jobs",
            "set [gpueff] cache_reports = true",
        )
    if problems:
        status = Status.FAIL if private else Status.WARN
        what = "; ".join(p for p, _ in problems)
        return Check("visibility", status, f"{policy}: {what}", "; ".join(h for _, h in problems))
    return Check(
        "visibility", Status.OK, f"{policy}: store {path} root's (users read {root}/<uid>)"
    )


# ----------------------------------------------------------------- live data: who can query

#: Hosts a server listens on that mean "every interface".
ALL_INTERFACES = frozenset({"", "0.0.0.0", "::", "*"})
#: Loopback host names (besides 127.0.0.0/8).
LOOPBACK_HOSTS = frozenset({"::1", "localhost"})


def listen_host(address: str) -> str:
    """The host part of a listen address (``host:port``, ``[v6]:port``, ``:port`` or a bare
    host), without brackets."""
    address = address.strip()
    if address.startswith("["):
        return address[1 : address.find("]")] if "]" in address else address[1:]
    if address.count(":") == 1:
        return address.rsplit(":", 1)[0]
    return address  # a bare host, or a bare IPv6 address


def check_live_exposure(
    settings: Settings,
    read_private_data: Callable[[], frozenset[str] | None],
    prometheus_listen: Callable[[], str] | None = None,
) -> Check:
    """Whether the node exporter or Prometheus listens on every interface while Slurm hides
    jobs from other users (``PrivateData=jobs``): both serve every running job's user,
    account and numbers to anyone who can connect, with no authentication of their own.

    ``prometheus_listen`` gives Prometheus' ``--web.listen-address`` (from its
    ``/api/v1/status/flags``; raises ``SlurmGpuError`` when it cannot be asked); ``None``
    when ``[live] prometheus_url`` is empty."""
    flags = read_private_data()
    private = flags is None or "jobs" in flags
    policy = (
        "PrivateData unknown (scontrol failed)"
        if flags is None
        else f"PrivateData={','.join(sorted(flags)) or 'none'}"
    )
    live = settings.live
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    if listen_host(live.exporter_address) in ALL_INTERFACES:
        problems.append(
            (
                f"the exporter listens on every interface ([live] exporter_address = "
                f"{live.exporter_address!r}): anyone who reaches port {live.exporter_port} "
                "reads every running job of the node",
                "set [live] exporter_address to 127.0.0.1 (Prometheus on the node) or to the "
                "address of the scrape network only Prometheus reaches",
            )
        )
    warnings: list[tuple[str, str]] = []
    if prometheus_listen is not None:
        try:
            address = prometheus_listen()
        except SlurmGpuError as exc:
            warnings.append(
                (
                    f"Prometheus' listen address unknown ({exc})",
                    "check [live] prometheus_url and that Prometheus runs",
                )
            )
        else:
            host = listen_host(address)
            if host in ALL_INTERFACES:
                problems.append(
                    (
                        f"Prometheus listens on every interface (--web.listen-address="
                        f"{address}): any user who reaches it queries every running job",
                        "start Prometheus with --web.listen-address=127.0.0.1:9090 (or the "
                        "admin network's address) on a host users have no shell on; "
                        "docs/security.md",
                    )
                )
            elif private and (host in LOOPBACK_HOSTS or host.startswith("127.")):
                warnings.append(
                    (
                        f"Prometheus listens on loopback ({address}): every user with a shell "
                        "on its host can query every running job",
                        "keep the Prometheus host admin-only (no user logins): under "
                        "PrivateData=jobs users must not reach Prometheus; docs/security.md",
                    )
                )
            else:
                notes.append(f"Prometheus on {address}")
    if problems:
        status = Status.FAIL if private else Status.WARN
        what = "; ".join(p for p, _ in problems + warnings)
        hint = "; ".join(h for _, h in problems + warnings)
        return Check("live", status, f"{policy}: {what}", hint)
    if warnings:
        what = "; ".join(p for p, _ in warnings)
        return Check("live", Status.WARN, f"{policy}: {what}", "; ".join(h for _, h in warnings))
    detail = f"{policy}: exporter on {live.exporter_address}"
    return Check("live", Status.OK, "; ".join([detail, *notes]))


#: Where node_exporter's textfile collector is usually pointed (Debian's package; the
#: upstream examples): their ``*.prom`` files holding our series are checked.
TEXTFILE_DIRS = ("/var/lib/prometheus/node-exporter", "/var/lib/node_exporter/textfile_collector")
#: Bytes of a ``*.prom`` file read to tell whether it holds our series.
TEXTFILE_HEAD_BYTES = 4096


def exporter_textfiles(dirs: Iterable[str] = TEXTFILE_DIRS) -> list[str]:
    """The ``*.prom`` files of ``dirs`` that hold the exporter's series."""
    found = []
    for directory in dirs:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".prom"))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as fh:
                    if b"slurm_gpu_" in fh.read(TEXTFILE_HEAD_BYTES):
                        found.append(path)
            except OSError:
                continue
    return found


def check_exporter_local_users(
    settings: Settings,
    read_private_data: Callable[[], frozenset[str] | None],
    probe: Callable[[str, int], int | None] | None,
    targets: Iterable[str],
    textfiles: Iterable[str],
) -> Check:
    """Whether a user of this node can read the exporter's exposition (every running job's
    user, account and job id): the running exporter answering 200 to a local account that
    is not allowed, connecting to ``targets`` (the listen address, or this host's own
    addresses when it listens on every interface), or a textfile readable by every user.

    ``probe(host, port)`` is the HTTP status such an account gets (``None``: nothing
    answers); ``None`` when it cannot be run (not root)."""
    flags = read_private_data()
    private = flags is None or "jobs" in flags
    port = settings.live.exporter_port
    problems: list[str] = []
    notes: list[str] = []
    for host in targets:
        if probe is None:
            notes.append("not probed (needs root)")
            break
        status = probe(host, port)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if status == 200:
            problems.append(f"the exporter on {where} answers a local user who is not allowed")
        elif status is None:
            notes.append(f"nothing answers on {where}")
        else:
            notes.append(f"{where} answers a local user {status}")
    for path in textfiles:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            continue
        if mode & 0o004:
            problems.append(f"{path} is readable by every user (mode {mode:04o})")
        else:
            notes.append(f"{path} {mode:04o}")
    if problems:
        return Check(
            "exporter",
            Status.FAIL if private else Status.WARN,
            "; ".join(problems),
            "run this release's slurm-gpu exporter (it refuses local accounts not in [live] "
            "exporter_allowed_users on every address) and rewrite the textfile with "
            "`slurm-gpu exporter --textfile` (0600, or 0640 with --textfile-group); "
            "docs/security.md",
        )
    return Check("exporter", Status.OK, "; ".join(notes) or "no exporter answers, no textfile")


_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scrape_block(config_yaml: str, job_name: str) -> list[str] | None:
    """The lines of scrape job ``job_name`` in Prometheus' rendered configuration."""
    lines = config_yaml.splitlines()
    head = re.compile(r"^(\s*)- job_name:\s*['\"]?([^'\"\s]+)")
    for i, line in enumerate(lines):
        m = head.match(line)
        if m and m.group(2) == job_name:
            block = [line]
            for nxt in lines[i + 1 :]:
                n = head.match(nxt)
                if n and len(n.group(1)) <= len(m.group(1)):
                    break
                block.append(nxt)
            return block
    return None


def _promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def check_live_identity(
    read_config: Callable[[], str],
    query: Callable[[str], list[Sample]],
    scrape_job: str,
    target_label: str,
    bind_gpus: str = "index",
) -> Check:
    """Whether Prometheus keeps the exporters' series bound to the node they came from, as
    ``slurm-gpu police`` needs (``docs/live.md``, "The policy's guarantees"): the exporters'
    scrape job has ``honor_labels`` off (else any target can claim any node and job), every
    last-sample series' ``host`` is the host of its ``target_label``, and (``bind_gpus`` =
    ``index``) every GPU series names its GPU's number (``gpu_index``: police finds every
    job of a host whose series carry none a ``mismatch``)."""
    if not _LABEL_NAME.match(target_label):
        return Check(
            "identity",
            Status.FAIL,
            f"[live] police_target_label {target_label!r} is not a label name",
            "set it to instance (or the target label the scrape config sets)",
        )
    problems: list[str] = []
    notes: list[str] = []
    try:
        block = _scrape_block(read_config(), scrape_job) if scrape_job else None
    except SlurmGpuError as exc:
        return Check("identity", Status.WARN, str(exc), "check [live] prometheus_url")
    if scrape_job and block is None:
        notes.append(f"Prometheus has no scrape job {scrape_job!r} ([live] police_scrape_job)")
    elif block is not None and any(re.match(r"^\s*honor_labels:\s*true", ln) for ln in block):
        problems.append(
            f"scrape job {scrape_job!r} has honor_labels: true: any target can claim any node "
            "and job, and slurm-gpu police cannot tell"
        )
    try:
        samples = query(
            f"count by (host, job, {target_label}) (slurm_gpu_job_last_sample_timestamp_seconds)"
        )
    except SlurmGpuError as exc:
        return Check("identity", Status.WARN, str(exc), "check [live] prometheus_url")
    wrong = sorted(
        {
            f"{s.labels.get('host', '?')} via {s.labels.get(target_label) or 'no ' + target_label}"
            for s in samples
            if not same_host(target_host(s.labels.get(target_label, "")), s.labels.get("host", ""))
        }
    )
    if wrong:
        problems.append(
            f"{len(wrong)} host(s) whose series do not come from a target of that host "
            f"(police ignores them): {', '.join(wrong[:5])}"
        )
    if bind_gpus == "index":
        job = f"job={_promql_string(scrape_job)}," if scrape_job else ""
        try:
            unnumbered = query(f'count by (host) (slurm_gpu_gpu_available{{{job}gpu_index=""}})')
        except SlurmGpuError as exc:
            return Check("identity", Status.WARN, str(exc), "check [live] prometheus_url")
        hosts = sorted({s.labels.get("host", "?") for s in unnumbered})
        if hosts:
            notes.append(
                f"{len(hosts)} host(s) whose GPU series carry no gpu_index (police finds their "
                f"jobs a mismatch and never acts on them): {', '.join(hosts[:5])}; upgrade "
                'their exporter, or for MIG slices set [live] police_bind_gpus = "count"'
            )
    if problems:
        return Check(
            "identity",
            Status.FAIL,
            "; ".join(problems + notes),
            "set honor_labels: false on the exporters' scrape job and [live] "
            "police_target_label to the label that names the node (share/prometheus/"
            "prometheus.example.yml)",
        )
    if notes:
        return Check(
            "identity",
            Status.WARN,
            "; ".join(notes),
            "check [live] police_scrape_job and the nodes' slurm-gpu exporter",
        )
    return Check(
        "identity",
        Status.OK,
        f"{len(samples)} host(s) bound to their targets by {target_label}; honor_labels off",
    )


def check_transport(
    settings: Settings, node_role_excess: Callable[[], list[str]] | None = None
) -> Check:
    """How records reach the collector (``[ship] transport``). PostgreSQL: the node's
    password file must be root's alone, the store must be PostgreSQL, and ``node_role_excess``
    (the collector's view, ``store.inbox.node_role_excess``) must find no inbox role allowed
    more than inserting records."""
    ship = settings.ship
    if ship.transport != "postgresql":
        where = settings.paths.inbox_dir or f"{settings.paths.spool_dir} (no inbox)"
        return Check("transport", Status.OK, f"directory: records reach the collector in {where}")
    problems: list[tuple[str, str]] = []
    if ship.password_file:
        reason = untrusted_reason(ship.password_file)
        try:
            st = os.stat(ship.password_file)
            if reason is None and st.st_mode & 0o077:
                reason = f"{ship.password_file} is mode {_mode(st)}: others may read it"
        except OSError as exc:
            reason = reason or f"{ship.password_file}: {exc.strerror}"
        if reason is not None:
            problems.append((reason, f"chown root and chmod 0600 {ship.password_file}"))
    collector_side = settings.store_url.startswith("postgresql")
    if not ship.postgresql_dsn and not collector_side:
        problems.append(
            (
                "ship.postgresql_dsn is empty and the store is not PostgreSQL",
                "on nodes set ship.postgresql_dsn; on the collector set [store] url to the "
                "PostgreSQL server the nodes push to",
            )
        )
    excess: list[str] = []
    if collector_side and node_role_excess is not None:
        try:
            excess = node_role_excess()
        except Exception as exc:  # StoreError, or the driver's: report, do not crash doctor
            return Check("transport", Status.WARN, f"inbox roles not checked: {exc}")
        if excess:
            problems.append(
                (
                    "node roles may do more than insert records: " + ", ".join(excess),
                    "revoke those privileges: a node's credential must only push records "
                    "(slurm-gpu store grant-node ROLE grants exactly that; docs/transport.md)",
                )
            )
    if problems:
        return Check(
            "transport",
            Status.FAIL,
            "postgresql: " + "; ".join(p for p, _ in problems),
            "; ".join(h for _, h in problems),
        )
    side = "inbox roles insert-only" if collector_side else "node pushes records"
    return Check("transport", Status.OK, f"postgresql: {side}")


# ----------------------------------------------------------------- a site's Prometheus series


@dataclass(frozen=True, slots=True)
class SeriesNeeds:
    """The metric names one Prometheus source reads, and the label that names the node."""

    source: str
    node_label: str
    required: tuple[str, ...]
    """Without these a node reads as missing."""
    optional: tuple[str, ...]
    """Read where present (left unknown otherwise)."""


def series_needs(source: str) -> SeriesNeeds:
    """The needs of the Prometheus source ``source`` (``dcgm-exporter``, ``jobstats``,
    ``slurm-exporter``); ``KeyError`` for another name."""
    from slurm_gpu.sources import prometheus_dcgm, prometheus_exporter, prometheus_jobstats

    if source == prometheus_dcgm.NAME:
        req = prometheus_dcgm.REQUIRED
        return SeriesNeeds(
            source, "Hostname", req, tuple(n for n in prometheus_dcgm.FIELDS if n not in req)
        )
    if source == prometheus_jobstats.NAME:
        req = prometheus_jobstats.REQUIRED
        every = (*prometheus_jobstats.GPU_FIELDS, *prometheus_jobstats.HOST_FIELDS)
        return SeriesNeeds(source, "instance", req, tuple(n for n in every if n not in req))
    if source == prometheus_exporter.NAME:
        req = prometheus_exporter.REQUIRED
        every = (*prometheus_exporter.GPU_FIELDS, *prometheus_exporter.HOST_FIELDS)
        return SeriesNeeds(source, "host", req, tuple(n for n in every if n not in req))
    raise KeyError(source)


def check_prometheus_series(query: Callable[[str], list[Sample]], needs: SeriesNeeds) -> Check:
    """Which of ``needs``' series the site's Prometheus holds now, per node: one instant
    query ``count by (<node label>) (<metric>)`` per metric name (``query`` raises
    ``SlurmGpuError`` when Prometheus is unreachable).
    FAIL when no node has the required series, WARN when some node lacks one (that node's
    jobs read as missing there) or lacks an optional one (left unknown), else OK."""
    from slurm_gpu.sources.prometheus_common import short_host

    name = f"prometheus:{needs.source}"
    has: dict[str, set[str]] = {}
    try:
        for metric in (*needs.required, *needs.optional):
            rows = query(f"count by ({needs.node_label}) ({metric})")
            has[metric] = {short_host(r.labels.get(needs.node_label, "")) for r in rows} - {""}
    except SlurmGpuError as err:
        return Check(name, Status.FAIL, err.message, err.hint)
    nodes = set().union(*has.values()) if has else set()
    complete = {n for n in nodes if all(n in has[m] for m in needs.required)}
    if not complete:
        return Check(
            name,
            Status.FAIL,
            f"no node has {', '.join(needs.required)}",
            f"point the source at the Prometheus that scrapes {needs.source} "
            "(docs/install-prometheus.md)",
        )
    lacking = []
    for node in sorted(nodes):
        gone = [m for m in (*needs.required, *needs.optional) if node not in has[m]]
        if gone:
            lacking.append(f"{node} lacks {', '.join(gone)}")
    detail = f"{len(complete)} node(s) with every required series"
    if not lacking:
        return Check(name, Status.OK, f"{detail}, and every optional one")
    shown = "; ".join(lacking[:10]) + ("; ..." if len(lacking) > 10 else "")
    return Check(
        name,
        Status.WARN,
        f"{detail}; {shown}",
        "a missing required series makes the node missing for its jobs; an optional one "
        "leaves that signal unknown",
    )


def prometheus_checks(
    url: str, timeout_s: float, sources: Iterable[str], *, password_file: str = ""
) -> dict[str, Callable[[], Check]]:
    """``check_prometheus_series`` for each Prometheus source among ``sources`` (the names
    written in records: ``dcgm-exporter``, ``jobstats``, ``slurm-exporter``; others are
    skipped), keyed by check name, for ``slurm-gpu doctor`` to run with its other checks;
    ``password_file`` as ``PrometheusClient`` takes it."""
    from slurm_gpu.prometheus.client import PrometheusClient

    def one(needs: SeriesNeeds) -> Callable[[], Check]:
        def check() -> Check:
            try:
                client = PrometheusClient(url, timeout_s, password_file=password_file)
            except SlurmGpuError as err:
                return Check(f"prometheus:{needs.source}", Status.FAIL, err.message, err.hint)
            return check_prometheus_series(client.query, needs)

        return check

    out: dict[str, Callable[[], Check]] = {}
    for source in dict.fromkeys(sources):
        try:
            needs = series_needs(source)
        except KeyError:
            continue
        out[f"prometheus:{source}"] = one(needs)
    return out


# --------------------------------------------------------------------------- slurm.conf

#: The slurm.conf keys the install asks for (README "Install on a real cluster", docs/hooks.md,
#: docs/mail.md, share/slurm/): key -> (what slurm-gpu's value contains, required).
SLURM_CONF_KEYS: dict[str, tuple[str, bool]] = {
    "Prolog": ("slurm-gpu-prolog", True),
    "Epilog": ("slurm-gpu-epilog", True),
    "PrologFlags": ("alloc", True),
    "MailProg": ("slurm-gpu", False),
    "EpilogSlurmctld": ("epilog-slurmctld", False),
}


def slurm_conf_values(text: str) -> dict[str, str]:
    """``Key = value`` (``scontrol show config``) or ``Key=value`` (slurm.conf) lines as a
    mapping; comments and other lines are ignored, the last of a repeated key wins."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if sep and key and " " not in key:
            values[key] = value
    return values


def _names_hook(value: str, wanted: str) -> bool:
    """Whether a Prolog/Epilog value runs ``wanted``: named directly, or a file of the
    directory a glob names (``/etc/slurm/prolog.d/*``)."""
    if wanted in value:
        return True
    for part in value.split(","):
        part = part.strip()
        if "*" in part or "?" in part:
            import glob

            if any(wanted in os.path.basename(p) for p in glob.glob(part)):
                return True
    return False


def check_slurm_conf(text: str | None, source: str) -> Check:
    """The slurm.conf lines the install asks for: ``Prolog``/``Epilog`` running the hooks and
    ``PrologFlags=Alloc`` (fail without them: no job is sampled, or the sampler misses the
    job's start), and, said but optional, ``MailProg`` and ``EpilogSlurmctld``. ``text`` is
    ``scontrol show config``'s output or the file's text (``None``: neither could be read),
    ``source`` where it came from."""
    if text is None:
        return Check(
            "slurmconf",
            Status.WARN,
            f"cannot read Slurm's configuration ({source})",
            "run doctor where scontrol works, or set SLURM_CONF to slurm.conf's path",
        )
    values = slurm_conf_values(text)
    missing: list[str] = []
    said: list[str] = []
    for key, (wanted, required) in SLURM_CONF_KEYS.items():
        value = values.get(key, "")
        shown = value if value and value != "(null)" else "not set"
        if key == "PrologFlags":
            ok = wanted in {f.strip().lower() for f in value.split(",")}
        else:
            ok = _names_hook(value, wanted)
        if ok:
            said.append(f"{key} {shown}")
        elif required:
            missing.append(f"{key} is {shown}")
        else:
            said.append(f"{key} {shown} (optional: not slurm-gpu's)")
    if missing:
        return Check(
            "slurmconf",
            Status.FAIL,
            f"{source}: " + "; ".join(missing),
            "add the lines `slurm-gpu hooks install` prints to slurm.conf, then "
            "`scontrol reconfigure` (docs/hooks.md)",
        )
    return Check("slurmconf", Status.OK, f"{source}: " + "; ".join(said))
