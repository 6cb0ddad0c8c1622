"""What the prolog, the epilog and the sampler share: logging, the job's environment, the
wrapper script template and process checks.

Hooks log one line per event with the job id, to ``paths.log_file`` or, when that is empty or
cannot be opened, to syslog (and to nowhere if there is no syslog: a hook must never fail
because of its log).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import re
import socket
from dataclasses import dataclass

from slurm_gpu.capture.spoolpaths import process_start_ticks, read_small

LOGGER_NAME = "slurm_gpu"
_SAFE = re.compile(r"[^A-Za-z0-9_.,:+-]")


def safe(value: str | None, limit: int = 64) -> str:
    """A user- or environment-controlled string made safe for one log line."""
    if value is None:
        return "-"
    return _SAFE.sub("?", value)[:limit] or "-"


def setup_logging(log_file: str, tag: str, job_id: str | None) -> logging.Logger:
    """Configure the ``slurm_gpu`` logger for one hook or sampler process and return it.

    Lines look like ``2026-11-21T10:00:00 node1 slurm-gpu-prolog[123]: job=42 message``.
    """
    logger = logging.getLogger(LOGGER_NAME)
    for h in list(logger.handlers):
        logger.removeHandler(h)
        with contextlib.suppress(Exception):
            h.close()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    host = safe(socket.gethostname().split(".")[0])
    job = safe(job_id)
    handler: logging.Handler | None = None
    if log_file:
        try:
            directory = os.path.dirname(log_file)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=0o750, exist_ok=True)
            fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            os.close(fd)
            # Watched: a sampler lives as long as its job and must follow logrotate renames.
            handler = logging.handlers.WatchedFileHandler(log_file, encoding="utf-8")
            fmt = f"%(asctime)s {host} slurm-gpu-{tag}[%(process)d]: job={job} %(message)s"
            handler.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%dT%H:%M:%S%z"))
        except OSError:
            handler = None
    if handler is None:
        try:
            handler = logging.handlers.SysLogHandler(address="/dev/log")
            handler.setFormatter(
                logging.Formatter(f"slurm-gpu-{tag}[%(process)d]: job={job} %(message)s")
            )
        except OSError:
            handler = logging.NullHandler()
    logger.addHandler(handler)
    return logger


@dataclass(frozen=True, slots=True)
class JobEnv:
    """What Slurm tells a prolog or epilog about the job (see slurm.conf(5), Prolog)."""

    job_id: str | None
    uid: int | None
    user: str | None
    job_gpus: str | None
    cuda_visible_devices: str | None
    cpus_on_node: int | None
    node_name: str | None = None
    """``SLURMD_NODENAME``: the node's name in Slurm, which the spool files are named after."""
    account: str | None = None
    """``SLURM_JOB_ACCOUNT``: the job's account (live view labels)."""
    partition: str | None = None
    """``SLURM_JOB_PARTITION``: the job's partition (live view labels)."""
    sluid: str | None = None
    """``SLURM_JOB_SLUID`` (Slurm 25.11+): the job's unique id, which names its cgroup v2
    directory on 26.05+ unless ``CgroupJobIdPaths=yes``; only when it has a SLUID's form."""
    end_time_s: int | None = None
    """``SLURM_JOB_END_TIME`` where Slurm gives it: the job's projected end (its time limit),
    seconds since the epoch; bounds the sampler's life (``hooks.sampler``)."""

    comment: str | None = None
    """``SLURM_JOB_COMMENT`` (the user's ``--comment``): read only for the stack-sampling
    opt-in token (``docs/stacks.md``), never logged or stored."""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | os._Environ[str]) -> JobEnv:
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
        uid_text = environ.get("SLURM_JOB_UID", "")
        cpus = None
        for key in ("SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE"):
            m = re.match(r"^\s*(\d+)", environ.get(key, ""))
            if m:
                cpus = int(m.group(1))
                break
        return cls(
            job_id=job_id if job_id and job_id.isdigit() else None,
            uid=int(uid_text) if uid_text.isdigit() else None,
            user=environ.get("SLURM_JOB_USER"),
            job_gpus=environ.get("SLURM_JOB_GPUS"),
            cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
            cpus_on_node=cpus,
            node_name=environ.get("SLURMD_NODENAME") or None,
            account=environ.get("SLURM_JOB_ACCOUNT") or None,
            partition=environ.get("SLURM_JOB_PARTITION") or None,
            sluid=check_sluid(environ.get("SLURM_JOB_SLUID")),
            end_time_s=_epoch(environ.get("SLURM_JOB_END_TIME")),
            comment=environ.get("SLURM_JOB_COMMENT") or None,
        )

    def spool_hostname(self) -> str:
        """The name this node's spool files carry: Slurm's node name, else the host name."""
        name = self.node_name
        if name and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and ".." not in name:
            return name
        return short_hostname()


