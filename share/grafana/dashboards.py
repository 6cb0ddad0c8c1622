"""slurm-gpu's Grafana dashboards, built with grafanalib (``docs/grafana.md``).

Run ``python share/grafana/dashboards.py`` to rewrite ``cluster.json`` and ``job.json`` beside
this file; ``tests/unit/test_grafana_dashboards.py`` fails when the files and this code
differ, and ``tests/integration/test_grafana_cluster.py`` runs every panel's query against the
test cluster's Prometheus. Every query reads slurm-gpu's exporter series or the recording
rules of ``share/prometheus/slurm-gpu.rules.yml``; the live policy's recorded actions come
from the store (a PostgreSQL data source on the store's database).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafanalib import core as G
from grafanalib._gen import DashboardEncoder

HERE = Path(__file__).resolve().parent
PROM = "${prometheus}"
STORE = "${store}"

#: The dashboard model these files are written in; Grafana migrates them forward on import.
SCHEMA_VERSION = 36

#: Grafana's own interval variable, which the query tests replace by a fixed window.
RATE = "$__rate_interval"


def _prom_var() -> G.Template:
    return G.Template(
        name="prometheus",
        label="Prometheus",
        query="prometheus",
        type="datasource",
    )


def _ts(
    title: str,
    exprs: list[tuple[str, str]],
    unit: str,
    pos: tuple[int, int, int, int],
    description: str,
    **kw: Any,
) -> G.TimeSeries:
    x, y, w, h = pos
    return G.TimeSeries(
        title=title,
        description=description,
        dataSource=PROM,
        targets=[
            G.Target(expr=e, legendFormat=legend, refId=chr(ord("A") + i))
            for i, (e, legend) in enumerate(exprs)
        ],
        unit=unit,
        gridPos=G.GridPos(h=h, w=w, x=x, y=y),
        **kw,
    )


def _stat(
    title: str, expr: str, pos: tuple[int, int, int, int], description: str, unit: str = "none"
) -> G.Stat:
    x, y, w, h = pos
    return G.Stat(
        title=title,
        description=description,
        dataSource=PROM,
        targets=[G.Target(expr=expr, refId="A", instant=True)],
        format=unit,
        reduceCalc="last",
        gridPos=G.GridPos(h=h, w=w, x=x, y=y),
    )


def cluster() -> G.Dashboard:
    """Running GPU jobs, idle GPUs now, waste by account and partition, the live policy."""
    idle_var = G.Template(
        name="idle_min_s",
        label="Idle for at least (s)",
        type="custom",
        query="900,1800,3600",
        default="900",
    )
    store_var = G.Template(
        name="store", label="Store (PostgreSQL)", query="postgres", type="datasource"
    )
    panels: list[Any] = [
        _stat(
            "Running GPU jobs",
            "count(slurm_gpu_job:gpus:sum)",
            (0, 0, 6, 4),
            "Jobs with a live summary on some node (the exporter's series).",
        ),
        _stat(
            "GPUs held", "sum(slurm_gpu_job:gpus:sum)", (6, 0, 6, 4), "GPUs held by running jobs."
        ),
        _stat(
            "Idle GPUs now",
            "sum(slurm_gpu_job:gpus_idle:count) or vector(0)",
            (12, 0, 6, 4),
            "GPUs whose last readings were idle (slurm_gpu_gpu_idle_since_timestamp_seconds).",
        ),
        _stat(
            "GPUs wasted (15 min)",
            "sum(slurm_gpu_job:gpus_wasted:sum_15m)",
            (18, 0, 6, 4),
            "Idle share of every GPU over the last 15 minutes, summed: GPU-hours lost per hour.",
        ),
        _ts(
            "GPUs wasted by account",
            [("sum by (account) (slurm_gpu_job:gpus_wasted:sum_15m)", "{{account}}")],
            "none",
            (0, 4, 12, 8),
            "Idle share over 15 minutes, summed per account (GPU-hours lost per hour).",
            stacking={"mode": "normal"},
        ),
        _ts(
            "GPUs wasted by partition",
            [("sum by (partition) (slurm_gpu_job:gpus_wasted:sum_15m)", "{{partition}}")],
            "none",
            (12, 4, 12, 8),
            "Idle share over 15 minutes, summed per partition.",
            stacking={"mode": "normal"},
        ),
        G.Table(
            title="Running GPU jobs, most wasted first",
            description="One row per job; open the job view from the job id.",
            dataSource=PROM,
            targets=[
                G.Target(
                    expr="slurm_gpu_job:gpus_wasted:sum_15m",
                    refId="A",
                    instant=True,
                    format="table",
                ),
            ],
            gridPos=G.GridPos(h=8, w=12, x=0, y=12),
            sortBy=[G.TableSortByField(displayName="Value", desc=True)],
        ),
        G.Table(
            title="Jobs the live policy would act on now",
            description=(
                "GPUs idle for at least $idle_min_s s (the policy's [live] idle_min_s), per job: "
                "what `slurm-gpu police` warns about or cancels at its next pass."
            ),
            dataSource=PROM,
            targets=[
                G.Target(
                    expr="count by (job_id, user, account) "
                    "(slurm_gpu_gpu:idle:seconds >= $idle_min_s)",
                    refId="A",
                    instant=True,
                    format="table",
                ),
            ],
            gridPos=G.GridPos(h=8, w=12, x=12, y=12),
        ),
        G.Table(
            title="Live policy: recorded warnings and cancellations",
            description="The store's live_actions table (PostgreSQL stores): newest first.",
            dataSource=STORE,
            targets=[
                G.SqlTarget(
                    rawSql=ACTIONS_SQL,
                    format="table",
                    refId="A",
                ),
            ],
            gridPos=G.GridPos(h=8, w=24, x=0, y=20),
        ),
    ]
    return G.Dashboard(
        title="slurm-gpu: cluster",
        uid="slurm-gpu-cluster",
        description="Running GPU jobs, idle GPUs, waste and the live policy (slurm-gpu).",
        tags=["slurm-gpu"],
        schemaVersion=SCHEMA_VERSION,
        timezone="browser",
        refresh="30s",
        time=G.Time("now-6h", "now"),
        templating=G.Templating(list=[_prom_var(), store_var, idle_var]),
        links=[G.DashboardLink(title="Job view", uri="/d/slurm-gpu-job", type="link")],
        panels=panels,
    ).auto_panel_ids()


#: The live policy's recorded actions (``store.schema.live_actions``), newest first; plain SQL
#: that SQLite and PostgreSQL both run.
ACTIONS_SQL = (
    'SELECT at_s * 1000 AS time, job_id, "user", account, rule, action, gpus, '
    "idle_gpu_s / 3600.0 AS idle_gpu_hours FROM live_actions "
    "ORDER BY at_s DESC LIMIT 200"
)


def job() -> G.Dashboard:
    """One job's GPUs over time: duty cycle, memory, power and energy per GPU; CPU, memory."""
    job_var = G.Template(
        name="job_id",
        label="Job id",
        query="label_values(slurm_gpu_job_gpus, job_id)",
        dataSource=PROM,
        type="query",
        refresh=G.REFRESH_ON_TIME_RANGE_CHANGE,
    )
    sel = '{job_id="$job_id"}'
    gpu = "{{host}} {{gpu_uuid}}"
    panels: list[Any] = [
        _ts(
            "Duty cycle per GPU",
            [(f"slurm_gpu_gpu_utilization_ratio{sel}", gpu)],
            "percentunit",
            (0, 0, 12, 8),
            "Share of time a kernel ran, at each reading (0-1); idle GPUs sit at 0.",
            valueMin=0,
            valueMax=1,
        ),
        _ts(
            "Duty cycle over 15 minutes and since the start",
            [
                (f"slurm_gpu_gpu:utilization:ratio_15m{sel}", gpu + " 15 min"),
                (f"slurm_gpu_gpu:utilization:ratio_since_start{sel}", gpu + " since start"),
            ],
            "percentunit",
            (12, 0, 12, 8),
            "Kernel seconds over sampled seconds, in the last 15 minutes and since the job "
            "started (recording rules).",
            valueMin=0,
            valueMax=1,
        ),
        _ts(
            "GPU memory used",
            [(f"slurm_gpu_gpu_memory_used_bytes{sel}", gpu)],
            "bytes",
            (0, 8, 12, 8),
            "Device memory in use at each reading.",
        ),
        _ts(
            "GPU power",
            [(f"slurm_gpu_gpu_power_watts{sel}", gpu)],
            "watt",
            (12, 8, 12, 8),
            "Power draw at each reading.",
        ),
        _ts(
            "GPU energy so far",
            [(f"slurm_gpu_gpu_energy_joules_total{sel} / 3.6e6", gpu)],
            "kwatth",
            (0, 16, 8, 8),
            "Energy since the job started, kWh (the energy counters).",
        ),
        _ts(
            "Job CPU cores busy",
            [
                (f"rate(slurm_gpu_job_cpu_seconds_total{sel}[{RATE}])", "{{host}} busy"),
                (f"slurm_gpu_job_cpus_allocated{sel}", "{{host}} allocated"),
            ],
            "none",
            (8, 16, 8, 8),
            "CPU seconds per second of the job on each node.",
        ),
        _ts(
            "Job memory",
            [(f"slurm_gpu_job_memory_rss_bytes{sel}", "{{host}}")],
            "bytes",
            (16, 16, 8, 8),
            "Resident memory of the job on each node.",
        ),
    ]
    return G.Dashboard(
        title="slurm-gpu: job",
        uid="slurm-gpu-job",
        description="One running job's GPUs over time (slurm-gpu); ?var-job_id=<id>.",
        tags=["slurm-gpu"],
        schemaVersion=SCHEMA_VERSION,
        timezone="browser",
        refresh="30s",
        time=G.Time("now-1h", "now"),
        templating=G.Templating(list=[_prom_var(), job_var]),
        links=[G.DashboardLink(title="Cluster view", uri="/d/slurm-gpu-cluster", type="link")],
        panels=panels,
    ).auto_panel_ids()


def as_json(dashboard: G.Dashboard) -> str:
    """The dashboard as the JSON Grafana imports (keys sorted, two-space indent)."""
    return (
        json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"
    )


DASHBOARDS = {"cluster.json": cluster, "job.json": job}


def main() -> int:
    for name, build in DASHBOARDS.items():
        (HERE / name).write_text(as_json(build()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
