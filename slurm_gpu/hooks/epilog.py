"""Epilog: stop the job's sampler and make sure a sealed record exists.

Runs as root from slurmd after the job. The normal path is SIGTERM and a short wait: the
sampler seals the record itself from the aggregates it holds. When the sampler is gone, hung or
fails to seal, the epilog kills it and recovers the record from the last checkpoint plus the
spool lines written after it (bounded by ``telemetry.checkpoint_interval_s``), marked
``complete=False`` with a note saying why.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from slurm_gpu.capture.spoolpaths import JobSpool, owner_file, process_start_ticks, read_pidfile
from slurm_gpu.hooks.common import JobEnv, is_alive, read_cmdline

if TYPE_CHECKING:
    from slurm_gpu.config import Settings

# The normal path (stop the sampler, which seals) imports neither the records, the
# aggregator nor the spool codecs: slurmd waits for the epilog before the node takes the next
# job. ``recover_record`` imports them when a record must be rebuilt.

log = logging.getLogger("slurm_gpu.hooks.epilog")

POLL_S = 0.01
#: Longest single wait on the sampler's pidfd before looking at /proc again.
PIDFD_WAIT_S = 0.1
#: What the sampler's command line holds (``slurm_gpu.hooks.sampler.CMDLINE_MARKER``, not imported
#: here to keep the epilog's imports small; a unit test checks they agree).
CMDLINE_MARKER = "slurm_gpu.hooks.sampler"
#: Samplers started by a release before the capture package ran as ``-m slurm_gpu.sampler``:
#: an epilog after an upgrade still stops them.
LEGACY_CMDLINE_MARKERS = ("slurm_gpu.sampler",)


def is_our_sampler(
    pid: int, start_ticks: int | None, job_id: str, hostname: str | None = None
) -> bool:
    """Whether ``pid`` still is this job's sampler (pids get reused): same start time as
    recorded, and a command line naming the sampler and this job id (and, with
    ``hostname``, this node: see ``_names_job_sampler``)."""
    if start_ticks is not None and process_start_ticks(pid) != start_ticks:
        return False
    return _names_job_sampler(read_cmdline(pid), job_id, hostname)


def find_job_samplers(
    job_id: str, hostname: str | None = None, proc_root: str = "/proc"
) -> list[tuple[int, int | None]]:
    """Every running sampler of ``job_id`` on this node, oldest first, as (pid, start
    ticks): root's processes whose command line names the sampler and ``--job-id <job_id>``
    (and, with ``hostname``, this node name).
    A repeated prolog once left one that no pid file named; the epilog stops them all. Lists
    /proc once (a few ms); only root-owned processes have their command line read."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    me = os.getpid()
    found: list[tuple[int, int | None]] = []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat(f"{proc_root}/{name}").st_uid != 0:
                continue
        except OSError:
            continue
        if _names_job_sampler(read_cmdline(pid, proc_root), job_id, hostname):
            found.append((pid, process_start_ticks(pid, proc_root)))
    found.sort(key=lambda s: (s[1] is None, s[1] or 0, s[0]))
    return found


def _names_job_sampler(argv: list[str], job_id: str, hostname: str | None = None) -> bool:
    """Whether ``argv`` is a sampler of ``job_id``; with ``hostname``, of that node name too.
    Several slurmd on one host (``--enable-multiple-slurmd``, the version lab) share one
    /proc, and a job on two of them has a sampler per node name there: each node's hooks
    keep to their own. A sampler whose command line names no node (started by an older
    release) is taken for this node's."""
    markers = (CMDLINE_MARKER, *LEGACY_CMDLINE_MARKERS)
    if not any(m in a for a in argv for m in markers):
        return False
    pairs = list(itertools.pairwise(argv))
    if not any(a == "--job-id" and b == job_id for a, b in pairs):
        return False
    if hostname is None:
        return True
    named = [b for a, b in pairs if a == "--hostname"]
    return not named or named[-1] == hostname


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone already, or a kernel before 5.3
        return None