def _epoch(text: str | None) -> int | None:
    """A positive count of seconds since the epoch, else ``None``."""
    if text is None or not re.fullmatch(r"[0-9]{1,12}", text):
        return None
    return int(text) or None


_SLUID = re.compile(r"s[0-9A-Z]{13}")


def check_sluid(text: str | None) -> str | None:
    """``text`` when it has the form of a Slurm SLUID (``s`` and 13 Crockford base-32 digits,
    e.g. ``sBR1JB8J1YM400``), else ``None``: it becomes a directory name the sampler looks up,
    so nothing else (a path, a pattern) may pass."""
    return text if text is not None and _SLUID.fullmatch(text) else None


def short_hostname() -> str:
    """This node's name as the spool uses it (first label of the host name)."""
    return socket.gethostname().split(".")[0]


def read_cmdline(pid: int, proc_root: str = "/proc") -> list[str]:
    """The argv of ``pid`` (its first 64 KiB); empty when gone or unreadable."""
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(65536)
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``T``, ``Z``…); ``None`` when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    end = text.rfind(b")")
    parts = text[end + 2 :].split()
    return parts[0].decode() if parts else None


def is_alive(pid: int) -> bool:
    """Running or stopped, not gone and not a zombie awaiting its reaper."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def job_stepd_running(job_id: str, proc_root: str = "/proc") -> bool:
    """Whether a slurmstepd of ``job_id`` runs on this node: a root-owned process named
    ``slurmstepd`` whose command line is ``slurmstepd: [<id>.<step>]`` (a user cannot give
    a root process a name). Every step of a running job, the extern and batch steps included,
    has one. Lists /proc once: for the rare case of a GPU still claimed by another job."""
    return bool(job_stepds(job_id, proc_root, first_only=True))


def job_stepds(
    job_id: str, proc_root: str = "/proc", *, first_only: bool = False, owner_uid: int = 0
) -> dict[int, int]:
    """The slurmstepds of ``job_id`` running on this node (as ``job_stepd_running`` tells
    them, owned by ``owner_uid``): pid -> start time in clock ticks, which with the pid names
    the process even after the pid is reused. Lists /proc once; each entry costs one small
    read of its ``comm`` (by ``os.read``, no file object), the rare slurmstepd two more."""
    prefixes = (f"slurmstepd: [{job_id}.".encode(), f"slurmstepd: [{job_id}]".encode())
    try:
        names = os.listdir(proc_root)
    except OSError:
        return {}
    found: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        path = f"{proc_root}/{name}"
        comm = read_small(f"{path}/comm", 64)
        if comm is None or comm.rstrip(b"\n") != b"slurmstepd":
            continue
        try:
            if os.stat(path).st_uid != owner_uid:
                continue
        except OSError:
            continue
        cmdline = read_small(f"{path}/cmdline", 4096)
        start = process_start_ticks(int(name), proc_root)
        if cmdline is None or not cmdline.startswith(prefixes) or start is None:
            continue
        found[int(name)] = start
        if first_only:
            break
    return found


def job_cgroup_populated(job_id: str, cgroup_root: str = "/sys/fs/cgroup") -> bool:
    """Whether the job's cgroup v2 directory (root-owned) holds a process."""
    from slurm_gpu.capture.hostsample import find_cgroup2_dir

    found = find_cgroup2_dir(cgroup_root, job_id)
    if found is None:
        return False
    try:
        with open(os.path.join(found, "cgroup.events"), "rb") as fh:
            return b"populated 1" in fh.read(4096)
    except OSError:
        return False


