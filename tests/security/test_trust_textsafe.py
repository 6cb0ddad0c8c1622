"""The two shared defences: trusted configuration paths and user-text cleaning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.errors import ConfigError
from slurm_gpu.textsafe import REPLACEMENT, clean_user_text
from slurm_gpu.trust import require_trusted_file, untrusted_reason


def _tree(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    f = d / "config.toml"
    f.write_text("")
    f.chmod(0o644)
    return f


def test_config_in_root_owned_tree_is_trusted(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    f = _tree(tmp_path)
    assert untrusted_reason(str(f)) is None
    assert require_trusted_file(str(f)) == os.path.realpath(f)


def test_group_writable_config_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    f = _tree(tmp_path)
    f.chmod(0o664)
    with pytest.raises(ConfigError, match="writable by group or others"):
        require_trusted_file(str(f))


def test_config_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    f = _tree(tmp_path)
    os.chown(f, 65534, 65534)
    assert "owned by uid 65534" in (untrusted_reason(str(f)) or "")


def test_config_in_world_writable_directory_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    f = _tree(tmp_path)
    f.parent.chmod(0o777)
    assert "writable by group or others" in (untrusted_reason(str(f)) or "")


def test_symlink_to_users_file_is_judged_by_its_target(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    user_dir = tmp_path / "home"
    user_dir.mkdir()
    evil = user_dir / "x.toml"
    evil.write_text("")
    os.chown(evil, 65534, 65534)
    link = _tree(tmp_path).parent / "link.toml"
    link.symlink_to(evil)
    assert untrusted_reason(str(link)) is not None


def test_terminal_escape_bidi_and_newlines_are_replaced() -> None:
    dirty = "job\x1b]0;pwned\x07\r\nBcc: x@y\u202etxt.exe\x9b"
    clean = clean_user_text(dirty)
    assert "\x1b" not in clean and "\n" not in clean and "\r" not in clean
    assert "\u202e" not in clean and "\x9b" not in clean
    assert clean.count(REPLACEMENT) == 6


def test_cleaning_bounds_length() -> None:
    assert len(clean_user_text("a" * 5000, 100)) == 100
    assert clean_user_text("plain name-1.0") == "plain name-1.0"


def test_a_commands_message_keeps_its_lines_apart_and_ends_clean() -> None:
    from slurm_gpu.textsafe import clean_command_message

    # Seen: "slurm_load_jobs error: Socket timed out on send/recv operation\ufffd", the
    # newline squeue ends its message with turned into the replacement mark.
    assert clean_command_message("squeue: error: timed out\n") == "squeue: error: timed out"
    assert clean_command_message("a\n\n  b \r\n") == "a; b"
    assert clean_command_message("\x1b[31mred\x1b[0m\n") == f"{REPLACEMENT}[31mred{REPLACEMENT}[0m"
    assert clean_command_message("") == "no message"
    assert len(clean_command_message("x" * 500, 200)) == 200


def test_the_live_views_slurm_errors_end_clean() -> None:
    from slurm_gpu.accounting.runner import CommandResult
    from slurm_gpu.errors import AccountingError
    from slurm_gpu.live.allocation import running_gpu_jobs

    def runner(argv: object, **kw: object) -> CommandResult:
        message = "slurm_load_jobs error: Socket timed out on send/recv operation\n"
        return CommandResult(1, b"", message)

    with pytest.raises(AccountingError) as caught:
        running_gpu_jobs(runner, "", 5.0)  # type: ignore[arg-type]
    assert str(caught.value).endswith("Socket timed out on send/recv operation"), caught.value
