"""Every Prometheus query of the Grafana dashboards (``share/grafana/``) returns data from the
test cluster's real Prometheus while a demo job runs (issue 30, point 2).

The job is the demo's ``idle-gpu`` workload (two GPUs, one never used), so that the idle
GPU's series exist too. Grafana's variables are filled in as Grafana would: ``$job_id`` with
the job's id, ``$__rate_interval`` with 1m, ``$idle_min_s`` with 1 (the job has not idled for
15 minutes yet). The SQL panel is checked against a store in
``tests/unit/test_grafana_dashboards.py``.

With ``SLURM_GPU_TC_NO_START=1`` it uses the running cluster as it is (``conftest.cluster``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.prometheus.client import PrometheusClient

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "share" / "grafana"


def prometheus() -> PrometheusClient:
    live = load_settings(str(slurmtools.slurm_gpu_config_path())).live
    assert live.prometheus_url, "the test cluster's [live] must name its Prometheus"
    return PrometheusClient(live.prometheus_url, 5.0)


def prom_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every Prometheus target."""
    out = []
    for path in sorted(GRAFANA.glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            if p["datasource"] != "${prometheus}":
                continue
            for t in p["targets"]:
                out.append((path.name, p["title"], t["expr"]))
    return out


def fill(expr: str, job_id: str) -> str:
    return (
        expr.replace("$job_id", job_id)
        .replace("$__rate_interval", "1m")
        .replace("$idle_min_s", "1")
    )


def test_every_panel_query_returns_data_while_a_demo_job_runs(job_dir: Path) -> None:
    queries = prom_queries()
    assert len(queries) >= 12
    python = slurmtools.venv_python()
    job_id = slurmtools.submit(
        f"#!/bin/sh\nexec {python} -m slurm_gpu.demo idle-gpu --duration 90\n",
        args=[
            f"--chdir={job_dir}",
            f"--output={job_dir}/%j.out",
            "--gres=gpu:2",
            "--time=5",
            f"--export=ALL,SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}",
        ],
    )
    client = prometheus()
    try:
        empty: list[tuple[str, str, str]] = queries
        deadline = time.monotonic() + 120
        answers: dict[str, Any] = {}
        while empty and time.monotonic() < deadline:
            time.sleep(3)
            still = []
            for dash, title, expr in empty:
                filled = fill(expr, job_id)
                samples = client.query(filled)
                if samples:
                    answers[filled] = samples
                else:
                    still.append((dash, title, filled))
            empty = still
        assert not empty, f"panels without data for job {job_id}: {empty}"
        # The job view's series are the job's own.
        for filled, samples in answers.items():
            if f'job_id="{job_id}"' in filled:
                assert all(s.labels.get("job_id", job_id) == job_id for s in samples), filled
    finally:
        slurmtools.run_as(None, ["scancel", job_id], check=False)
