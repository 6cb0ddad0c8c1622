"""Prolog: find the job's GPUs, prepare its spool directory, start its sampler detached.

Runs as root from slurmd before the job starts. A job with no GPU on this node gets no sampler
(and the telemetry library is not even loaded). The sampler is started in its own session with
no inherited descriptors, so slurmd does not wait for it and killing the prolog's process group
does not reach it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_gpu.capture.spool import JobSpool, read_pidfile, write_atomic, write_pidfile
from slurm_gpu.capture.spoolpaths import OWNERS_DIR, owner_file
from slurm_gpu.config import OPT_IN_TOKEN, Settings
from slurm_gpu.hooks.common import JobEnv, job_still_running, safe
from slurm_gpu.hooks.gpus import job_has_gpu_env, resolve_job_gpus
from slurm_gpu.hooks.jobcgroup import move_out_of_job

log = logging.getLogger("slurm_gpu.hooks.prolog")


def write_ownership(
    paths: JobSpool, env: JobEnv, uuids: Sequence[str], keys: Sequence[str] = ()
) -> None:
    """Record which job holds which GPU: per holding (``GpuResolution.owner_keys``: a GPU, or
    one MIG slice of it) under ``owners/`` and per job in the job dir."""
    keys = list(keys or uuids)
    body = json.dumps(
        {
            "job_id": paths.job_id,
            "uid": env.uid,
            "gpus": list(uuids),
            "keys": keys,
            "started_s": time.time(),
        }
    ).encode()
    write_atomic(os.path.join(paths.job_dir, f"{paths.hostname}.owner.json"), body)
    owners = os.path.join(paths.spool_dir, OWNERS_DIR)
    os.makedirs(owners, mode=0o700, exist_ok=True)
    for key in keys:
        write_atomic(owner_file(paths.spool_dir, key), body)


def reap_stale_owners(
    settings: Settings,
    spool_dir: str,
    hostname: str,
    job_id: str,
    keys: Sequence[str],
    *,
    still_running: Callable[[str], bool] = job_still_running,
) -> list[str]:
    """Stop and seal the samplers of other jobs that still claim one of ``keys`` (the
    holdings of ``GpuResolution.owner_keys``: a whole GPU, or one MIG slice of it).

    gres GPUs are given to one job at a time, so a GPU allocated to ``job_id`` that another
    job's sampler still claims means that job ended without its epilog reaching the sampler
    (a configuration changed mid-job, an epilog killed). Left alone, such a sampler would run
    and write forever. Ownership compares the full identity, so two MIG slices of one GPU are
    two holdings; and a job that ``still_running`` says runs (its slurmstepd is alive, or its
    cgroup holds a process) is never reaped, whatever its claim. Returns one line per job,
    for the log.
    """
    from slurm_gpu.hooks.epilog import stop_and_seal

    stale: set[str] = set()
    for uuid in keys:
        try:
            with open(owner_file(spool_dir, uuid), "rb") as fh:
                owner = str(json.load(fh)["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner != job_id and owner.isdigit():
            stale.add(owner)
    done = []
    for old in sorted(stale, key=int):
        old_paths = JobSpool(spool_dir, old, hostname)
        if not os.path.isdir(old_paths.job_dir):
            continue
        if still_running(old):
            done.append(f"job {old}: still running, left alone")
            continue
        done.append(f"job {old}: {stop_and_seal(old_paths, settings)}")
    return done


def keep_running_sampler(
    paths: JobSpool,
    find: Callable[[str, str], list[tuple[int, int | None]]] | None = None,
) -> str | None:
    """A prolog run again for the same job and node (a requeue on the same allocation, a
    slurmd retry) once started a second sampler and recorded it in place of the first, which
    no epilog then stopped: with the /proc method it ran as root for good, rewriting the ended
    job's live file. Now a sampler of this job that still runs (the pid file's, checked by
    start time and command line, else any found in /proc) is kept and named in the pid file,
    and any other is killed; returns the line for the log, or None when none runs."""
    from slurm_gpu.hooks.epilog import find_job_samplers, is_our_sampler

    found = read_pidfile(paths.pid)
    job, host = paths.job_id, paths.hostname
    keep = found if found is not None and is_our_sampler(*found, job, host) else None
    others = [s for s in (find or find_job_samplers)(job, host) if keep is None or s[0] != keep[0]]
    if keep is None and others:
        keep, others = others[0], others[1:]
    if keep is None:
        return None
    for pid, start in others:
        if is_our_sampler(pid, start, job, host):
            log.warning("another sampler %d of this job was running; killed", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if found is None or found[0] != keep[0]:
        write_pidfile(paths.pid, keep[0])
    return f"sampler {keep[0]} of this job already runs; kept (no second sampler)"


def stacks_wanted(settings: Settings, env: JobEnv) -> bool:
    """Whether the job's Python stacks are sampled (``docs/stacks.md``): its partition is in
    ``[stacks] partitions``, or in ``user_opt_in_partitions`` and its ``--comment`` holds
    ``slurm-gpu:stacks``. Off by default: both lists are empty."""
    st = settings.stacks
    part = env.partition or ""

    def listed(names: Sequence[str]) -> bool:
        return "*" in names or (bool(part) and part in names)

    if listed(st.partitions):
        return True
    return listed(st.user_opt_in_partitions) and OPT_IN_TOKEN in (env.comment or "")


def sampler_command(
    settings: Settings, env: JobEnv, uuids: Sequence[str], hostname: str
) -> list[str]:
    """The sampler's argv, with the absolute interpreter that runs this hook."""
    # -I: the sampler runs as root; nothing from the caller's cwd or environment may steer it.
    cmd = [sys.executable, "-I", "-m", "slurm_gpu.hooks.sampler", "--job-id", str(env.job_id)]
    cmd += ["--gpus", ",".join(uuids), "--hostname", hostname]
    if env.uid is not None:
        cmd += ["--uid", str(env.uid)]
    if env.sluid is not None:
        cmd += ["--sluid", env.sluid]
    if env.cpus_on_node:
        cmd += ["--cores", str(env.cpus_on_node)]
    if env.end_time_s is not None:
        cmd += ["--end-time", str(env.end_time_s)]
    # One argument each ("--opt=value"), so a value that begins with "-" stays a value.
    for opt, value in (("user", env.user), ("account", env.account), ("partition", env.partition)):
        if value:
            cmd.append(f"--{opt}={value}")
    if stacks_wanted(settings, env):
        cmd.append("--stacks")
    if settings.path:
        cmd += ["--config", settings.path]
    return cmd


