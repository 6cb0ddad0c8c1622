"""TEST-ONLY: running jobs' live summaries as dcgm-exporter and jobstats exporters show them.

Nothing in production uses this module. It lets the lab (the test cluster's real Prometheus),
the unit tests and the benchmark hold the series of NVIDIA's dcgm-exporter (HPC job-mapping
mode) and of Princeton's jobstats exporters (the GPU exporter and the cgroup exporter) for
jobs that ran on virtual GPUs, under those exporters' exact metric names, label names and
units, so that the Prometheus sources (``slurm_gpu.sources.prometheus_*``) are tested on the
shapes they will meet. Values come from the samplers' live summaries (``LiveJob``); in the lab
(``main``) each job's GPUs and host are set to its newest spool reading, since the summary is
rewritten only every 10 s and a real exporter shows the GPU's state at each scrape.

Real exporters set ``instance`` through Prometheus' target; here one process speaks for every
node, so the series carry ``instance="<host>:<exporter port>"`` themselves and are scraped with
``honor_labels: true``. dcgm-exporter's ``DCGM_FI_PROF_*`` fields are left out (the virtual
GPUs have no profiling counters), as on a site where profiling metrics are off.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gpu.capture.spool import Reading, decode_reading, read_header
from slurm_gpu.capture.spoolpaths import JobSpool
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.live.exposition import (
    GPU_METRICS,
    JOB_METRICS,
    escape_label_value,
    gpu_labels,
    job_labels,
)
from slurm_gpu.live.snapshot import read_node
from slurm_gpu.records import LiveJob

MIB = 1 << 20
DCGM_PORT = 9400
JOBSTATS_GPU_PORT = 9445
CGROUP_PORT = 9306
MODEL = "Virtual GPU"


@dataclass(frozen=True, slots=True)
class Row:
    """One sample: family, type (``gauge``/``counter``), labels as written, value."""

    name: str
    type: str
    labels: str
    value: float


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def own_rows(jobs: Sequence[LiveJob]) -> list[Row]:
    """The project's own exporter's samples of ``jobs`` (``live.exposition``'s names)."""
    out: list[Row] = []
    for job in jobs:
        labels = job_labels(job)
        for m in JOB_METRICS:
            v = m.value(job)
            if v is not None:
                out.append(Row(m.name, m.type, labels, float(v)))
        for g in job.gpus:
            gl = gpu_labels(labels, g)
            for m in GPU_METRICS:
                v = m.value(g)
                if v is not None:
                    out.append(Row(m.name, m.type, gl, float(v)))
    return out


def shifted(job: LiveJob, shift_s: float) -> LiveJob:
    """``job`` as a node whose clock is ``shift_s`` seconds off would report it: every
    timestamp moved, the counters and durations as they are (the policy's tests of skew)."""

    def at(t: float | None) -> float | None:
        return None if t is None else t + shift_s

    return replace(
        job,
        started_s=job.started_s + shift_s,
        updated_s=job.updated_s + shift_s,
        gpus=tuple(
            replace(g, idle_since_s=at(g.idle_since_s), active_first_s=at(g.active_first_s))
            for g in job.gpus
        ),
    )


def own_text(jobs: Sequence[LiveJob], extra_labels: str = "") -> str:
    """The project's own exporter's samples of ``jobs`` as text, each series with
    ``extra_labels`` (``name="value",…``) added: what a target scraped with ``honor_labels``
    can claim."""
    extra = f",{extra_labels}" if extra_labels else ""
    lines = [f"{r.name}{{{r.labels}{extra}}} {r.value!r}" for r in own_rows(jobs)]
    return "\n".join(lines) + "\n"


def rows_of(jobs: Sequence[LiveJob], *, own: bool = False) -> list[Row]:
    """The dcgm-exporter, jobstats GPU and cgroup exporter samples of ``jobs`` (and the
    project's exporter's with ``own``); a GPU's index on its node is its position in the
    job's GPUs (virtual GPUs have no minor)."""
    out: list[Row] = own_rows(jobs) if own else []
    for job in jobs:
        for i, g in enumerate(job.gpus):
            if not g.available:
                continue
            dcgm = _labels(
                (
                    ("gpu", str(i)),
                    ("UUID", g.uuid),
                    ("device", f"nvidia{i}"),
                    ("modelName", MODEL),
                    ("Hostname", job.host),
                    ("hpc_job", job.job_id),
                )
            )
            nv = _labels(
                (
                    ("minor_number", str(i)),
                    ("name", MODEL),
                    ("uuid", g.uuid),
                    ("instance", f"{job.host}:{JOBSTATS_GPU_PORT}"),
                )
            )
            used, total = g.memory_used_bytes, g.memory_total_bytes
            values: list[tuple[str, str, str, float | None]] = [
                ("DCGM_FI_DEV_GPU_UTIL", "gauge", dcgm, g.utilization_pct),
                ("DCGM_FI_DEV_FB_USED", "gauge", dcgm, None if used is None else used / MIB),
                (
                    "DCGM_FI_DEV_FB_FREE",
                    "gauge",
                    dcgm,
                    None if used is None or total is None else (total - used) / MIB,
                ),
                ("DCGM_FI_DEV_POWER_USAGE", "gauge", dcgm, g.power_w),
                (
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                    "counter",
                    dcgm,
                    None if g.energy_j is None else round(g.energy_j * 1000.0),
                ),
                ("DCGM_FI_DEV_XID_ERRORS", "gauge", dcgm, 0.0),
                ("nvidia_gpu_duty_cycle", "gauge", nv, g.utilization_pct),
                ("nvidia_gpu_memory_used_bytes", "gauge", nv, used),
                ("nvidia_gpu_memory_total_bytes", "gauge", nv, total),
                (
                    "nvidia_gpu_power_usage_milliwatts",
                    "gauge",
                    nv,
                    None if g.power_w is None else g.power_w * 1000.0,
                ),
                ("nvidia_gpu_jobId", "gauge", nv, float(job.job_id)),
                ("nvidia_gpu_jobUid", "gauge", nv, float(job.uid or 0)),
            ]
            out += [Row(n, t, lb, v) for n, t, lb, v in values if v is not None]
        cg = _labels(
            (
                ("cgroup", f"/slurm/uid_{job.uid or 0}/job_{job.job_id}"),
                ("jobid", job.job_id),
                ("step", ""),
                ("task", ""),
                ("instance", f"{job.host}:{CGROUP_PORT}"),
            )
        )
        host_values = (
            ("cgroup_cpu_total_seconds", "gauge", job.cpu_time_s),
            ("cgroup_memory_rss_bytes", "gauge", job.rss_bytes),
            ("cgroup_cpus", "gauge", job.allocated_cores),
        )
        out += [Row(n, t, cg, float(v)) for n, t, v in host_values if v is not None]
    return out


def render_text(jobs: Sequence[LiveJob]) -> str:
    """The samples of ``jobs`` in the text exposition format (version 0.0.4)."""
    families: dict[str, list[Row]] = {}
    for r in rows_of(jobs):
        families.setdefault(r.name, []).append(r)
    lines = []
    for name, rows in families.items():
        lines.append(f"# TYPE {name} {rows[0].type}")
        lines += [f"{name}{{{r.labels}}} {r.value!r}" for r in rows]
    return "\n".join(lines) + "\n"


def render_openmetrics(
    scrapes: Iterable[tuple[float, Sequence[LiveJob]]], *, own: bool = False
) -> str:
    """``(time, jobs)`` scrapes as OpenMetrics with timestamps, for
    ``promtool tsdb create-blocks-from openmetrics`` (every family typed ``gauge``: the format
    wants ``_total`` on counters, which dcgm-exporter's names lack)."""
    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for t, jobs in scrapes:
        for r in rows_of(jobs, own=own):
            series.setdefault(r.name, {}).setdefault(r.labels, []).append((t, r.value))
    lines = []
    for name, by_labels in series.items():
        lines.append(f"# TYPE {name} gauge")
        for labels, points in by_labels.items():
            lines += [f"{name}{{{labels}}} {v!r} {t!r}" for t, v in sorted(points)]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


#: Largest hide file read, bytes.
MAX_HIDE_BYTES = 65536


def hidden_jobs(path: str | None) -> frozenset[str]:
    """Job ids listed (one per line) in the lab's hide file; none when it is absent. The lab
    hides a job's series to test a node whose series are missing."""
    if not path:
        return frozenset()
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_HIDE_BYTES).decode("ascii", "replace")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip().isdigit())


