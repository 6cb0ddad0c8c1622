"""Privileged entry points take nothing from the caller: not its working directory, not its
PYTHON* variables, not a configuration file that another account can write.

The hooks are run as slurmd runs them (a subprocess with Slurm's variables), the wrappers as
`slurm-gpu hooks install` renders them, the collector and ship through the real CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.capture.spool import JobSpool, read_pidfile, read_record
from slurm_gpu.cli.admin import cli as admin_cli
from slurm_gpu.config import load_settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.hooks.common import short_hostname
from slurm_gpu.telemetry.virtual_device import create_gpus

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="privileged entry points run as root")


def write_config(tmp: Path, name: str = "slurm-gpu.toml", **paths: str) -> Path:
    vdir = tmp / "vgpu"
    if not vdir.exists():
        create_gpus(vdir, 2)
    spool = paths.get("spool", f"{tmp}/spool")
    log = paths.get("log", f"{tmp}/log/hooks.log")
    cfg = tmp / name
    cfg.write_text(
        f'[paths]\nspool_dir = "{spool}"\nstate_dir = "{tmp}/state"\nlog_file = "{log}"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = 0.1\n'
        'checkpoint_interval_s = 1\n[accounting]\nsacct_path = "/bin/false"\n'
    )
    cfg.chmod(0o644)
    return cfg


@pytest.fixture()
def stop_samplers(tmp_path: Path) -> Iterator[None]:
    """Whatever a test made start, no sampler outlives it."""
    yield
    for pidfile in tmp_path.glob("**/*.pid"):
        pid = read_pidfile(str(pidfile))
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- wrappers


def install_wrappers(tmp: Path, cfg: Path) -> Path:
    dest = tmp / "hooks"
    result = CliRunner().invoke(
        admin_cli, ["hooks", "install", "--dest", str(dest), "--config", str(cfg)]
    )
    assert result.exit_code == 0, result.output
    return dest


def plant_package(where: Path, marker: Path) -> None:
    """A `slurm_gpu` package, a sitecustomize and a usercustomize that each leave a mark."""
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (where / "slurm_gpu" / "hooks").mkdir(parents=True)
    (where / "slurm_gpu" / "__init__.py").write_text(code)
    (where / "slurm_gpu" / "hooks" / "__init__.py").write_text(code)
    (where / "slurm_gpu" / "hooks" / "__main__.py").write_text(code)
    (where / "sitecustomize.py").write_text(code)
    (where / "usercustomize.py").write_text(code)


def test_planted_package_in_cwd_or_pythonpath_never_runs_as_root(
    tmp_path: Path, stop_samplers: None
) -> None:
    cfg = write_config(tmp_path)
    dest = install_wrappers(tmp_path, cfg)
    planted = tmp_path / "var-tmp"
    planted.mkdir()
    marker = tmp_path / "marker"
    plant_package(planted, marker)
    env = {
        "SLURM_JOB_ID": "501",
        "SLURM_JOB_GPUS": "0",
        "SLURM_JOB_UID": "0",
        "PYTHONPATH": str(planted),
        "PYTHONSTARTUP": str(planted / "sitecustomize.py"),
        "PYTHONUSERBASE": str(planted),
    }
    for hook in ("prolog", "epilog"):
        proc = subprocess.run(
            [str(dest / f"slurm-gpu-{hook}")], cwd=planted, env=env, timeout=60, check=False
        )
        assert proc.returncode == 0
    assert not marker.exists(), marker.read_text()
    # The prolog really ran and started the sampler (whose environment came from the wrapper),
    # and the epilog sealed its record: the planted code had every chance to run.
    assert read_record(JobSpool(f"{tmp_path}/spool", "501", short_hostname()).record).gpus


def test_inherited_config_variable_cannot_override_the_installed_one(
    tmp_path: Path, stop_samplers: None
) -> None:
    cfg = write_config(tmp_path)
    dest = install_wrappers(tmp_path, cfg)
    other = tmp_path / "other"
    other.mkdir()
    evil = write_config(other, spool=f"{other}/spool")
    env = {"SLURM_JOB_ID": "502", "SLURM_JOB_GPUS": "0", "SLURM_GPU_CONFIG": str(evil)}
    for hook in ("prolog", "epilog"):
        subprocess.run([str(dest / f"slurm-gpu-{hook}")], env=env, timeout=60, check=False)
    assert not (other / "spool").exists()
    assert read_record(JobSpool(f"{tmp_path}/spool", "502", short_hostname()).record).gpus


# --------------------------------------------------------------------------- trusted config


def make_untrusted(cfg: Path, how: str) -> None:
    if how == "group_writable":
        cfg.chmod(0o664)
    elif how == "owned_by_another_user":
        os.chown(cfg, NOBODY, NOBODY)
    elif how == "in_a_directory_others_can_write":
        cfg.parent.chmod(0o777)
    else:
        raise AssertionError(how)


UNTRUSTED = ["group_writable", "owned_by_another_user", "in_a_directory_others_can_write"]


@pytest.mark.parametrize("how", UNTRUSTED)
def test_hooks_ignore_a_config_file_another_account_can_write(
    tmp_path: Path, how: str, stop_samplers: None
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    cfg = write_config(conf_dir, spool=f"{tmp_path}/spool", log=f"{tmp_path}/victim/owned.log")
    make_untrusted(cfg, how)
    env = {
        "SLURM_GPU_CONFIG": str(cfg),
        "SLURM_JOB_ID": "503",
        "SLURM_JOB_GPUS": "0",
        "SLURM_JOB_UID": "0",
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
    }
    for hook in ("prolog", "epilog"):
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_gpu.hooks", hook],
            cwd=REPO,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0
    # Nothing was run from it: no spool, no sampler, and not even its log file was created.
    assert not (tmp_path / "spool").exists()
    assert not (tmp_path / "victim").exists()


def test_sampler_refuses_a_config_file_another_account_can_write(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    make_untrusted(cfg, "group_writable")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_gpu.hooks.sampler",
            "--job-id",
            "504",
            "--gpus",
            "GPU-x",
            "--config",
            str(cfg),
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert not (tmp_path / "spool").exists()


@pytest.mark.parametrize("how", UNTRUSTED)
@pytest.mark.parametrize(
    "command", [["collect", "--once", "--no-missing"], ["ship"], ["config", "show"]]
)
def test_root_cli_refuses_a_config_file_another_account_can_write(
    tmp_path: Path, how: str, command: list[str]
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    cfg = write_config(conf_dir)
    make_untrusted(cfg, how)
    result = CliRunner().invoke(admin_cli, ["--config", str(cfg), *command])
    assert result.exit_code == 3, result.output
    assert "not a trusted file" in result.output and "hint:" in result.output
    assert not (tmp_path / "state").exists()


def test_environment_cannot_point_the_collector_at_an_untrusted_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_config(tmp_path)
    make_untrusted(cfg, "owned_by_another_user")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    result = CliRunner().invoke(admin_cli, ["collect", "--once", "--no-missing"])
    assert result.exit_code == 3, result.output
    assert "not a trusted file" in result.output


def test_trusted_config_still_loads(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    settings = load_settings(str(cfg), trusted=True)
    assert settings.path == str(cfg) and settings.telemetry.backend == "virtual"


def test_missing_default_file_still_means_defaults_for_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SLURM_GPU_CONFIG", raising=False)
    monkeypatch.setattr("slurm_gpu.config.loading.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    assert load_settings(trusted=True).path is None


def test_ordinary_user_reads_their_own_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpueff run by a user is not privileged: a config the user can write is theirs to use."""
    cfg = write_config(tmp_path)
    make_untrusted(cfg, "group_writable")
    with pytest.raises(ConfigError, match="not a trusted file"):
        load_settings(str(cfg))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert load_settings(str(cfg)).path == str(cfg)
