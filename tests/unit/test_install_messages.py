"""What a new site reads while installing: ``hooks install`` says which slurm.conf lines to
add and what to do next, ``config show`` prints the store URL in effect, and ``hooks install
--config`` takes a file path."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slurm_gpu.cli.admin import cli


def test_hooks_install_prints_the_slurm_conf_lines_and_the_next_step(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    dest = tmp_path / "hooks"
    res = CliRunner().invoke(cli, ["hooks", "install", "--dest", str(dest), "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert f"Prolog={dest}/slurm-gpu-prolog" in lines
    assert f"Epilog={dest}/slurm-gpu-epilog" in lines
    assert "PrologFlags=Alloc" in lines
    assert any("scontrol reconfigure" in ln for ln in lines)
    assert any("slurm-gpu doctor" in ln for ln in lines)


def test_hooks_install_config_must_be_a_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        cli, ["hooks", "install", "--dest", str(tmp_path / "h"), "--config", str(tmp_path)]
    )
    assert res.exit_code == 2, res.output
    assert "directory" in res.output


def test_config_show_prints_the_store_url_in_effect(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n')
    res = CliRunner().invoke(cli, ["--config", str(cfg), "config", "show"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("store.url "))
    assert f"sqlite:///{tmp_path}/state/slurm-gpu.db" in line, line
