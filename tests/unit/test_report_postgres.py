"""The weekly report's statements on PostgreSQL: the same generated weeks give the same report
as on SQLite (the grouped, streamed statements are written once for both)."""

from __future__ import annotations

import math
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gen_week
import store_fixtures

from slurm_gpu.store.store import Store
from slurm_gpu.weekly.aggregate import build_report
from slurm_gpu.weekly.jsonout import to_document
from slurm_gpu.weekly.model import Period

pytestmark = pytest.mark.postgres

_pg_url = store_fixtures._pg_url
WEEK_S = 7 * 86400.0
SINCE = gen_week.DEFAULT_SINCE_S


def _fill(url: str) -> None:
    gen_week.generate(url, 3000, SINCE, seed=5)
    gen_week.generate(url, 1500, SINCE - WEEK_S, seed=6, id_offset=3000)
    gen_week.generate(url, 500, SINCE - 4 * WEEK_S, seed=7, id_offset=4500)


def _report(url: str) -> dict[str, Any]:
    with Store.open(url, migrate=False) as store:
        report = build_report(store.engine, Period(SINCE, SINCE + WEEK_S), now_s=0.0)
    return to_document(report)


def _same(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two documents differ (floats compared to 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path}: keys"]
        return [p for k in a for p in _same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} != {len(b)} items"]
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _same(x, y, f"{path}[{i}]")
        ]
    if isinstance(a, float) and isinstance(b, float | int):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_postgresql_gives_the_report_sqlite_gives(tmp_path: Path, _pg_url: str) -> None:
    lite = f"sqlite:///{tmp_path}/week.db"
    _fill(lite)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    store_fixtures._pg_exec(_pg_url, f"CREATE SCHEMA {schema}")
    try:
        pg = store_fixtures._schema_url(_pg_url, schema)
        _fill(pg)
        want, got = _report(lite), _report(pg)
    finally:
        store_fixtures._pg_exec(_pg_url, f"DROP SCHEMA {schema} CASCADE")
    assert want["report"]["headline"]["jobs"] == 3000
    assert _same(want, got) == []
