"""The sampler process: ``python -I -m slurm_gpu.hooks.sampler --job-id ID --gpus UUID,UUID
[--uid N] [--cores N] [--user=U] [--account=A] [--partition=P] [--config F]``, started by the
prolog (or a systemd unit) as root.

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
from collections.abc import Sequence

from slurm_gpu.capture.sampler import Sampler, SamplerOptions, _signal_waiter
from slurm_gpu.capture.spool import write_pidfile
from slurm_gpu.telemetry.base import TelemetrySource

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
    p.add_argument("--hostname", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -I -m slurm_gpu.hooks.sampler``; returns the exit status."""
    # Block the stop signals first, so a SIGTERM that comes while starting is not fatal: it is
    # picked up by the first wait and the record is still sealed.
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
    host = AutoHostSampler(job_id, args.uid, sluid=check_sluid(args.sluid))
    sampler = Sampler(opts, factory, host)
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
