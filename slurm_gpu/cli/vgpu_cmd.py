"""``slurm-gpu vgpu``: create and inspect file-backed virtual GPUs (a test fixture)."""

from __future__ import annotations

import json

import click

from slurm_gpu.telemetry.virtual import VirtualGpuSource
from slurm_gpu.telemetry.virtual_device import DEFAULT_MODEL, MODELS, create_gpus


@click.group("vgpu")
def cli() -> None:
    """Virtual GPUs for machines without one (test clusters, demos, CI)."""


@cli.command("create")
@click.option("--dir", "virtual_dir", required=True, type=click.Path(file_okay=False))
@click.option("--count", type=click.IntRange(1, 64), required=True, help="Number of GPUs.")
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help=f"GPU model to imitate, by key or product name: {', '.join(sorted(MODELS))}.",
)
@click.option("--memory-gib", type=click.FloatRange(min=0.1), default=None, help="Override.")
def create(virtual_dir: str, count: int, model: str, memory_gib: float | None) -> None:
    """Create GPUs 0..COUNT-1 in DIR (idempotent: existing GPUs keep their UUIDs).

    The directories are world-writable because jobs of every user drive them: use them for
    testing only.
    """
    for info in create_gpus(virtual_dir, count, model=model, memory_gib=memory_gib):
        click.echo(f"{info.minor_number}\t{info.uuid}\t{info.name}")


@cli.command("show")
@click.option("--dir", "virtual_dir", required=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(virtual_dir: str, as_json: bool) -> None:
    """Show each virtual GPU's identity and current reading."""
    source = VirtualGpuSource(virtual_dir)
    infos = list(source.list_gpus())
    samples = source.sample([i.uuid for i in infos])
    if as_json:
        rows = [
            {
                "minor_number": i.minor_number,
                "uuid": i.uuid,
                "name": i.name,
                "available": s.available,
                "utilization_pct": s.utilization_pct,
                "memory_used_bytes": s.memory_used_bytes,
                "memory_total_bytes": s.memory_total_bytes,
                "power_w": s.power_w,
                "energy_mj": s.energy_mj,
                "pids": [p.pid for p in s.processes or ()],
            }
            for i, s in zip(infos, samples, strict=True)
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'minor':>5}  {'uuid':<40}  {'util%':>6}  {'mem GiB':>15}  {'power W':>8}  pids")
    for info, s in zip(infos, samples, strict=True):
        if not s.available:
            click.echo(f"{info.minor_number:>5}  {info.uuid:<40}  unavailable")
            continue
        mem = f"{(s.memory_used_bytes or 0) / 2**30:.1f}/{(s.memory_total_bytes or 0) / 2**30:.1f}"
        pids = ",".join(str(p.pid) for p in s.processes or ()) or "-"
        click.echo(
            f"{info.minor_number:>5}  {info.uuid:<40}  {s.utilization_pct or 0:>6.1f}  "
            f"{mem:>15}  {s.power_w or 0:>8.1f}  {pids}"
        )
