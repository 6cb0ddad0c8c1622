"""slurm-gpu ship: sealed records move from a node's local spool to the collector's inbox."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_spool import make_record

from slurm_gpu.capture.ship import ship
from slurm_gpu.capture.spool import JobSpool, read_record, write_record
from slurm_gpu.cli.admin import cli


def seal(spool: Path, job_id: str, host: str = "n1", running: bool = False) -> JobSpool:
    """A job's local spool files as the sampler and epilog leave them."""
    paths = JobSpool(str(spool), job_id, host)
    paths.create_dir()
    write_record(paths.record, make_record())
    for path in (paths.jsonl, paths.state):
        Path(path).write_text("{}\n")
    if running:
        Path(paths.pid).write_text("123\n")
    return paths


def test_ships_record_intact_and_tidies_the_node(tmp_path: Path) -> None:
    spool, inbox = tmp_path / "spool", tmp_path / "inbox"
    inbox.mkdir()
    paths = seal(spool, "42")
    original = Path(paths.record).read_bytes()

    result = ship(str(spool), str(inbox))

    assert result.shipped == ("42/n1",) and result.failed == ()
    shipped = inbox / "42" / "n1.record"
    assert shipped.read_bytes() == original
    assert read_record(str(shipped)) == make_record()
    assert stat.S_IMODE(shipped.stat().st_mode) == 0o600
    assert not os.path.exists(paths.job_dir), "node files of a shipped job are removed"


def test_running_job_is_left_alone(tmp_path: Path) -> None:
    spool, inbox = tmp_path / "spool", tmp_path / "inbox"
    inbox.mkdir()
    paths = seal(spool, "43", running=True)
    assert ship(str(spool), str(inbox)).shipped == ()
    assert os.path.exists(paths.record) and not (inbox / "43").exists()


def test_unwritable_inbox_keeps_the_record_and_goes_on(tmp_path: Path) -> None:
    spool, inbox = tmp_path / "spool", tmp_path / "inbox"
    inbox.mkdir()
    seal(spool, "44")
    (inbox / "44").write_text("a file where the job directory should be")
    ok = seal(spool, "45")

    result = ship(str(spool), str(inbox))

    assert result.shipped == ("45/n1",)
    assert [name for name, _ in result.failed] == ["44/n1"]
    assert os.path.exists(JobSpool(str(spool), "44", "n1").record), "not lost"
    assert not os.path.exists(ok.record)


def test_a_second_pass_ships_nothing_new(tmp_path: Path) -> None:
    spool, inbox = tmp_path / "spool", tmp_path / "inbox"
    inbox.mkdir()
    seal(spool, "46", host="n1")
    seal(spool, "46", host="n2")
    assert sorted(ship(str(spool), str(inbox)).shipped) == ["46/n1", "46/n2"]
    assert ship(str(spool), str(inbox)).shipped == ()
    assert sorted(os.listdir(inbox / "46")) == ["n1.record", "n2.record"]


def test_cli_requires_an_inbox(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n')
    result = CliRunner().invoke(cli, ["--config", str(config), "ship"])
    assert result.exit_code == 3 and "paths.inbox_dir" in result.output


@pytest.mark.parametrize("fails", [False, True])
def test_cli_exit_code_says_whether_everything_shipped(tmp_path: Path, fails: bool) -> None:
    spool, inbox = tmp_path / "spool", tmp_path / "inbox"
    inbox.mkdir()
    seal(spool, "47")
    if fails:
        (inbox / "47").write_text("blocker")
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nspool_dir = "{spool}"\ninbox_dir = "{inbox}"\n')
    result = CliRunner().invoke(cli, ["--config", str(config), "ship"])
    assert result.exit_code == (1 if fails else 0), result.output
