"""One meaning per option name: ``--since``/``--until`` take a time before now or a date in
every command; ``mail`` takes ``--dry-run`` as a flag and ``--mail-dir DIR`` like
``police``; the old spellings still work, with one deprecation line on standard error."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.cli.mail_cmd import NOTIFIER_KEY
from slurm_gpu.cli.mail_cmd import cli as mail_cli
from slurm_gpu.cli.when import parse_when
from slurm_gpu.errors import UsageError

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3d", NOW - 3 * 86400),
        ("12h", NOW - 12 * 3600),
        ("30m", NOW - 1800),
        ("2w", NOW - 14 * 86400),
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC).timestamp()),
        ("2026-11-01T08:00", datetime(2026, 11, 1, 8, tzinfo=UTC).timestamp()),
        ("2026-11-01T08:00+01:00", datetime(2026, 11, 1, 7, tzinfo=UTC).timestamp()),
    ],
)
def test_since_forms(text: str, expected: float) -> None:
    assert parse_when(text, now_s=NOW, utc=True) == expected


def test_a_bad_time_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not a date"):
        parse_when("yesterday", now_s=NOW, utc=True)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n')
    return cfg


@pytest.mark.parametrize(
    "args",
    [
        ["report", "weekly", "--since", "7d"],
        ["report", "weekly", "--since", "2w", "--until", "1w"],
        ["store", "export", "--since", "7d", "--until", "1d", "--out", "-"],
        ["store", "export", "--since", "2026-11-01", "--out", "-"],
    ],
)
def test_admin_commands_take_a_time_before_now(tmp_path: Path, args: list[str]) -> None:
    res = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), *args])
    # The store does not exist here: exit 6 shows the times were taken (a bad one is exit 2).
    assert res.exit_code == 6, res.output


class _Factory:
    def __init__(self) -> None:
        self.dirs: list[str | None] = []

    def __call__(self, settings: Any, dry_run_dir: str | None) -> Any:
        self.dirs.append(dry_run_dir)
        raise SystemExit(0)


def _mail(mp: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> tuple[Any, _Factory]:
    def no_exec(*a: Any, **k: Any) -> None:
        raise AssertionError(f"the fallback mail program was run: {a}")

    mp.setattr("slurm_gpu.cli.mail_cmd._exec_fallback", no_exec)
    factory = _Factory()
    res = CliRunner().invoke(
        mail_cli,
        ["--config", str(_config(tmp_path)), *args],
        obj={NOTIFIER_KEY: factory},
        env={"SLURM_JOB_ID": "1001", "SLURM_JOB_MAIL_TYPE": "Ended"},
    )
    return res, factory


def test_mail_dry_run_is_a_flag_with_mail_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "eml")
    res, factory = _mail(monkeypatch, tmp_path, "--dry-run", "--mail-dir", out, "-s", "x", "alice")
    assert res.exit_code == 0, res.output
    assert factory.dirs == [out]
    assert "deprecated" not in res.stderr


def test_mail_old_dry_run_dir_still_works_with_a_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "eml")
    res, factory = _mail(monkeypatch, tmp_path, "--dry-run", out, "-s", "x", "alice")
    assert res.exit_code == 0, res.output
    assert factory.dirs == [out]
    assert res.stderr.count("deprecated") == 1 and "--mail-dir" in res.stderr


def test_mail_policy_takes_since(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res, _ = _mail(monkeypatch, tmp_path, "--policy", "--since", "24h")
    assert res.exit_code == 0, res.output
    assert "waste_policy is off" in res.output and "deprecated" not in res.stderr
    old, _ = _mail(monkeypatch, tmp_path, "--policy", "24")
    assert old.exit_code == 0, old.output
    assert old.stderr.count("deprecated") == 1 and "--since 24h" in old.stderr
