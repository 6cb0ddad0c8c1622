"""Config: typed parsing, errors that name the key and the file, provenance, the example file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.config import Settings, describe, load_settings, parse_settings
from slurm_gpu.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "share" / "config.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_when_default_file_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_GPU_CONFIG", raising=False)
    monkeypatch.setattr("slurm_gpu.config.loading.DEFAULT_PATH", "/nonexistent/slurm-gpu.toml")
    settings = load_settings()
    assert settings == Settings()
    assert settings.path is None
    assert all(src == "default" for _, _, src, _ in describe(settings))


def test_values_are_typed_and_sources_recorded(tmp_path: Path) -> None:
    path = write(tmp_path, '[telemetry]\ninterval_s = 5\nbackend = "virtual"\n')
    settings = load_settings(str(path))
    assert settings.telemetry.interval_s == 5.0
    assert isinstance(settings.telemetry.interval_s, float)
    assert settings.telemetry.backend == "virtual"
    assert settings.sources["telemetry.interval_s"] == str(path)
    assert settings.sources["telemetry.idle_threshold_pct"] == "default"


def test_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[hooks]\nsampler_nice = 5\n")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(path))
    assert load_settings().hooks.sampler_nice == 5


def test_missing_explicit_file_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_GPU_CONFIG", "/nonexistent/x.toml")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "/nonexistent/x.toml" in str(info.value)
    assert info.value.hint


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('[telemetry]\ninterval_s = "ten"\n', "telemetry.interval_s", "must be a number"),
        ("[telemetry]\ninterval_s = 0\n", "telemetry.interval_s", "at least"),
        ('[telemetry]\nbackend = "dcgm"\n', "telemetry.backend", "must be one of"),
        ("[telemetry]\ntimeline_points = 2.5\n", "telemetry.timeline_points", "whole number"),
        ("[telemetry]\nintervall_s = 3\n", "telemetry.intervall_s", "unknown key"),
        ("[telemetri]\n", "telemetri", "unknown section"),
        ("telemetry = 3\n", "telemetry", "must be a table"),
    ],
)
def test_bad_values_name_key_and_file(tmp_path: Path, text: str, key: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    message = str(info.value)
    assert info.value.key == key
    assert str(path) in message and key in message and words in message


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[telemetry\ninterval_s = 3\n")
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    assert str(path) in str(info.value) and "TOML" in str(info.value)


def test_example_config_covers_every_key_and_parses() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    settings = parse_settings(data, path=str(EXAMPLE))
    declared = {key for key, *_ in describe(settings)}
    in_file = {f"{section}.{key}" for section, table in data.items() for key in table}
    assert declared == in_file, (
        f"missing from example: {sorted(declared - in_file)}; "
        f"unknown in example: {sorted(in_file - declared)}"
    )


def test_config_show_prints_value_and_source(tmp_path: Path) -> None:
    path = write(tmp_path, "[telemetry]\ninterval_s = 2\n")
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "show"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("telemetry.interval_s"))
    assert "2.0" in line and str(path) in line
    assert "# default" in next(
        x for x in result.output.splitlines() if x.startswith("telemetry.backend")
    )


def test_config_check_bad_value_exits_3_with_one_line_and_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "[telemetry]\ninterval_s = -1\n")
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert result.exit_code == 3
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("slurm-gpu: ") and "telemetry.interval_s" in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.output


def test_example_file_is_the_generated_one() -> None:
    from slurm_gpu.config import example_toml

    assert EXAMPLE.read_text() == example_toml(), "run: slurm-gpu config example > " + str(EXAMPLE)


def test_a_missing_named_file_hints_at_the_installed_command(tmp_path: Path) -> None:
    """An installed package has no share/ of the checkout: the hint names the command that
    writes the example, with the path that was asked for."""
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as err:
        load_settings(str(missing), trusted=False)
    assert err.value.hint is not None
    assert f"slurm-gpu config example > {missing}" in err.value.hint
    assert "share/" not in err.value.hint


def test_config_show_hides_the_passwords_of_urls(tmp_path: Path) -> None:
    """``store.url`` may hold the collector's password (docs/store.md); ``config show`` is
    pasted into tickets: it printed it whole, in text and in JSON."""
    path = write(
        tmp_path,
        '[store]\nurl = "postgresql+psycopg://collector:s3cret@db.example.org/slurmgpu"\n'
        '[live]\nprometheus_url = "http://admin:pr0m@prom.example.org:9090"\n',
    )
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["--config", str(path), "config", "show", *extra])
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.output and "pr0m" not in result.output, result.output
        assert "collector:***@db.example.org" in result.output
        assert "admin:***@prom.example.org:9090" in result.output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://u:p%40ss@h:5432/db?sslmode=require",
            "postgresql+psycopg://u:***@h:5432/db?sslmode=require",
        ),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("http://prom:9090", "http://prom:9090"),
        ("sqlite:////var/lib/x.db", "sqlite:////var/lib/x.db"),
        ("not a url", "not a url"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    from slurm_gpu.textsafe import without_password

    assert without_password(url) == shown


def test_prometheus_errors_hide_the_urls_password() -> None:
    """An unreachable Prometheus is named in errors that reach the admin's terminal and logs
    (``doctor`` printed ``Prometheus at http://admin:promPW@prom:9090 is unreachable``)."""
    import urllib.error

    from slurm_gpu.prometheus.client import PrometheusClient, PrometheusUnavailableError

    def refused(url: str, timeout_s: float) -> bytes:
        raise urllib.error.URLError("connection refused")

    client = PrometheusClient("http://admin:pr0m@prom:9090", 1.0, fetch=refused)
    with pytest.raises(PrometheusUnavailableError) as caught:
        client.query("up")
    said = caught.value.message + (caught.value.hint or "")
    assert "pr0m" not in said and "admin:***@prom:9090" in said
    assert client.shown_url == "http://admin:***@prom:9090"
