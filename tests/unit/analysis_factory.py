"""Builders of analysis inputs (job, node and GPU records) for the analysis tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slurm_gpu.capture.aggregate import distribution_of as dist
from slurm_gpu.records import (
    GpuInfo,
    GpuSummary,
    HostSummary,
    JobRecord,
    NodeRecord,
    TimelinePoint,
    Tres,
)

GIB = 1024**3
T0 = 1_700_000_000.0


def gpu(
    uuid: str = "GPU-0",
    *,
    duty: float | list[float] = 90.0,
    n: int = 100,
    mem_frac: float | None = 0.6,
    capacity_gib: int = 80,
    process: bool = True,
    start: float = T0,
    end: float = T0 + 3600,
    active: tuple[float, float] | None = None,
    cc: tuple[int, int] | None = (8, 0),
    **over: Any,
) -> GpuSummary:
    """A GPU summary: ``duty`` is one level for ``n`` readings or the list of readings."""
    values = duty if isinstance(duty, list) else [duty] * n
    idle = sum(1 for v in values if v <= 1.0)
    busy = any(v > 1.0 for v in values)
    act = active if active is not None else ((start + 10, end) if busy else None)
    cap = capacity_gib * GIB
    g = GpuSummary(
        info=GpuInfo(
            uuid=uuid,
            name="NVIDIA A100",
            memory_total_bytes=cap,
            power_limit_w=400.0,
            compute_capability=cc,
        ),
        samples=len(values),
        samples_available=len(values),
        first_time_s=start + 10,
        last_time_s=end,
        utilization=dist(values),
        sub_samples=dist([]),
        idle_samples=idle,
        active_first_time_s=act[0] if act else None,
        active_last_time_s=act[1] if act else None,
        memory_used_max_bytes=None if mem_frac is None else int(cap * mem_frac),
        memory_used_mean_bytes=None,
        power_mean_w=250.0,
        power_max_w=300.0,
        energy_j=250.0 * (end - start),
        sm_clock_mean_mhz=1400.0,
        temperature_max_c=70.0,
        throttle_power_s=0.0,
        throttle_thermal_s=0.0,
        pcie_tx_mean_bytes_per_s=None,
        pcie_rx_mean_bytes_per_s=None,
        nvlink_bytes=None,
        nvlink_bytes_while_idle=None,
        ecc_corrected=0,
        ecc_uncorrected=0,
        xid_events=(),
        process_seen=process,
        max_processes=1 if process else 0,
        pids=(1,) if process else (),
        sm_active_mean_pct=None,
        tensor_active_mean_pct=None,
    )
    return replace(g, **over)


def host(cores: int = 8, busy_frac: float = 0.5, elapsed: float = 3600, **over: Any) -> HostSummary:
    h = HostSummary(
        method="cgroup1",
        samples=100,
        cpu_time_s=cores * busy_frac * elapsed,
        cpu_cores_busy=dist([100 * busy_frac] * 100),
        allocated_cores=cores,
        rss_max_bytes=8 * GIB,
        rss_mean_bytes=6 * GIB,
        io_read_bytes=None,
        io_write_bytes=None,
    )
    return replace(h, **over)


def timeline(
    utils: list[float], cores: list[float], n_gpus: int = 1, width: float = 60.0
) -> tuple[TimelinePoint, ...]:
    return tuple(
        TimelinePoint(
            t_s=T0 + i * width,
            width_s=width,
            samples=6,
            gpu_utilization_pct=(u,) * n_gpus,
            gpu_memory_used_max_bytes=(None,) * n_gpus,
            gpu_power_w=(None,) * n_gpus,
            host_cpu_cores=c,
            host_rss_max_bytes=None,
        )
        for i, (u, c) in enumerate(zip(utils, cores, strict=True))
    )


def node(
    gpus: tuple[GpuSummary, ...] | list[GpuSummary] = (),
    *,
    job_id: str = "42",
    hostname: str = "gpu001",
    start: float = T0,
    end: float = T0 + 3600,
    host_summary: HostSummary | None = None,
    tl: tuple[TimelinePoint, ...] = (),
    interval: float = 10.0,
) -> NodeRecord:
    return NodeRecord(
        job_id=job_id,
        hostname=hostname,
        uid=1000,
        interval_s=interval,
        source="virtual",
        started_s=start,
        ended_s=end,
        gpus=tuple(gpus) or (gpu(),),
        host=host_summary if host_summary is not None else host(),
        timeline=tl,
        complete=True,
    )


def job(
    *,
    job_id: str = "42",
    gpus: int = 1,
    cpus: int | None = 8,
    elapsed: int = 3600,
    limit: int | None = 5400,
    state: str = "COMPLETED",
    total_cpu: float | None = 8 * 0.5 * 3600,
    max_rss: int | None = 8 * GIB,
    mem: int | None = 16 * GIB,
    nodes: tuple[str, ...] = ("gpu001",),
    name: str = "train",
    gpu_types: tuple[tuple[str, int], ...] = (),
) -> JobRecord:
    tres = Tres(cpus=cpus, mem_bytes=mem, nodes=len(nodes), gpus=gpus, gpu_types=gpu_types)
    return JobRecord(
        job_id=job_id,
        job_id_display=job_id,
        array_job_id=None,
        array_task_id=None,
        het_job_id=None,
        het_job_offset=None,
        user="alice",
        uid=1000,
        account="lab",
        partition="gpu",
        qos=None,
        job_name=name,
        work_dir="/home/alice",
        nodelist=nodes,
        state=state,
        cancelled_by_uid=None,
        exit_code=0,
        exit_signal=0,
        derived_exit_code=0,
        alloc_tres=tres,
        req_tres=tres,
        alloc_cpus=cpus,
        req_mem_bytes=mem,
        max_rss_bytes=max_rss,
        total_cpu_s=total_cpu,
        elapsed_s=elapsed,
        time_limit_s=limit,
        submit_s=T0 - 60,
        start_s=T0,
        end_s=T0 + elapsed,
        restarts=0,
        comment=None,
        admin_comment=None,
        mail_user=None,
        mail_type=None,
    )
