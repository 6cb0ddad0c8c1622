"""Trust checks walk the path as configured (issue 27, point 3).

The trusted-file and state-directory checks once looked at ``realpath(path)``: a directory
owned by another account that holds a symbolic link on the configured path was never
examined, and the state directory was opened (and made) before it was checked. Now every
directory traversed is opened without following links relative to its checked parent, and
the descriptor checked is the one used. Runs as root (the accounts below must not be root).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu import trust
from slurm_gpu.collector.jobqueue import JobQueue
from slurm_gpu.collector.statedir import open_state_dir
from slurm_gpu.config import load_settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.trust import untrusted_reason

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")

OTHER = 65534  # nobody: "another account"


def _site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(root's directory holding root's config file, the file, another account's directory)."""
    tmp_path.chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    cfg = etc / "config.toml"
    cfg.write_text("[paths]\n")
    cfg.chmod(0o644)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER, OTHER)
    return etc, cfg, theirs


def test_config_link_in_another_accounts_directory_is_refused(tmp_path: Path) -> None:
    """The configured path is a link, in a directory another account owns, to root's good
    file: that account can point it anywhere at any time. realpath() saw only the target."""
    _etc, cfg, theirs = _site(tmp_path)
    (theirs / "config.toml").symlink_to(cfg)
    reason = untrusted_reason(str(theirs / "config.toml"))
    assert reason is not None and f"uid {OTHER}" in reason
    os.environ.pop("SLURM_GPU_CONFIG", None)
    with pytest.raises(ConfigError, match="not a trusted file"):
        load_settings(str(theirs / "config.toml"), trusted=True)
    # Root's own file on its own path is still trusted.
    assert untrusted_reason(str(cfg)) is None


def test_config_reached_through_a_second_link_level_is_refused(tmp_path: Path) -> None:
    """Variant: root's link (in root's directory) points to a link in another account's
    directory, which points back at root's file: two levels, the middle one theirs."""
    etc, cfg, theirs = _site(tmp_path)
    (theirs / "hop.toml").symlink_to(cfg)
    (etc / "site.toml").symlink_to(theirs / "hop.toml")
    assert untrusted_reason(str(etc / "site.toml")) is not None
    # The same two levels through root's directories only are followed.
    (etc / "hop.toml").symlink_to(cfg)
    (etc / "site2.toml").symlink_to(etc / "hop.toml")
    assert untrusted_reason(str(etc / "site2.toml")) is None


def test_directory_link_in_another_accounts_directory_is_refused(tmp_path: Path) -> None:
    """Variant: the link is a directory component of the path, not the file."""
    etc, _cfg, theirs = _site(tmp_path)
    (theirs / "conf.d").symlink_to(etc)
    assert untrusted_reason(str(theirs / "conf.d" / "config.toml")) is not None


def test_hard_link_in_another_accounts_directory_is_refused(tmp_path: Path) -> None:
    """Variant: a hard link to root's file, in another account's directory (they can replace
    the name by another file of root's they link there)."""
    _etc, cfg, theirs = _site(tmp_path)
    os.link(cfg, theirs / "hard.toml")
    assert untrusted_reason(str(theirs / "hard.toml")) is not None


def test_fifo_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    """Variant: a FIFO where the file is expected (root's, in root's directory): refused at
    once, never opened for a read that would wait for a writer."""
    etc, _cfg, _theirs = _site(tmp_path)
    os.mkfifo(etc / "fifo.toml", 0o644)
    reason = untrusted_reason(str(etc / "fifo.toml"))
    assert reason is not None and "not a regular file" in reason


def test_file_swapped_between_check_and_open_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Race between check and use: the name is replaced after it was looked at and before
    it is opened. The descriptor opened is compared with what was checked."""
    etc, cfg, _theirs = _site(tmp_path)
    other = etc / "other.toml"
    other.write_text("[paths]\n")
    real_open = os.open

    def swapping_open(
        path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
    ) -> int:
        if path == "config.toml" and dir_fd is not None:
            os.replace(other, cfg)  # what an attacker with write access would do
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(trust.os, "open", swapping_open)
    reason = untrusted_reason(str(cfg))
    assert reason is not None and "changed while being checked" in reason


def test_state_dir_through_a_link_in_another_accounts_directory_is_refused(
    tmp_path: Path,
) -> None:
    """The state directory's path crosses another account's directory through a link to a
    root-owned tree. It was opened following the link and judged by realpath(); and a
    missing one was made (as root, by name) before any check."""
    _etc, _cfg, theirs = _site(tmp_path)
    target = tmp_path / "root-tree"
    target.mkdir(mode=0o755)
    (target / "state").mkdir(mode=0o700)
    (theirs / "via").symlink_to(target)
    with pytest.raises(ConfigError, match=f"uid {OTHER}"):
        open_state_dir(str(theirs / "via" / "state"))
    # Missing: nothing is made where the link points.
    with pytest.raises(ConfigError):
        open_state_dir(str(theirs / "via" / "new-state"))
    assert not (target / "new-state").exists()


def test_state_dir_made_only_below_checked_directories(tmp_path: Path) -> None:
    """A missing state directory (and its missing parents) is made relative to checked
    descriptors; the result is root's, 0755, and usable."""
    tmp_path.chmod(0o755)
    fd = open_state_dir(str(tmp_path / "a" / "b" / "state"))
    try:
        st = os.fstat(fd)
        assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o755
    finally:
        os.close(fd)


def test_job_queue_through_a_link_in_another_accounts_directory_is_refused(
    tmp_path: Path,
) -> None:
    """Variant for the job queue root lists and empties: its path crosses another account's
    directory through a link."""
    _etc, _cfg, theirs = _site(tmp_path)
    target = tmp_path / "root-tree"
    (target / "queue").mkdir(parents=True, mode=0o700)
    (target / "queue" / "42").touch()
    (theirs / "via").symlink_to(target)
    with pytest.raises(ConfigError, match=f"uid {OTHER}"):
        JobQueue(str(theirs / "via" / "queue")).take()
    assert (target / "queue" / "42").exists()
