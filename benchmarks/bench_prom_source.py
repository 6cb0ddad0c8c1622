"""Jobs diagnosed per second from Prometheus, with 10,000 finished jobs' series loaded.

Each job ran on its own node with ``--gpus`` GPUs for ``--scrapes`` scrapes ``--scrape-s``
apart (jobs staggered over a day). Every scrape's live summaries are written in the shapes of
dcgm-exporter, the jobstats exporters and the project's exporter (``live.testshapes``,
test-only) and loaded with ``promtool tsdb create-blocks-from openmetrics`` (in batches of
1,000 jobs, one block each) into a throwaway Prometheus on loopback. Then, for each source,
``--measure`` jobs spread over the 10,000 are diagnosed one after another as the collector's
pull pass would: the source's queries, the node records through the streaming aggregates, and
``analysis.analyze``. Wall and process CPU time; Prometheus' own CPU is not in the latter.
Target: >= 50 jobs/s. Prints a Markdown section for docs/performance.md. Needs prometheus and
promtool.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.live.testshapes import render_openmetrics
from slurm_gpu.prometheus.client import PrometheusClient
from slurm_gpu.records import LiveGpu, LiveJob
from slurm_gpu.sources.prometheus_common import PromSourceOptions
from slurm_gpu.sources.prometheus_dcgm import DcgmExporterSource
from slurm_gpu.sources.prometheus_exporter import SlurmExporterSource
from slurm_gpu.sources.prometheus_jobstats import JobstatsSource
from tests.store_fixtures import make_job

TARGET_JOBS_PER_S = 50.0
GIB = 1 << 30
BATCH = 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_start(j: int, base: float) -> float:
    return base + (j % 48) * 1800.0


def live(j: int, k: int, gpus: int, scrape_s: float, base: float) -> LiveJob:
    start = job_start(j, base)
    duty = 0.0 if j % 100 == 0 else 30.0 + (j * 7 + k * 11) % 60
    return LiveJob(
        job_id=str(100000 + j),
        host=f"node{j:05d}",
        user=f"user{j % 997}",
        account=f"acct{j % 37}",
        partition="gpu",
        uid=1000 + j % 997,
        started_s=start,
        updated_s=start + scrape_s * (k + 1),
        interval_s=scrape_s,
        cpu_time_s=2.0 * scrape_s * (k + 1),
        rss_bytes=8 * GIB,
        allocated_cores=8,
        gpus=tuple(
            LiveGpu(
                uuid=f"GPU-{j:06d}-{g:02d}",
                available=True,
                utilization_pct=duty,
                utilization_recent_pct=None,
                utilization_mean_pct=None,
                recent_window_s=None,
                busy_s=duty / 100.0 * scrape_s * (k + 1),
                sampled_s=scrape_s * (k + 1),
                idle_since_s=None,
                active_first_s=None,
                memory_used_bytes=int((2 + duty / 5) * GIB),
                memory_total_bytes=80 * GIB,
                memory_used_max_bytes=None,
                power_w=60.0 + 3.0 * duty,
                energy_j=(60.0 + 3.0 * duty) * scrape_s * (k + 1),
            )
            for g in range(gpus)
        ),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--scrape-s", type=float, default=30.0)
    p.add_argument("--measure", type=int, default=1000)
    a = p.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert prometheus and promtool, "install prometheus (make deps)"
    base = time.time() - 2 * 86400.0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        samples = 0
        for first in range(0, a.jobs, BATCH):
            om = Path(tmp) / "batch.om"
            text = render_openmetrics(
                (
                    (
                        job_start(j, base) + a.scrape_s * (k + 1),
                        [live(j, k, a.gpus, a.scrape_s, base)],
                    )
                    for j in range(first, min(a.jobs, first + BATCH))
                    for k in range(a.scrapes)
                ),
                own=True,
            )
            samples += text.count("\n") - text.count("# ")
            om.write_text(text)
            subprocess.run(
                [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), f"{tmp}/data"],
                check=True,
                capture_output=True,
            )
        load_s = time.perf_counter() - t0
        (Path(tmp) / "prometheus.yml").write_text("global: {scrape_interval: 30s}\n")
        port = free_port()
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp}/prometheus.yml",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        rows = []
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "Prometheus did not start"
                    time.sleep(0.5)
            client = PrometheusClient(url, 60.0)
            settings = AnalysisSettings()
            step = max(1, a.jobs // a.measure)
            chosen = list(range(0, a.jobs, step))[: a.measure]
            for cls in (DcgmExporterSource, JobstatsSource, SlurmExporterSource):
                source = cls(client, PromSourceOptions(interval_s=a.scrape_s))
                found = 0
                t0, c0 = time.perf_counter(), time.process_time()
                for j in chosen:
                    start = job_start(j, base)
                    end = start + a.scrape_s * a.scrapes
                    job = replace(
                        make_job(str(100000 + j), gpus=a.gpus, nodes=(f"node{j:05d}",)),
                        start_s=start,
                        end_s=end,
                        elapsed_s=int(end - start),
                    )
                    result = source.records_for(job)
                    analyze(job, result.nodes, settings)
                    found += len(result.nodes)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                assert found == len(chosen), (cls.__name__, found)
                rows.append((source.capabilities.name, cls.queries_per_job, wall, cpu))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    n = len(chosen)
    print(
        "## Telemetry sources: jobs diagnosed from Prometheus (`benchmarks/bench_prom_source.py`)"
    )
    print()
    print(
        f"{a.jobs:,} finished jobs x {a.gpus} GPUs, {a.scrapes} scrapes {a.scrape_s:g} s apart "
        f"each, in the shapes of dcgm-exporter, jobstats and the project's exporter "
        f"({samples:,} samples) loaded with `promtool tsdb create-blocks-from openmetrics` "
        f"({load_s:.0f} s, generation included); {n} of the jobs, spread over all of them, "
        f"diagnosed per source (queries, records, `analysis.analyze`).\n"
    )
    print("| source | queries per job | wall | CPU (this process) | jobs/s (wall) |")
    print("|---|---|---|---|---|")
    for name, q, wall, cpu in rows:
        print(f"| {name} | {q} | {wall:.2f} s | {cpu:.2f} s | {n / wall:.0f} |")
    worst = min(n / wall for _, _, wall, _ in rows)
    verdict = "met" if worst >= TARGET_JOBS_PER_S else "NOT met"
    print(f"\nTarget >= {TARGET_JOBS_PER_S:g} jobs/s: {verdict}.")
    from results import target_line

    print(
        target_line(
            "jobs diagnosed from Prometheus (slowest of dcgm-exporter, jobstats, slurm-exporter)",
            f"{worst:.0f} jobs/s",
            f"≥ {TARGET_JOBS_PER_S:g} jobs/s",
            worst >= TARGET_JOBS_PER_S,
        )
    )


if __name__ == "__main__":
    main()