def job_still_running(job_id: str) -> bool:
    """Whether ``job_id`` still runs on this node (its slurmstepd, or a populated cgroup)."""
    return job_stepd_running(job_id) or job_cgroup_populated(job_id)


# --------------------------------------------------------------------------- wrapper scripts

WRAPPER_TEMPLATE = """#!/bin/sh
# slurm-gpu @HOOK@ for Slurm (slurm.conf: @SLURMCONF@=<this file>).
# Rendered by `slurm-gpu hooks install`, which fills in the interpreter, the configuration file
# and the time limit below.
# Slurm drains the node when a prolog or epilog exits non-zero, so this script always exits 0.
# The Python side logs every failure with the job id and keeps within hooks.hook_timeout_s;
# timeout(1) is the backstop if the interpreter itself hangs.
# Python runs as root, so nothing of the caller may reach it: the working directory is /
# (a daemonised slurmd may sit in /var/tmp, and `python -m` imports from the working
# directory), -I ignores PYTHON* variables and the user's site directory, and the environment
# is rebuilt from Slurm's SLURM_* variables and CUDA_VISIBLE_DEVICES only (the sampler this
# starts inherits it). The configuration is read only if root owns it (slurm_gpu.trust).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
cd / || exit 0
set --
for name in $(env | sed -n -e 's/^\\(SLURM[A-Za-z0-9_]*\\)=.*/\\1/p' \\
    -e 's/^\\(CUDA_VISIBLE_DEVICES\\)=.*/\\1/p'); do
    # Names only match [A-Za-z0-9_], so eval expands nothing else; a line of a multi-line
    # value that looks like a name is passed only if such a variable is really set.
    eval "[ \\"\\${$name+set}\\" = set ] && set -- \\"\\$@\\" \\"$name=\\${$name}\\""
done
# SLURM_GPU_CONFIG comes last: env(1) keeps the last of two assignments.
/usr/bin/timeout -k 2 @TIMEOUT_S@ /usr/bin/env -i "$@" PATH="$PATH" SLURM_GPU_CONFIG='@CONFIG@' \\
    '@PYTHON@' -I -m slurm_gpu.hooks @HOOK@ </dev/null >/dev/null 2>&1
exit 0
"""


def wrapper_template(hook: str) -> str:
    """The wrapper script of ``hook`` (``prolog`` or ``epilog``) with the install-time
    placeholders ``@PYTHON@``, ``@CONFIG@`` and ``@TIMEOUT_S@`` still in it."""
    if hook not in ("prolog", "epilog"):
        raise ValueError(hook)
    return WRAPPER_TEMPLATE.replace("@HOOK@", hook).replace("@SLURMCONF@", hook.capitalize())


def render_wrapper(template: str, *, python: str, config: str, timeout_s: float) -> str:
    """Fill the placeholders. Paths are put in single quotes, so they must not hold one."""
    for name, value in (("python", python), ("config", config)):
        if "'" in value or "\n" in value:
            raise ValueError(f"{name} path must not contain a quote or newline: {value!r}")
    return (
        template.replace("@PYTHON@", python)
        .replace("@CONFIG@", config)
        .replace("@TIMEOUT_S@", str(max(1, int(timeout_s + 0.999))))
    )