def wait_gone(pid: int, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait until ``pid`` has exited (or is a zombie); True if it did within ``timeout_s``.

    A pidfd wakes the wait the moment the process exits (no poll interval added to every
    epilog); without one, /proc is polled every few milliseconds.
    """
    deadline = clock() + timeout_s
    fd = _pidfd(pid)
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while is_alive(pid):
                left = deadline - clock()
                if left <= 0:
                    return False
                poller.poll(max(1, int(min(left, PIDFD_WAIT_S) * 1000)))
            return True
        finally:
            os.close(fd)
    delay = POLL_S / 4
    while is_alive(pid):
        if clock() >= deadline:
            return False
        time.sleep(delay)
        delay = min(POLL_S, delay * 2)
    return True


def stop_sampler(
    paths: JobSpool,
    timeout_s: float,
    find: Callable[[str, str], list[tuple[int, int | None]]] = find_job_samplers,
) -> str:
    """Stop every sampler of the job: the one the pid file names (else the oldest found)
    with SIGTERM, so that it seals, and any other (a repeated prolog's) with SIGKILL first,
    so that only one writes the record. Returns ``stopped``, ``killed``, ``not_running`` or
    ``no_pidfile`` (of the sampler asked to seal)."""
    found = read_pidfile(paths.pid)
    job, host = paths.job_id, paths.hostname
    primary = found if found is not None and is_our_sampler(*found, job, host) else None
    others = [s for s in find(job, host) if primary is None or s[0] != primary[0]]
    if primary is None and others:
        primary, others = others[0], others[1:]
    for pid, start in others:
        if is_our_sampler(pid, start, job, host):
            log.warning("another sampler %d of this job (a repeated prolog); killed", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid, _start in others:
        wait_gone(pid, 1.0)
    if primary is None:
        return "no_pidfile" if found is None else "not_running"
    pid, start = primary
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not_running"
    if wait_gone(pid, timeout_s):
        return "stopped"
    if is_our_sampler(pid, start, job, host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 1.0)
    return "killed"


def _owned_gpus(paths: JobSpool, field: str = "gpus") -> list[str]:
    """The job's GPU UUIDs (``gpus``) or ownership keys (``keys``, see
    ``GpuResolution.owner_keys``; the UUIDs for a file written before keys existed)."""
    try:
        with open(os.path.join(paths.job_dir, f"{paths.hostname}.owner.json"), "rb") as fh:
            body = json.load(fh)
        return [str(u) for u in body.get(field, body["gpus"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def recover_record(paths: JobSpool, settings: Settings, reason: str) -> str:
    """Seal a record (``complete=False``) from the checkpoint and the spool tail after it.

    Without a usable checkpoint the whole spool is folded; without a spool an empty record
    naming the job's GPUs is sealed, so an allocated-but-unobserved GPU still reaches the
    collector. Returns what was done.
    """
    from slurm_gpu.capture.aggregate import NodeAggregator
    from slurm_gpu.capture.spool import iter_readings, read_header, read_state, write_record
    from slurm_gpu.errors import SpoolFormatError
    from slurm_gpu.records import GpuInfo

    notes = [reason, "recovered"]
    agg: NodeAggregator | None = None
    offset = 0
    try:
        state, offset, state_notes = read_state(paths.state)
        agg = NodeAggregator.from_state(state)
        notes += state_notes
    except SpoolFormatError as exc:
        if os.path.exists(paths.state):
            log.warning("checkpoint unusable, folding the whole spool: %s", exc)
            notes.append("checkpoint_corrupt")
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("checkpoint unusable, folding the whole spool: %s", exc)
        notes.append("checkpoint_corrupt")
        agg = None
    folded = 0
    try:
        header, first = read_header(paths.jsonl)
        if agg is None:
            agg = NodeAggregator(
                job_id=header.job_id,
                hostname=header.hostname,
                uid=header.uid,
                interval_s=header.interval_s,
                source=header.source,
                gpus=header.gpus,
                started_s=header.started_s,
                idle_threshold_pct=settings.telemetry.idle_threshold_pct,
                timeline_points=settings.telemetry.timeline_points,
            )
            offset = first
        for reading, _end in iter_readings(paths.jsonl, header, max(offset, first)):
            if reading is None:
                notes.append("spool_truncated")
                break
            agg.add(reading.time_s, reading.gpus, reading.host)
            folded += 1
    except SpoolFormatError as exc:
        if agg is None:
            log.warning("no usable spool: %s", exc)
        else:
            notes.append("spool_unreadable")
    except OSError as exc:
        log.warning("spool tail unreadable: %s", exc)
        notes.append("spool_unreadable")
    now = time.time()
    if agg is None:
        uuids = _owned_gpus(paths)
        if not uuids:
            return "nothing to seal (no checkpoint, spool or GPU list)"
        agg = NodeAggregator(
            job_id=paths.job_id,
            hostname=paths.hostname,
            uid=None,
            interval_s=settings.telemetry.interval_s,
            source=settings.telemetry.backend,
            gpus=[GpuInfo(uuid=u) for u in uuids],
            started_s=now,
        )
        notes.append("no_samples")
    write_record(paths.record, agg.record(ended_s=now, complete=False, notes=notes))
    return f"record recovered ({agg.readings} readings, {folded} from the spool tail)"


def cleanup(paths: JobSpool) -> None:
    """Remove the pid file, the live summary and this job's GPU ownership entries."""
    with contextlib.suppress(OSError):
        os.unlink(paths.pid)
    paths.remove_live()
    for uuid in _owned_gpus(paths, "keys"):
        path = owner_file(paths.spool_dir, uuid)
        try:
            with open(path, "rb") as fh:
                owner = json.load(fh)
            if str(owner.get("job_id")) == paths.job_id:
                os.unlink(path)
        except (OSError, ValueError, AttributeError):
            continue


def run_epilog(settings: Settings, env: JobEnv) -> str:
    """Do the epilog's work; returns a one-line outcome for the log. Raises on failure (the
    caller logs and exits 0)."""
    if env.job_id is None:
        return "no SLURM_JOB_ID; nothing to do"
    paths = JobSpool(settings.paths.spool_dir, env.job_id, env.spool_hostname())
    if not os.path.isdir(paths.job_dir):
        return "no spool for this job on this node (no GPU); nothing to do"
    return stop_and_seal(paths, settings)


def stop_and_seal(paths: JobSpool, settings: Settings) -> str:
    """Stop the job's sampler and make sure its record is sealed (by the sampler, else
    recovered); then release its pid file and GPU ownership. Returns what was done. Used by
    the epilog and by a later prolog that finds the job's sampler still holding a GPU."""
    try:
        stopped = stop_sampler(paths, settings.hooks.sampler_stop_timeout_s)
        if stopped == "stopped" and os.path.exists(paths.record):
            return "sampler stopped; record sealed by the sampler"
        if os.path.exists(paths.record):
            return f"sampler {stopped}; record already sealed"
        reason = {
            "stopped": "sampler_did_not_seal",
            "killed": "sampler_killed",
            "not_running": "sampler_not_running",
            "no_pidfile": "sampler_not_started",
        }[stopped]
        log.warning("sampler %s; recovering the record", stopped.replace("_", " "))
        return f"sampler {stopped}; " + recover_record(paths, settings, reason)
    finally:
        cleanup(paths)