#: Bytes read from the end of a spool file for its last reading.
TAIL_BYTES = 65536


def last_reading(spool_dir: str, job_id: str, host: str) -> Reading | None:
    """The newest complete line of the job's spool on ``host`` (``None``: none readable)."""
    try:
        path = JobSpool(spool_dir, job_id, host).jsonl
        header, first = read_header(path)
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            at = fh.seek(max(first, size - TAIL_BYTES))
            lines = fh.read(TAIL_BYTES).split(b"\n")
    except (OSError, ValueError, SlurmGpuError):
        return None
    if at > first:
        lines = lines[1:]  # the first one was cut by the seek
    for line in reversed(lines):
        if not line.strip():
            continue
        try:
            return decode_reading(line, header)
        except (SlurmGpuError, ValueError, KeyError, TypeError, IndexError):
            continue  # a line being written: the one before is whole
    return None


def with_last_reading(job: LiveJob, reading: Reading | None) -> LiveJob:
    """``job`` with the values of its newest reading: the live summary is rewritten every
    10 s, a real exporter shows each scrape the GPU's state then, and the sampler's spool
    has every reading (each second in the lab)."""
    if reading is None:
        return job
    by_uuid = {g.uuid: g for g in reading.gpus}
    gpus = []
    for g in job.gpus:
        r = by_uuid.get(g.uuid)
        if r is None or not r.available:
            gpus.append(g)
            continue
        gpus.append(
            replace(
                g,
                utilization_pct=r.utilization_pct,
                memory_used_bytes=r.memory_used_bytes,
                power_w=r.power_w,
                energy_j=None if r.energy_mj is None else r.energy_mj / 1000.0,
            )
        )
    host = reading.host
    return replace(
        job,
        gpus=tuple(gpus),
        cpu_time_s=host.cpu_time_s if host is not None else job.cpu_time_s,
        rss_bytes=host.rss_bytes if host is not None else job.rss_bytes,
    )


def lab_exposition(spool_dir: str, stale_after_s: float, hide_file: str | None) -> str:
    """The shapes of the node's running jobs now (each at its newest spool reading), less
    the hidden ones."""
    hidden = hidden_jobs(hide_file)
    snapshot = read_node(spool_dir, time.time(), stale_after_s)
    return render_text(
        [
            with_last_reading(j, last_reading(spool_dir, j.job_id, j.host))
            for j in snapshot.jobs
            if j.job_id not in hidden
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    """TEST-ONLY: serve the shapes on loopback for the lab's Prometheus
    (``python -I -m slurm_gpu.live.testshapes --spool-dir DIR --port N``)."""
    from slurm_gpu.live.exporter import ExporterOptions, make_server

    p = argparse.ArgumentParser(description="TEST-ONLY dcgm-exporter/jobstats shapes")
    p.add_argument("--spool-dir", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stale-after-s", type=float, default=60.0)
    p.add_argument("--hide-file", default=None)
    a = p.parse_args(argv)
    opts = ExporterOptions(str(Path(a.spool_dir)), a.stale_after_s)
    server = make_server(
        opts,
        "127.0.0.1",
        a.port,
        lambda: lab_exposition(opts.spool_dir, opts.stale_after_s, a.hide_file),
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
