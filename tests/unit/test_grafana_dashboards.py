"""The Grafana dashboards in ``share/grafana/`` (issue 30, point 2): the JSON files are what
grafanalib builds from ``share/grafana/dashboards.py``, they pass a JSON-schema check of the
dashboard fields Grafana reads, every variable a query uses is defined, every series a
Prometheus query names is one the exporter writes or a recording rule records, and the live
policy's SQL runs on a real store. ``tests/integration/test_grafana_cluster.py`` runs the
Prometheus queries against the test cluster."""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from slurm_gpu.live.exposition import GPU_METRICS, JOB_METRICS
from slurm_gpu.store import Store

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "share" / "grafana"
RULES = REPO / "share" / "prometheus" / "slurm-gpu.rules.yml"


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards", GRAFANA / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


#: The fields Grafana's dashboard model (schemaVersion 16 and later) requires of what it
#: imports, with their types: a check of structure, not of every option.
_TARGET = {
    "type": "object",
    "required": ["refId"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string"},
        "rawSql": {"type": "string"},
        "legendFormat": {"type": "string"},
        "format": {"enum": ["time_series", "table"]},
        "instant": {"type": "boolean"},
    },
    # A PromQL query or an SQL one (grafanalib's SQL target also carries an empty expr).
    "anyOf": [
        {"required": ["expr"], "properties": {"expr": {"minLength": 1}}},
        {"required": ["rawSql"], "properties": {"rawSql": {"minLength": 1}}},
    ],
}
SCHEMA = {
    "type": "object",
    "required": ["title", "uid", "panels", "templating", "time", "schemaVersion", "tags"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 16},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type", "query"],
                        "properties": {
                            "name": {"type": "string", "pattern": "^[a-z_]+$"},
                            "type": {"enum": ["query", "custom", "datasource", "constant"]},
                        },
                    },
                }
            },
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos", "targets", "datasource"],
                "properties": {
                    "id": {"type": "integer"},
                    "type": {"enum": ["timeseries", "stat", "table"]},
                    "title": {"type": "string", "minLength": 1},
                    "datasource": {"type": "string", "pattern": r"^\$\{[a-z_]+\}$"},
                    "gridPos": {
                        "type": "object",
                        "required": ["h", "w", "x", "y"],
                        "properties": {
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                        },
                    },
                    "targets": {"type": "array", "minItems": 1, "items": _TARGET},
                },
            },
        },
    },
}


def test_json_files_are_what_grafanalib_builds() -> None:
    b = builder()
    assert set(dashboards()) == set(b.DASHBOARDS) == {"cluster.json", "job.json"}
    for name, build in b.DASHBOARDS.items():
        assert (GRAFANA / name).read_text() == b.as_json(build()), (
            f"{name} is stale: run python share/grafana/dashboards.py"
        )


@pytest.mark.parametrize("name", ["cluster.json", "job.json"])
def test_dashboard_passes_the_schema_and_panels_do_not_overlap(name: str) -> None:
    d = dashboards()[name]
    jsonschema.validate(d, SCHEMA)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])


def _queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (p["datasource"], t.get("expr") or t.get("rawSql") or "")
        for p in d["panels"]
        for t in p["targets"]
    ]


@pytest.mark.parametrize("name", ["cluster.json", "job.json"])
def test_every_variable_used_is_defined(name: str) -> None:
    d = dashboards()[name]
    defined = {v["name"] for v in d["templating"]["list"]} | {"__rate_interval"}
    used: set[str] = set()
    for source, query in _queries(d):
        used |= set(re.findall(r"\$\{?([a-z_]+)\}?", source + " " + query))
    for p in d["panels"]:
        used |= set(re.findall(r"\$([a-z_]+)", p.get("description") or ""))
    assert used <= defined, used - defined


def test_job_view_has_a_job_id_variable_from_the_exporter() -> None:
    [var] = [v for v in dashboards()["job.json"]["templating"]["list"] if v["name"] == "job_id"]
    assert var["type"] == "query"
    assert var["query"] == "label_values(slurm_gpu_job_gpus, job_id)"
    exprs = [q for s, q in _queries(dashboards()["job.json"]) if s == "${prometheus}"]
    assert exprs and all('job_id="$job_id"' in e for e in exprs)


def test_every_series_named_is_exported_or_recorded() -> None:
    exported = {m.name for m in (*JOB_METRICS, *GPU_METRICS)}
    recorded = set(re.findall(r"^\s*- record: (\S+)$", RULES.read_text(), re.MULTILINE))
    assert len(recorded) >= 7
    named: set[str] = set()
    for d in dashboards().values():
        for source, query in _queries(d):
            if source == "${prometheus}":
                named |= set(re.findall(r"\bslurm_gpu_[a-z_:0-9]+", query))
    for v in dashboards()["job.json"]["templating"]["list"]:
        named |= set(re.findall(r"\bslurm_gpu_[a-z_:0-9]+", str(v["query"])))
    assert named, "no series found"
    assert named <= exported | recorded, named - exported - recorded
    # Every recording rule the live view keeps is on a dashboard.
    assert recorded - {"slurm_gpu_job:sample_age:max_seconds"} <= named


def test_live_policy_sql_reads_the_stores_actions(tmp_path: Path) -> None:
    from slurm_gpu.store.liveactions import LiveAction, record_actions

    url = f"sqlite:///{tmp_path}/s.db"
    with Store.open(url) as store:
        record_actions(
            store.engine,
            [
                LiveAction(
                    job_id="77",
                    rule="idle",
                    action="warned",
                    user="sgtest1",
                    account="research",
                    at_s=1_800_000_000.0,
                    gpus=2,
                    idle_gpu_s=7200.0,
                    detail="",
                )
            ],
        )
    [panel] = [p for p in dashboards()["cluster.json"]["panels"] if p["datasource"] == "${store}"]
    sql = panel["targets"][0]["rawSql"]
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = conn.execute(sql).fetchall()
    assert rows == [(1_800_000_000_000.0, "77", "sgtest1", "research", "idle", "warned", 2, 2.0)]
