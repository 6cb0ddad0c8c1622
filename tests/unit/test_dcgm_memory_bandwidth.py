"""dcgm-exporter's memory utilization reaches the record: ``DCGM_FI_DEV_MEM_COPY_UTIL`` (in
the exporter's default counters, so on sites without profiling metrics) where the profiling
``DCGM_FI_PROF_DRAM_ACTIVE`` is not scraped, the profiling field where both are. Prometheus'
HTTP answers are made at the client's fetch seam, in its API's JSON shape."""

from __future__ import annotations

import json
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import make_job

from slurm_gpu.prometheus.client import PrometheusClient
from slurm_gpu.sources.prometheus_common import PromSourceOptions
from slurm_gpu.sources.prometheus_dcgm import DcgmExporterSource

START = 1_700_000_000.0
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def _source(series: dict[str, float]) -> DcgmExporterSource:
    """A dcgm-exporter source whose Prometheus holds one GPU of job 7 on node1, scraped every
    30 s over the job's 100 s, each metric at a constant value."""

    def fetch(url: str, timeout_s: float) -> bytes:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
        at = float(query["time"][0])
        times = [START + t for t in (30, 60, 90) if START + t <= at]
        result = [
            {
                "metric": {
                    "__name__": name,
                    "UUID": UUID,
                    "gpu": "0",
                    "device": "nvidia0",
                    "Hostname": "node1",
                    "hpc_job": "7",
                },
                "values": [[t, str(v)] for t in times],
            }
            for name, v in series.items()
        ]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return json.dumps(body).encode()

    client = PrometheusClient("http://prometheus.invalid:9090", 5.0, fetch=fetch)
    return DcgmExporterSource(client, PromSourceOptions(interval_s=30.0))


def _memory_util(series: dict[str, float]) -> float | None:
    job = make_job("7", end_s=START + 100)  # started at START
    result = _source(series).records_for(job)
    (node,) = result.nodes
    (gpu,) = node.gpus
    return gpu.memory_utilization_mean_pct


BASE = {"DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_POWER_USAGE": 109.0}


def test_mem_copy_util_of_the_default_counters_is_the_memory_bandwidth() -> None:
    assert _memory_util({**BASE, "DCGM_FI_DEV_MEM_COPY_UTIL": 7.0}) == 7.0


def test_profiling_dram_active_is_preferred_where_both_are_scraped() -> None:
    both = {**BASE, "DCGM_FI_DEV_MEM_COPY_UTIL": 7.0, "DCGM_FI_PROF_DRAM_ACTIVE": 0.65}
    assert _memory_util(both) == 65.0


def test_without_either_series_memory_bandwidth_is_unknown_not_zero() -> None:
    assert _memory_util(BASE) is None
