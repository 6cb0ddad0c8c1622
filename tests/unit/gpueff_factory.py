"""Builders of accounting and telemetry records for the gpueff and mail tests."""

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


def job(**over: Any) -> JobRecord:
    """A completed 2-GPU job of sgtest1 (override any field)."""
    base = JobRecord(
        job_id="1001",
        job_id_display="1001",
        array_job_id=None,
        array_task_id=None,
        het_job_id=None,
        het_job_offset=None,
        user="sgtest1",
        uid=1001,
        account="research",
        partition="gpu",
        qos="normal",
        job_name="train-resnet",
        work_dir="/home/sgtest1",
        nodelist=("node1",),
        state="COMPLETED",
        cancelled_by_uid=None,
        exit_code=0,
        exit_signal=0,
        derived_exit_code=0,
        alloc_tres=Tres(
            cpus=8, mem_bytes=32 * GIB, nodes=1, gpus=2, gpu_types=(("a100", 2),), raw="x"
        ),
        req_tres=Tres(cpus=8, mem_bytes=32 * GIB, nodes=1, gpus=2, raw="x"),
        alloc_cpus=8,
        req_mem_bytes=32 * GIB,
        max_rss_bytes=4 * GIB,
        total_cpu_s=8 * 3600 * 0.25,
        elapsed_s=3600,
        time_limit_s=4 * 3600,
        submit_s=1_700_000_000.0,
        start_s=1_700_000_100.0,
        end_s=1_700_003_700.0,
        restarts=0,
        comment=None,
        admin_comment=None,
        mail_user="sgtest1@example.org",
        mail_type="END",
    )
    return replace(base, **over)


def gpu(uuid: str, minor: int, util: list[float], *, process_seen: bool = True) -> GpuSummary:
    return GpuSummary(
        info=GpuInfo(
            uuid=uuid,
            index=minor,
            minor_number=minor,
            name="NVIDIA A100-SXM4-40GB",
            memory_total_bytes=40 * GIB,
            power_limit_w=400.0,
        ),
        samples=len(util),
        samples_available=len(util),
        first_time_s=1_700_000_100.0,
        last_time_s=1_700_003_700.0,
        utilization=dist(util),
        sub_samples=dist([]),
        idle_samples=sum(1 for v in util if v <= 1),
        active_first_time_s=None,
        active_last_time_s=None,
        memory_used_max_bytes=12 * GIB,
        memory_used_mean_bytes=10.0 * GIB,
        power_mean_w=210.0,
        power_max_w=300.0,
        energy_j=210.0 * 3600,
        sm_clock_mean_mhz=1400.0,
        temperature_max_c=70.0,
        throttle_power_s=0.0,
        throttle_thermal_s=0.0,
        pcie_tx_mean_bytes_per_s=None,
        pcie_rx_mean_bytes_per_s=None,
        nvlink_bytes=None,
        nvlink_bytes_while_idle=None,
        ecc_corrected=None,
        ecc_uncorrected=None,
        xid_events=(),
        process_seen=process_seen,
        max_processes=1 if process_seen else 0,
        pids=(4242,) if process_seen else (),
        sm_active_mean_pct=None,
        tensor_active_mean_pct=None,
    )


def node_record(
    host: str = "node1", utils: tuple[list[float], ...] = ([80.0] * 60, [0.0] * 60)
) -> NodeRecord:
    gpus = tuple(
        gpu(f"GPU-{host}-{i:04d}", i, u, process_seen=any(v > 0 for v in u))
        for i, u in enumerate(utils)
    )
    n = max(len(u) for u in utils)
    timeline = tuple(
        TimelinePoint(
            t_s=1_700_000_100.0 + 60 * k,
            width_s=60.0,
            samples=1,
            gpu_utilization_pct=tuple(u[k] if k < len(u) else None for u in utils),
            gpu_memory_used_max_bytes=tuple(12 * GIB for _ in utils),
            gpu_power_w=tuple(210.0 for _ in utils),
            host_cpu_cores=2.0,
            host_rss_max_bytes=4 * GIB,
        )
        for k in range(n)
    )
    return NodeRecord(
        job_id="1001",
        hostname=host,
        uid=1001,
        interval_s=10.0,
        source="virtual",
        started_s=1_700_000_100.0,
        ended_s=1_700_003_700.0,
        gpus=gpus,
        host=HostSummary(
            method="cgroup1",
            samples=n,
            cpu_time_s=7200.0,
            cpu_cores_busy=dist([25.0] * n),
            allocated_cores=8,
            rss_max_bytes=4 * GIB,
            rss_mean_bytes=3.0 * GIB,
            io_read_bytes=None,
            io_write_bytes=None,
        ),
        timeline=timeline,
        complete=True,
    )
