"""Files root creates are readable only by whom they are for, and root never puts or follows
anything in a directory that other accounts share (the jinja2 bytecode cache in /tmp)."""

from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.jobreport import templating
from slurm_gpu.store.store import migrate_store

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checks what root creates")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def report_config(tmp_path: Path, extra: str = "") -> str:
    url = f"sqlite:///{tmp_path}/store.db"
    migrate_store(url)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{url}"\n[report]\nsite_name = "T"\n{extra}')
    return str(cfg)


def weekly(cfg: str, out: Path) -> str:
    res = CliRunner().invoke(
        cli, ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("fmt", ["html", "json"])
def test_weekly_report_is_not_readable_by_other_accounts(tmp_path: Path, fmt: str) -> None:
    old = os.umask(0o022)  # root's usual umask, under which files are created 0644
    try:
        cfg = report_config(tmp_path)
        out = tmp_path / f"weekly.{fmt}"
        out.write_text("last week's report, world-readable\n")
        out.chmod(0o644)
        args = ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--format", fmt]
        res = CliRunner().invoke(cli, [*args, "--out", str(out)])
        assert res.exit_code == 0, res.output
    finally:
        os.umask(old)
    assert mode(out) == 0o600
    assert out.stat().st_size > 100


def test_weekly_report_for_a_group_is_0640() -> None:
    other = next((g for g in grp.getgrall() if g.gr_gid != 0), None)
    if other is None:
        pytest.skip("no group other than root on this host")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cfg = report_config(tmp, f'output_group = "{other.gr_name}"\n')
        out = tmp / "weekly.html"
        weekly(cfg, out)
        assert mode(out) == 0o640 and out.stat().st_gid == other.gr_gid


def test_unknown_report_group_is_a_config_error(tmp_path: Path) -> None:
    cfg = report_config(tmp_path, 'output_group = "no-such-group-x"\n')
    out = tmp_path / "x.html"
    res = CliRunner().invoke(
        cli, ["--config", cfg, "report", "weekly", "--since", "2026-11-16", "--out", str(out)]
    )
    assert res.exit_code == 3 and "report.output_group" in res.output
    assert not out.exists()


# --------------------------------------------------------------------------- bytecode cache


@pytest.fixture()
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /tmp of our own (mode 1777) that the code under test takes for the system's."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its first answer
    return shared


def test_root_never_chmods_through_a_link_planted_in_shared_tmp(
    tmp_path: Path, shared_tmp: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o755)
    uid = os.geteuid()
    # jinja2's default cache directory name, and ours.
    for name in (f"_jinja2-cache-{uid}", f"slurm-gpu-jinja2-{uid}"):
        (shared_tmp / name).symlink_to(victim)
    cache = templating.compiled_cache()
    env = templating.environment("gpueff", cache=True)
    env.get_template(env.list_templates()[0])
    assert mode(victim) == 0o755
    assert cache is None and env.bytecode_cache is None
    assert list(victim.iterdir()) == []


def test_root_keeps_no_bytecode_cache_in_a_world_writable_directory(shared_tmp: Path) -> None:
    env = templating.environment("gpueff", cache=True)
    env.get_template(env.list_templates()[0])
    assert env.bytecode_cache is None
    assert list(shared_tmp.iterdir()) == []


def _cache_dir_as_nobody(shared: Path) -> str:
    code = (
        "from slurm_gpu.jobreport.templating import compiled_cache\n"
        "c = compiled_cache()\n"
        "print(getattr(c, 'directory', None))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO), "TMPDIR": str(shared), "PATH": "/usr/bin:/bin"},
        cwd="/",
        user=NOBODY,
        group=NOBODY,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def test_user_cache_is_private_and_a_planted_one_is_not_used(tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        # Another account (root here) made the user's cache directory first: not used.
        planted = shared / f"slurm-gpu-jinja2-{NOBODY}"
        planted.mkdir(mode=0o777)
        assert _cache_dir_as_nobody(shared) == "None"
        os.rmdir(planted)
        # The user's own directory, 0700: used.
        assert _cache_dir_as_nobody(shared) == str(planted)
        st = os.lstat(planted)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
