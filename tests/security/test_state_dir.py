"""Attacks on the root collector's state directory and inbox (issue class 2).

Root's collector keeps its lock, ``done/``, ``quarantine/`` and the store in ``state_dir``.
Another account that can write there (or into the inbox) plants symlinks under the names root
opens; root must refuse them, never follow them. Each test drives the real ``Collector`` (or
``slurm-gpu collect``) with the unit tests' fake accounting.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.capture import spool
from slurm_gpu.cli.admin import cli
from slurm_gpu.collector import Collector, CollectorLock, CollectorOptions
from slurm_gpu.errors import ConfigError, StoreError
from slurm_gpu.store import Store

END = 1_700_000_100.0
VICTIM_TEXT = "root:$6$secret:19000:0:99999:7:::\n"


def _collector(root: Path, store: Store, accounting: FakeAccounting | None = None) -> Collector:
    return Collector(
        store=store,
        accounting=accounting or FakeAccounting(),
        spool_dir=str(root / "spool"),
        state_dir=str(root / "state"),
        options=CollectorOptions(done_retention_s=60.0),
        clock=lambda: END + 30,
    )


def _run(root: Path, accounting: FakeAccounting | None = None) -> object:
    with Store.open(f"sqlite:///{root}/db/store.db") as store:
        return _collector(root, store, accounting).run_once()


def _seal(root: Path, job_id: str, host: str = "node1") -> Path:
    js = spool.JobSpool(str(root / "spool"), job_id, host)
    js.create_dir()
    spool.write_record(js.record, make_node(job_id, host))
    return Path(js.record)


def _config(root: Path) -> Path:
    cfg = root / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{root}/spool"\nstate_dir = "{root}/state"\n'
        f'[store]\nurl = "sqlite:///{root}/db/store.db"\n'
    )
    return cfg


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_collect_lock_symlink_does_not_overwrite_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text(VICTIM_TEXT)
    state = tmp_path / "state"
    state.mkdir()
    (state / "collect.lock").symlink_to(victim)

    with contextlib.suppress(StoreError):
        CollectorLock(str(state)).acquire()
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "collect", "--once"])

    assert victim.read_text() == VICTIM_TEXT
    assert result.exit_code == StoreError.exit_code, result.output
    assert "symbolic link" in result.output
    assert (state / "collect.lock").is_symlink()


def test_done_symlink_does_not_make_root_delete_old_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    for name in ("etc", "home", "srv"):
        (outside / name).mkdir(parents=True)
        (outside / name / "keep").write_text("x")
        old = END - 30 * 86400
        os.utime(outside / name, (old, old))
    state = tmp_path / "state"
    state.mkdir()
    (state / "done").symlink_to(outside)
    before = _tree(outside)

    with contextlib.suppress(ConfigError):
        _run(tmp_path)

    assert _tree(outside) == before
    with pytest.raises(ConfigError, match="done"):
        _run(tmp_path)


def test_quarantine_symlink_gets_nothing_written_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    (state / "quarantine").symlink_to(outside)
    record = _seal(tmp_path, "300")
    record.write_text("{ not a record")

    with contextlib.suppress(ConfigError):
        _run(tmp_path)

    assert _tree(outside) == []
    assert record.read_text() == "{ not a record"
    with pytest.raises(ConfigError, match="quarantine"):
        _run(tmp_path)


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_state_dir_writable_by_others_is_refused_with_exit_code_3(
    tmp_path: Path, mode: int
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)

    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "collect", "--once"])

    assert result.exit_code == ConfigError.exit_code == 3, result.output
    assert "writable by group or others" in result.output
    assert not (state / "collect.lock").exists()
    with pytest.raises(ConfigError):
        _run(tmp_path)


def test_state_dir_below_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may rename state/ and put their own in its place
    (shared / "state").mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{shared}/state"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/db/store.db"\n'
    )

    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once"])

    assert result.exit_code == 3, result.output
    assert f"directory {shared} is writable by group or others" in result.output


def test_state_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "state").symlink_to(real)

    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "collect", "--once"])

    assert result.exit_code == 3, result.output
    assert "symbolic link" in result.output
    assert _tree(real) == []


def test_inbox_job_directory_symlink_is_not_followed(tmp_path: Path) -> None:
    # An account that may write the inbox links a job directory to root's files: root must
    # neither read them as records nor move them into quarantine.
    private = tmp_path / "root-only"
    private.mkdir()
    (private / "node1.record").write_text("root's data, not a record")
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "400").symlink_to(private)
    acc = FakeAccounting()
    acc.jobs["400"] = make_job("400")

    report = _run(tmp_path, acc)

    assert (private / "node1.record").read_text() == "root's data, not a record"
    assert report.quarantined == ()  # type: ignore[attr-defined]
    assert not (tmp_path / "state" / "quarantine").exists()


def test_inbox_record_symlink_is_not_read_or_moved(tmp_path: Path) -> None:
    secret = tmp_path / "secret.record"
    secret.write_text("{ root's file")
    (tmp_path / "spool" / "401").mkdir(parents=True)
    (tmp_path / "spool" / "401" / "node1.record").symlink_to(secret)
    acc = FakeAccounting()
    acc.jobs["401"] = make_job("401")

    report = _run(tmp_path, acc)

    assert secret.read_text() == "{ root's file"
    assert report.quarantined == ()  # type: ignore[attr-defined]
    assert report.ingested == ()  # type: ignore[attr-defined]


def test_store_file_planted_as_symlink_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    state = tmp_path / "state"
    state.mkdir()
    (state / "slurm-gpu.db").symlink_to(victim)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{state}"\n')

    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once"])

    assert result.exit_code == 3, result.output
    assert "slurm-gpu.db is a symbolic link" in result.output
    assert victim.read_text() == VICTIM_TEXT
