"""``python -m slurm_gpu.demo PATTERN``: a demo workload for a Slurm job with virtual GPUs."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import click

from slurm_gpu.config import load_settings  # noqa: TID251 (a composition root reads the config)
from slurm_gpu.demo.gpus import job_gpu_minors, parse_index_list
from slurm_gpu.demo.patterns import PATTERNS, DemoParams, OutOfMemory, describe, run_pattern
from slurm_gpu.guard import run_guarded
from slurm_gpu.telemetry.virtual_device import VirtualGpuDevice

VIRTUAL_DIR_ENV = "SLURM_GPU_VIRTUAL_DIR"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # scancel and the time limit send SIGTERM: unwind so the GPUs are released cleanly.
    raise SystemExit(128 + signum)


def _log(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Patterns:\n\n" + describe().replace("\n", "\n\n"),
)
@click.argument("pattern", type=click.Choice(list(PATTERNS)))
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(min=0.1),
    default=45.0,
    show_default=True,
    help="Seconds of work.",
)
@click.option(
    "--tick",
    "tick_s",
    type=click.FloatRange(0.01, 5),
    default=0.2,
    show_default=True,
    help="Seconds between two updates of the GPUs.",
)
@click.option(
    "--util",
    type=click.FloatRange(0, 1),
    default=None,
    help="Duty cycle of the busy GPUs (0-1); default depends on the pattern.",
)
@click.option(
    "--noise",
    type=click.FloatRange(0, 1),
    default=0.03,
    show_default=True,
    help="Standard deviation of the per-tick duty jitter.",
)
@click.option(
    "--memory-frac",
    type=click.FloatRange(0, 1),
    default=None,
    help="Share of GPU memory held; default depends on the pattern.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=None,
    help="dataloader: CPU worker processes (default: the job's CPUs).",
)
@click.option(
    "--batch-cpu-s",
    type=click.FloatRange(min=0.001),
    default=0.5,
    show_default=True,
    help="dataloader: CPU seconds per batch.",
)
@click.option(
    "--gpu-burst-s",
    type=click.FloatRange(min=0.001),
    default=0.05,
    show_default=True,
    help="dataloader: GPU seconds per batch.",
)
@click.option(
    "--active-frac",
    type=click.FloatRange(0, 1),
    default=0.4,
    show_default=True,
    help="idle-tail: share of the duration spent working.",
)
@click.option("--fail-oom", is_flag=True, help="near-oom: end with an out-of-memory failure.")
@click.option(
    "--phase-busy-s",
    type=click.FloatRange(min=0.1),
    default=6.0,
    show_default=True,
    help="task-farm: seconds of GPU work before each post-processing phase.",
)
@click.option(
    "--phase-idle-s",
    type=click.FloatRange(min=0.0),
    default=5.0,
    show_default=True,
    help="task-farm: seconds of post-processing (GPU idle) after each work phase.",
)
@click.option(
    "--ranks",
    type=click.IntRange(1, 64),
    default=None,
    help="ranks-share-gpu: rank processes (default: one per GPU).",
)
@click.option(
    "--exit-code",
    type=click.IntRange(0, 255),
    default=0,
    show_default=True,
    help="Exit with this status after the work (task-farm: a task whose last stage failed).",
)
@click.option("--seed", type=int, default=None, help="Random seed, for reproducible traces.")
@click.option(
    "--gpus",
    "gpu_list",
    default=None,
    help="Minor numbers to drive (default: from SLURM_JOB_GPUS).",
)
@click.option(
    "--virtual-dir",
    default=None,
    help=f"Virtual GPU directory (default: ${VIRTUAL_DIR_ENV}, else the configured "
    "telemetry.virtual_dir).",
)
def main(
    pattern: str,
    gpu_list: str | None,
    virtual_dir: str | None,
    exit_code: int,
    **knobs: object,
) -> None:
    """Drive this job's virtual GPUs like a training job with PATTERN would drive real ones."""
    params = DemoParams(**knobs)  # type: ignore[arg-type]

    def go() -> None:
        minors = parse_index_list(gpu_list) if gpu_list else job_gpu_minors(os.environ)
        vdir = virtual_dir or os.environ.get(VIRTUAL_DIR_ENV)
        if not vdir:
            vdir = load_settings().telemetry.virtual_dir
        devices = [VirtualGpuDevice.open(vdir, m) for m in minors]
        signal.signal(signal.SIGTERM, _on_sigterm)
        _log(
            f"demo {pattern} for {params.duration_s:g}s on GPUs "
            + ", ".join(f"{m} ({d.uuid})" for m, d in zip(minors, devices, strict=True))
        )
        try:
            run_pattern(pattern, devices, params, log=_log)
        except OutOfMemory as exc:
            click.echo(f"torch.OutOfMemoryError: {exc}", err=True)
            sys.exit(1)
        _log(f"demo {pattern} done")
        if exit_code:
            click.echo(f"demo {pattern}: exiting {exit_code} as asked (--exit-code)", err=True)
            sys.exit(exit_code)

    run_guarded("slurm_gpu.demo", os.environ.get("SLURM_GPU_DEBUG") == "1", go)


if __name__ == "__main__":
    main(prog_name="python -m slurm_gpu.demo")