def sampler_environment() -> dict[str, str]:
    """A clean environment: no SLURM_* variable, so the sampler is never taken for one of the
    job's processes, and a fixed PATH (Slurm gives hooks none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return env


@dataclass(frozen=True, slots=True)
class SamplerLimits:
    """Resource limits the ``detach`` launcher puts on the sampler (systemd sites set theirs
    in the unit). A sampler needs about 20 MB (13 MB of data, measured with virtual GPUs) and a
    few dozen descriptors; the limits stop a bug, or a job that makes the sampler's work grow,
    from taking the node with it."""

    nice: int = 10
    """Added to the sampler's nice value."""
    data_max_bytes: int = 0
    """``RLIMIT_DATA``: heap and private writable mappings, bytes (0: unlimited)."""
    open_files_max: int = 0
    """``RLIMIT_NOFILE`` (0: unchanged)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> SamplerLimits:
        h = settings.hooks
        return cls(h.sampler_nice, h.sampler_memory_max_bytes, h.sampler_open_files_max)

    def apply(self) -> None:
        """Apply to the calling process (the sampler's child before exec)."""
        if self.nice:
            os.nice(self.nice)
        if self.data_max_bytes:
            resource.setrlimit(resource.RLIMIT_DATA, (self.data_max_bytes, self.data_max_bytes))
        if self.open_files_max:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files_max, self.open_files_max))


def start_sampler(cmd: list[str], log_file: str, limits: SamplerLimits | int) -> int:
    """Start the sampler detached (new session, cwd /, stdio to /dev/null or the log, no other
    descriptors, niced and limited by ``limits``; a bare int is a nice value alone) and
    return its pid."""
    if isinstance(limits, int):
        limits = SamplerLimits(nice=limits)
    stderr = subprocess.DEVNULL
    log_fd = None
    if log_file:
        try:
            log_fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError:
            log_fd = None

    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_fd if log_fd is not None else stderr,
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=sampler_environment(),
            preexec_fn=limits.apply,  # runs in the child before exec
        )
    finally:
        if log_fd is not None:
            os.close(log_fd)
    # Never waited for: once this hook exits, init adopts and reaps it.
    proc.returncode = 0  # keep Popen.__del__ from warning about a running child
    return proc.pid


SYSTEMD_ENV_DIR = "/run/slurm-gpu"


