"""gpueff's cached reports: the collector's rendering is byte for byte what gpueff prints, the
cache answers only the caller's own jobs under the current key, and anything else (another
user, edited templates, other settings, a job stored again, an old store) falls back. Root,
whom Slurm shows every job, gets every cached report."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from test_gpueff_entry import fast_path_imports
from test_gpueff_owner import SGTEST1, SGTEST2, NeverAsked, _gpueff, _store

from slurm_gpu.cli import gpueff_entry
from slurm_gpu.config import load_settings
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.reportcache import read_cached, render_key
from slurm_gpu.store import Store
from slurm_gpu.store.urls import sqlite_path


def _config(state_dir: Path, extra: str = "") -> Path:
    cfg = state_dir / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{state_dir}"\n[gpueff]\nmin_elapsed_s = 30\n{extra}')
    return cfg


def _render(state_dir: Path) -> tuple[int, int]:
    settings = load_settings(str(state_dir / "config.toml"))
    with Store.open(settings.store_url) as store:
        return ReportPrerenderer(settings, store).refresh()


def _read(state_dir: Path, ids: list[str], uid: int, *, colour: bool = False) -> Any:
    settings = load_settings(str(state_dir / "config.toml"))
    path = sqlite_path(settings.store_url)
    assert path is not None
    return read_cached(path, ids, uid, render_key(settings.gpueff), colour=colour)


@pytest.fixture
def rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _store(
        tmp_path,
        F.job(),
        F.job(job_id="1002", job_id_display="1002", job_name="eval"),
        F.job(
            job_id="2005",
            job_id_display="2003_2",
            array_job_id="2003",
            array_task_id="2",
            job_name="sweep",
        ),
        F.job(job_id="3001", job_id_display="3001", user="sgtest2", uid=SGTEST2),
    )
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(_config(tmp_path)))
    monkeypatch.setenv("NO_COLOR", "1")
    assert _render(tmp_path) == (4, 4)
    return tmp_path


def as_uid(monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    monkeypatch.setattr(gpueff_entry.os, "getuid", lambda: uid)


@pytest.mark.parametrize("ids", [["1001"], ["2003_2"], ["1001", "1002"], ["1002", "1002"]])
def test_the_cached_text_is_what_the_full_command_prints(
    rendered: Path, monkeypatch: pytest.MonkeyPatch, ids: list[str]
) -> None:
    full = _gpueff(rendered, monkeypatch, NeverAsked(), SGTEST1, *ids)
    assert full.exit_code == 0, full.output
    texts = _read(rendered, ids, SGTEST1)
    assert texts is not None and "\n".join(texts) == full.output
    as_uid(monkeypatch, SGTEST1)
    assert gpueff_entry.fast_path(ids) == full.output


def test_the_colour_text_is_what_the_full_command_prints_in_colour(
    rendered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner
    from test_gpueff_owner import _settings

    from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
    from slurm_gpu.jobreport.readers import StoreAndSpoolReader

    reader = StoreAndSpoolReader(_settings(rendered))
    full = CliRunner().invoke(
        cli,
        ["--color", "1001"],
        obj={BACKENDS_KEY: (NeverAsked(), reader), CALLER_UID_KEY: SGTEST1},
        catch_exceptions=False,
        color=True,
    )
    assert full.exit_code == 0 and "\x1b[" in full.output
    assert _read(rendered, ["1001"], SGTEST1, colour=True) == [full.output]


@pytest.mark.parametrize(
    ("uid", "ids"),
    [
        (SGTEST2, ["1001"]),  # someone else's job
        (SGTEST1, ["3001"]),  # sgtest2's job, asked by sgtest1
        (SGTEST1, ["1001", "999"]),  # one id not cached: all take the full path
        (SGTEST1, ["2003"]),  # the whole array: accounting knows every task
        (SGTEST1, ["2005"]),  # the raw id of an array task is not how it is cached
        (SGTEST1, []),
    ],
)
def test_the_cache_answers_only_the_callers_own_jobs(
    rendered: Path, uid: int, ids: list[str]
) -> None:
    assert _read(rendered, ids, uid) is None


def test_root_gets_any_cached_report(rendered: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = _read(rendered, ["1001", "3001"], 0)
    assert texts is not None and 'Job 3001 "train-resnet"' in texts[1]
    as_uid(monkeypatch, 0)
    assert gpueff_entry.fast_path(["3001"]) == texts[1]


def test_a_plain_id_that_is_also_an_arrays_id_is_not_answered(rendered: Path) -> None:
    # Job 1001 exists as a plain job; a stored array whose id is 1001 makes "1001" ambiguous.
    _store(
        rendered,
        F.job(
            job_id="1009",
            job_id_display="1001_4",
            array_job_id="1001",
            array_task_id="4",
        ),
    )
    assert _read(rendered, ["1002"], SGTEST1) is not None
    assert _read(rendered, ["1001"], SGTEST1) is None


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_an_edited_template_invalidates_until_rendered_again(
    rendered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    override = rendered / "templates"
    override.mkdir()
    builtin = Path(__file__).resolve().parents[2] / "templates" / "gpueff" / "report.txt.j2"
    (override / "report.txt.j2").write_text(builtin.read_text())
    _config(rendered, f'template_dir = "{override}"\n')
    assert _read(rendered, ["1001"], SGTEST1) is None  # other settings: other key
    assert _render(rendered)[1] == 4
    before = _read(rendered, ["1001"], SGTEST1)
    assert before is not None
    (override / "report.txt.j2").write_text("SITE REPORT {{ r.job_id }}\n")
    _touch_later(override / "report.txt.j2")
    assert _read(rendered, ["1001"], SGTEST1) is None
    assert _render(rendered) == (4, 4)
    assert _read(rendered, ["1001"], SGTEST1) == ["SITE REPORT 1001\n"]
    as_uid(monkeypatch, SGTEST1)
    assert gpueff_entry.fast_path(["1001"]) == "SITE REPORT 1001\n"


def test_other_settings_give_another_key(rendered: Path) -> None:
    settings = load_settings(str(rendered / "config.toml"))
    key = render_key(settings.gpueff)
    assert render_key(settings.gpueff) == key
    assert render_key(replace(settings.gpueff, min_elapsed_s=60.0)) != key
    assert render_key(replace(settings.gpueff, template_dir=str(rendered))) != key
    assert render_key(replace(settings.gpueff, cache_reports=False)) == key  # not in the text


def test_storing_a_job_again_drops_its_report(rendered: Path) -> None:
    assert _read(rendered, ["1001"], SGTEST1) is not None
    _store(rendered, F.job(state="FAILED", exit_code=1))
    assert _read(rendered, ["1001"], SGTEST1) is None
    assert _read(rendered, ["1002"], SGTEST1) is not None
    assert _render(rendered) == (1, 1)
    texts = _read(rendered, ["1001"], SGTEST1)
    assert texts is not None and "FAILED" in texts[0]


def test_unsettled_and_root_jobs_get_no_report(tmp_path: Path) -> None:
    _config(tmp_path)
    _store(
        tmp_path,
        F.job(job_id="1", job_id_display="1", state="RUNNING", end_s=None),
        F.job(job_id="2", job_id_display="2", user="root", uid=0),
        F.job(job_id="3", job_id_display="3", uid=None),
    )
    assert _render(tmp_path) == (3, 0)


def test_cache_off_renders_nothing_and_is_not_read(
    rendered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _config(rendered, "cache_reports = false\n")
    assert _render(rendered) == (0, 0)
    as_uid(monkeypatch, SGTEST1)
    settings = load_settings(str(rendered / "config.toml"))
    assert gpueff_entry._cached(settings, ["1001"], SGTEST1) is None


def test_a_store_without_the_table_or_file_is_not_an_error(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE jobs (job_id TEXT, uid INTEGER, array_job_id TEXT)")
    assert read_cached(str(old), ["1"], SGTEST1, "k", colour=False) is None
    assert read_cached(str(tmp_path / "none.db"), ["1"], SGTEST1, "k", colour=False) is None


def test_the_publisher_never_raises_and_renders_only_settled_jobs(
    rendered: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(str(rendered / "config.toml"))

    class BrokenStore:
        def write_reports(self, reports: Any) -> None:
            raise OSError("disk full")

    assert ReportPrerenderer(settings, BrokenStore()).publish([F.job()]) == 0
    assert "rendering gpueff reports failed" in caplog.text
    with Store.open(settings.store_url) as store:
        p = ReportPrerenderer(settings, store, clock=lambda: 42.0)
        assert p.publish([F.job(), F.job(job_id="1002", state="RUNNING", end_s=None)]) == 1


def test_the_cached_path_imports_no_report_code(rendered: Path) -> None:
    heavy = (
        "click",
        "jinja2",
        "sqlalchemy",
        "pandas",
        "slurm_gpu.records",
        "slurm_gpu.jobreport.service",
    )
    assert fast_path_imports(rendered / "config.toml", ["1001"], heavy) == []
