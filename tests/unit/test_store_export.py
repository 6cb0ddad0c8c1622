"""``slurm-gpu store export`` on a real SQLite file and the test PostgreSQL server: the period's
jobs or findings, the documented columns, CSV and Parquet, page by page."""

from __future__ import annotations

import csv
import dataclasses
import sys
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_fixtures
from store_fixtures import make_job, make_node

from slurm_gpu.cli.admin import cli as admin_cli
from slurm_gpu.errors import UsageError
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.export import FINDING_COLUMNS, JOB_COLUMNS, export
from slurm_gpu.store.prune import DAY_S

store_url = store_fixtures.store_url
_pg_url = store_fixtures._pg_url

END = 1_700_000_100.0
REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, float]


def _fill(store: Store, n: int, *, per_day: int = 1) -> None:
    bundles = [
        JobBundle(
            job=dataclasses.replace(
                make_job(str(100 + i), user=f"u{i % 3}"), end_s=END + (i // per_day) * DAY_S
            ),
            nodes=(make_node(str(100 + i), gpus=2),),
            telemetry=TELEMETRY_COMPLETE,
            findings=(
                _Finding("low_duty", "warning", 1, {"duty_mean_pct": 10.0}),
                _Finding("GPU_UNUSED", "critical", 6, {"gpus": 1.0}),
            ),
            analysis_version="a1",
        )
        for i in range(n)
    ]
    for i in range(0, len(bundles), 500):
        store.write_batch(bundles[i : i + 500], collected_at_s=1.0)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_export_csv_has_one_row_per_job_of_the_period_in_the_documented_columns(
    store_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "jobs.csv"
    with Store.open(store_url) as store:
        _fill(store, 5)  # days 0..4
        result = export(
            store.engine,
            str(out),
            since_s=END + 1 * DAY_S,
            until_s=END + 4 * DAY_S,  # exclusive: days 1, 2, 3
            page_jobs=2,
        )
    assert (result.jobs, result.rows, result.pages) == (3, 3, 2)
    with out.open() as f:
        header = next(csv.reader(f))
    assert header == [c.name for c in JOB_COLUMNS]
    rows = _read(out)
    assert [r["job_id"] for r in rows] == ["101", "102", "103"]
    r = rows[0]
    assert r["user"] == "u1" and r["state"] == "COMPLETED"
    assert r["gpu_count_seen"] == "2"
    assert float(r["gpu_util_mean_pct"]) > 0
    assert r["finding_codes"] == "low_duty;GPU_UNUSED"
    assert r["timeline_pruned_s"] == ""
    assert float(r["end_s"]) == END + DAY_S


def test_export_says_which_signal_ended_a_job(store_url: str, tmp_path: Path) -> None:
    """A job killed by a signal (the OOM killer's SIGKILL, a segmentation fault) exports its
    signal beside its exit code, as ``gpueff --json`` and the report show it."""
    out = tmp_path / "jobs.csv"
    killed = dataclasses.replace(
        make_job("300"), state="FAILED", exit_code=0, exit_signal=9, end_s=END
    )
    ok = dataclasses.replace(make_job("301"), exit_code=0, exit_signal=None, end_s=END + 1)
    with Store.open(store_url) as store:
        store.write_batch(
            [
                JobBundle(job=j, nodes=(), telemetry=TELEMETRY_COMPLETE, findings=())
                for j in (killed, ok)
            ],
            collected_at_s=1.0,
        )
        export(store.engine, str(out), since_s=0, until_s=END + 10)
    rows = {r["job_id"]: r for r in _read(out)}
    assert (rows["300"]["exit_code"], rows["300"]["exit_signal"]) == ("0", "9")
    assert (rows["301"]["exit_code"], rows["301"]["exit_signal"]) == ("0", "")


def test_export_findings_has_one_row_per_finding_in_order(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "findings.csv"
    with Store.open(store_url) as store:
        _fill(store, 3)
        result = export(
            store.engine, str(out), since_s=0, until_s=END + 10 * DAY_S, what="findings"
        )
    assert (result.jobs, result.rows) == (3, 6)
    rows = _read(out)
    assert list(rows[0]) == [c.name for c in FINDING_COLUMNS]
    assert [(r["job_id"], r["seq"], r["code"]) for r in rows[:2]] == [
        ("100", "0", "low_duty"),
        ("100", "1", "GPU_UNUSED"),
    ]
    assert rows[1]["cause"] == "6" and rows[0]["evidence"] == '{"duty_mean_pct":10.0}'


def test_export_parquet_round_trips_the_rows(store_url: str, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "jobs.parquet"
    with Store.open(store_url) as store:
        _fill(store, 4)
        export(
            store.engine, str(out), since_s=0, until_s=END + 10 * DAY_S, fmt="parquet", page_jobs=3
        )
    table = pq.read_table(out)
    assert table.column_names == [c.name for c in JOB_COLUMNS]
    assert table.num_rows == 4
    assert table.column("job_id").to_pylist() == ["100", "101", "102", "103"]
    assert table.column("gpu_count_seen").to_pylist() == [2, 2, 2, 2]


def test_export_parquet_without_pyarrow_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store, pytest.raises(UsageError) as err:
        export(store.engine, str(tmp_path / "x.parquet"), since_s=0, until_s=1, fmt="parquet")
    assert err.value.hint is not None and "slurm-gpu[export]" in err.value.hint


def test_export_memory_stays_flat_as_the_period_grows(tmp_path: Path) -> None:
    """Peak Python memory of an export of 3,000 jobs is within a small margin of that of 300:
    pages are written and dropped, never gathered."""
    url_small, url_big = f"sqlite:///{tmp_path}/small.db", f"sqlite:///{tmp_path}/big.db"
    peaks = []
    for url, n in ((url_small, 300), (url_big, 3000)):
        with Store.open(url) as store:
            _fill(store, n, per_day=1000)
            tracemalloc.start()
            export(
                store.engine,
                str(tmp_path / f"o{n}.csv"),  # always a new file: export never overwrites
                since_s=0,
                until_s=END + 9 * DAY_S,
                page_jobs=100,
            )
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    assert peaks[1] < peaks[0] * 1.5, peaks


def test_store_export_command_takes_dates_and_writes_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        _fill(store, 3)  # 2023-11-14 .. 2023-11-16 (UTC)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[store]\nurl = "{url}"\n')
    out = tmp_path / "o.csv"
    result = CliRunner().invoke(
        admin_cli,
        [
            "--config",
            str(cfg),
            "store",
            "export",
            "--since",
            "2023-11-15",
            "--until",
            "2023-11-16",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert [r["job_id"] for r in _read(out)] == ["101"]


def test_every_exported_column_is_documented() -> None:
    doc = (REPO / "docs" / "store.md").read_text()
    for c in (*JOB_COLUMNS, *FINDING_COLUMNS):
        assert f"`{c.name}`" in doc, c.name