def start_sampler_systemd(cmd: list[str], job_id: str) -> int | None:
    """Start ``slurm-gpu-sampler@<job>.service`` with the sampler's arguments in its
    environment file (see share/systemd). The unit's process writes its own pid file, so this
    returns ``None``."""
    args = cmd[cmd.index("slurm_gpu.hooks.sampler") + 1 :]
    os.makedirs(SYSTEMD_ENV_DIR, mode=0o700, exist_ok=True)
    env_line = "SAMPLER_ARGS=" + " ".join(args) + "\n"
    write_atomic(os.path.join(SYSTEMD_ENV_DIR, f"sampler-{job_id}.env"), env_line.encode())
    subprocess.run(
        ["/usr/bin/systemctl", "start", "--no-block", f"slurm-gpu-sampler@{job_id}.service"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=10,
        check=True,
    )
    return None


def run_prolog(settings: Settings, env: JobEnv) -> str:
    """Do the prolog's work; returns a one-line outcome for the log. Raises on failure (the
    caller logs and exits 0)."""
    if env.job_id is None:
        return "no SLURM_JOB_ID; nothing to do"
    if not job_has_gpu_env(env.job_gpus, env.cuda_visible_devices):
        return "no GPU allocated on this node; no sampler"
    from slurm_gpu.telemetry import open_source

    source = open_source(settings)
    try:
        gpus = list(source.list_gpus())
    finally:
        source.close()
    resolution = resolve_job_gpus(env.job_gpus, env.cuda_visible_devices, gpus)
    if resolution.unresolved:
        log.warning(
            "GPU ids not matched to a device: %s (SLURM_JOB_GPUS=%s CUDA_VISIBLE_DEVICES=%s)",
            safe(",".join(resolution.unresolved), 200),
            safe(env.job_gpus, 100),
            safe(env.cuda_visible_devices, 300),
        )
    if not resolution.uuids:
        return "no GPU of this job found among the node's GPUs; no sampler"
    hostname = env.spool_hostname()
    paths = JobSpool(settings.paths.spool_dir, env.job_id, hostname)
    paths.create_dir()
    kept = keep_running_sampler(paths)
    if kept is not None:
        return kept
    if settings.hooks.reap_stale_samplers:
        for line in reap_stale_owners(
            settings, settings.paths.spool_dir, hostname, env.job_id, resolution.owner_keys
        ):
            if line.endswith("left alone"):
                log.warning("GPU claimed by another job that still runs: %s", line)
            else:
                log.warning("GPU still claimed by an ended job; reaped its sampler: %s", line)
    write_ownership(paths, env, resolution.uuids, resolution.owner_keys)
    cmd = sampler_command(settings, env, resolution.uuids, hostname)
    what = f"{len(resolution.uuids)} GPU(s) {','.join(resolution.uuids)}"
    if settings.hooks.sampler_launcher == "systemd":
        start_sampler_systemd(cmd, env.job_id)
        return f"sampler unit slurm-gpu-sampler@{env.job_id} started for {what}"
    pid = start_sampler(cmd, settings.paths.log_file, SamplerLimits.from_settings(settings))
    # Out of the job's cgroup first: the pid file is what the epilog and readers take as a
    # settled sampler, so it must never name one still counted against the job.
    leave_job_cgroup(pid, env.job_id)
    write_pidfile(paths.pid, pid)
    return f"sampler {pid} started for {what}"


def leave_job_cgroup(pid: int, job_id: str) -> None:
    """PrologFlags=RunInJob runs this prolog inside the job's cgroup, and the sampler with it:
    move the sampler out (cgroup v1) or say that it stays in (cgroup v2). docs/hooks.md."""
    try:
        moved, failed = move_out_of_job(pid, job_id)
    except FileNotFoundError:  # the sampler already exited; its own log line says why
        return
    except OSError as exc:
        log.warning("cannot read the sampler's cgroups: %s", exc)
        return
    if moved:
        log.info(
            "the prolog runs in the job's cgroup (PrologFlags=RunInJob); sampler %d moved out "
            "of it (%s)",
            pid,
            ", ".join(moved),
        )
    if failed:
        log.warning(
            "the prolog runs in the job's cgroup (PrologFlags=RunInJob) and the sampler %d "
            "could not leave it (%s): it counts against the job's limits and ends with the "
            "job; remove RunInJob from PrologFlags (docs/hooks.md)",
            pid,
            "; ".join(failed),
        )
