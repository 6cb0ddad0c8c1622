"""The sampler process: ``python -I -m slurm_gpu.hooks.sampler --job-id ID --gpus UUID,UUID
[--uid N] [--cores N] [--user=U] [--account=A] [--partition=P] [--end-time T] [--config F]``,
started by the prolog (or a systemd unit) as root. Its life is bounded (``JobLifeBound``).

A composition root, like the prolog and the epilog: it reads the (trusted) configuration,
chooses the telemetry source and the host sampler, and runs ``capture.sampler.Sampler``. No
click: the sampler imports as little as possible to stay small.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slurm_gpu.capture.sampler import Sampler, SamplerOptions, _signal_waiter
from slurm_gpu.capture.spool import write_pidfile
from slurm_gpu.telemetry.base import TelemetrySource

if TYPE_CHECKING:
    from slurm_gpu.capture.hostsample import AutoHostSampler
    from slurm_gpu.capture.stacksampler import StackSampler
    from slurm_gpu.config import Settings

log = logging.getLogger("slurm_gpu.sampler")

#: Marker in the command line that the epilog checks before signalling a pid.
CMDLINE_MARKER = "slurm_gpu.hooks.sampler"
#: Longest user, account or partition name kept for the live view, characters.
LABEL_MAX_LEN = 128


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -I -m slurm_gpu.hooks.sampler",
        description="Sample one job's GPUs until SIGTERM.",
    )
    p.add_argument("--job-id", required=True)
    p.add_argument("--gpus", required=True, help="comma-separated GPU UUIDs")
    p.add_argument("--uid", type=int, default=None)
    p.add_argument("--sluid", default=None, help="the job's SLUID (its cgroup v2 name on 26.05+)")
    p.add_argument("--cores", type=int, default=None, help="cores allocated on this node")
    p.add_argument("--config", default=None, help="configuration file")
    p.add_argument("--user", default=None, help="the job's user name (live view)")
    p.add_argument("--account", default=None, help="the job's account (live view)")
    p.add_argument("--partition", default=None, help="the job's partition (live view)")
    p.add_argument(
        "--stacks", action="store_true", help="sample the job's Python stacks (docs/stacks.md)"
    )
    p.add_argument("--hostname", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--end-time", type=int, default=None, help="the job's projected end, epoch seconds"
    )
    return p.parse_args(argv)


#: Seconds past the job's projected end (``SLURM_JOB_END_TIME``) after which a sampler that
#: no epilog stopped takes its job for ended: Slurm's ``OverTimeLimit`` and a slow epilog fit
#: well within it.
END_MARGIN_S = 3600.0
#: Least seconds between two looks for the job's slurmstepd.
STEPD_CHECK_S = 60.0


class StepdWatch:
    """Whether a slurmstepd of the job runs (``JobLifeBound``'s default look): the job's
    slurmstepds once seen are remembered by pid and start time and looked at first, one
    ``/proc/<pid>/stat`` read each; /proc is listed (a small read per process of the node)
    only while none was seen or once every one seen has exited. The answer is the listing's:
    a remembered slurmstepd still running is one of the job's."""

    def __init__(self, proc_root: str = "/proc", *, owner_uid: int = 0) -> None:
        self.proc_root = proc_root
        self.owner_uid = owner_uid
        self.known: dict[int, int] = {}
        self.listings = 0
        """Times /proc was listed."""

    def __call__(self, job_id: str) -> bool:
        from slurm_gpu.capture.spoolpaths import process_start_ticks
        from slurm_gpu.hooks.common import job_stepds

        for pid, start in self.known.items():
            if process_start_ticks(pid, self.proc_root) == start:
                return True
        self.listings += 1
        self.known = job_stepds(job_id, self.proc_root, owner_uid=self.owner_uid)
        return bool(self.known)


class JobLifeBound:
    """The host sampler, whose ``job_gone`` also says when the job has ended by the signs a
    root process can trust, for a sampler no epilog stopped (a repeated prolog's, a lost
    epilog): every slurmstepd of the job seen running has exited (looked at once per
    ``STEPD_CHECK_S``), or the job's projected end plus ``END_MARGIN_S`` has passed. The
    sampler then seals after ``capture.sampler.ORPHAN_GRACE_S`` and exits, so none runs as
    root for good."""

    def __init__(
        self,
        host: Any,
        job_id: str,
        end_time_s: float | None,
        *,
        clock: Callable[[], float] = time.time,
        stepd_running: Callable[[str], bool] | None = None,
    ) -> None:
        self.host = host
        self.job_id = job_id
        self.end_time_s = end_time_s
        self._clock = clock
        self._stepd_running = stepd_running or StepdWatch()
        self._stepd_seen = False
        self._stepd_gone = False
        self._last_look = -1e18

    @property
    def method(self) -> str:
        return str(self.host.method)

    def sample(self, now_s: float | None = None) -> Any:
        return self.host.sample(now_s)

    def allocated_cores(self) -> int | None:
        return self.host.allocated_cores()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.host.close()

    def job_gone(self) -> bool:
        if self.host.job_gone():
            return True
        now = self._clock()
        if self.end_time_s is not None and now > self.end_time_s + END_MARGIN_S:
            return True
        if now - self._last_look >= STEPD_CHECK_S:
            self._last_look = now
            running = self._stepd_running(self.job_id)
            self._stepd_seen = self._stepd_seen or running
            self._stepd_gone = self._stepd_seen and not running
        return self._stepd_gone


def open_stacks(
    settings: Settings, uid: int | None, host: AutoHostSampler, started_s: float
) -> StackSampler | None:
    """Stack bursts for this job (``[stacks]``), or ``None`` (logged) when they cannot run
    safely: no job uid or root's, an untrusted reader, setpriv or class table."""
    from slurm_gpu.capture.stackclass import TableError, load_table
    from slurm_gpu.capture.stackread import default_reader_path
    from slurm_gpu.capture.stacksampler import StackOptions, StackSampler
    from slurm_gpu.trust import untrusted_reason

    st = settings.stacks
    if uid is None or uid == 0:
        log.warning("stack sampling off: the job's uid is %s", "unknown" if uid is None else 0)
        return None
    reader = st.py_spy_path or default_reader_path()
    for what, path in (
        ("py-spy", reader),
        ("setpriv", st.setpriv_path),
        ("classes", st.classes_path),
    ):
        reason = untrusted_reason(path) if path and (os.geteuid() == 0) else None
        if reason is not None:
            log.warning("stack sampling off: %s %s is not trusted: %s", what, path, reason)
            return None
    try:
        table = load_table(st.classes_path)
    except TableError as exc:
        log.warning("stack sampling off: %s", exc)
        return None
    opts = StackOptions(
        uid=uid,
        interval_s=st.interval_s,
        first_burst_s=st.first_burst_s,
        samples_per_burst=st.samples_per_burst,
        sample_spacing_s=st.sample_spacing_s,
        max_core_pct=st.max_core_pct,
        max_processes=st.max_processes,
        dump_timeout_s=st.dump_timeout_s,
        output_max_bytes=st.output_max_bytes,
        memory_max_bytes=st.memory_max_bytes,
        py_spy=reader,
        setpriv=st.setpriv_path,
        ptrace_capability=st.ptrace_capability,
        charge_to_job=st.charge_to_job,
    )
    return StackSampler(opts, table, host.cgroup_dir, started_s=started_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -I -m slurm_gpu.hooks.sampler``; returns the exit status."""
    # The stop signals' handlers first, so a SIGTERM that comes while starting is not fatal: it
    # is noted, the first wait returns at once and the record is still sealed.
    wait = _signal_waiter()
    args = parse_args(argv)
    from slurm_gpu.capture.hostsample import AutoHostSampler
    from slurm_gpu.capture.spool import check_job_id
    from slurm_gpu.config import load_settings  # noqa: TID251 (a composition root reads the config)
    from slurm_gpu.hooks.common import check_sluid, setup_logging
    from slurm_gpu.textsafe import clean_optional

    job_id = check_job_id(str(args.job_id))
    try:
        settings = load_settings(args.config, trusted=True)
    except Exception as exc:
        setup_logging("", "sampler", job_id)
        log.error("configuration unusable, sampler not started: %s", exc)
        return 1
    setup_logging(settings.paths.log_file, "sampler", job_id)
    hostname = args.hostname or socket.gethostname().split(".")[0]
    opts = SamplerOptions(
        job_id=job_id,
        hostname=hostname,
        uid=args.uid,
        gpu_uuids=tuple(u for u in args.gpus.split(",") if u),
        spool_dir=settings.paths.spool_dir,
        interval_s=settings.telemetry.interval_s,
        checkpoint_interval_s=settings.telemetry.checkpoint_interval_s,
        idle_threshold_pct=settings.telemetry.idle_threshold_pct,
        timeline_points=settings.telemetry.timeline_points,
        cores=args.cores,
        # Slurm's names, cleaned where they enter: they become the live view's labels.
        user=clean_optional(args.user, LABEL_MAX_LEN),
        account=clean_optional(args.account, LABEL_MAX_LEN),
        partition=clean_optional(args.partition, LABEL_MAX_LEN),
    )

    def factory() -> TelemetrySource:
        from slurm_gpu.telemetry import open_source

        return open_source(settings)

    t0 = time.monotonic()
    job_host = AutoHostSampler(job_id, args.uid, sluid=check_sluid(args.sluid))
    host = JobLifeBound(job_host, job_id, args.end_time)
    stacks = open_stacks(settings, args.uid, job_host, time.time()) if args.stacks else None
    sampler = Sampler(opts, factory, host, stacks=stacks)
    try:
        sampler.paths.create_dir()
        write_pidfile(sampler.paths.pid, os.getpid())
    except OSError as exc:
        log.warning("pid file not written: %s", exc)
    log.info(
        "sampler started: %d GPU(s), every %gs, host method probing",
        len(opts.gpu_uuids),
        opts.interval_s,
    )
    sealed = sampler.run(wait)
    log.info(
        "sampler stopped after %d readings in %.0fs; record %s",
        sampler.agg.readings,
        time.monotonic() - t0,
        "sealed" if sealed else "NOT sealed",
    )
    return 0 if sealed else 1


if __name__ == "__main__":
    status = main()
    # The epilog waits for this process to be gone: once the record is sealed and the log
    # flushed, skip the interpreter's teardown (module cleanup, a final collection).
    logging.shutdown()
    os._exit(status)
