"""The registry makes the Prometheus sources by their configured names, from the one
Prometheus setting the live view uses."""

from __future__ import annotations

import pytest

from slurm_gpu.config import parse_settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.sourcecaps import CAPABILITIES
from slurm_gpu.sources.prometheus import RECORD_NAMES
from slurm_gpu.sources.registry import make


@pytest.mark.parametrize("name", ["dcgm", "jobstats", "exporter"])
def test_each_prometheus_name_makes_its_source(name: str) -> None:
    settings = parse_settings({"live": {"prometheus_url": "http://127.0.0.1:9"}}, path=None)
    source = make(settings, name)
    assert source.capabilities.name == RECORD_NAMES[name]
    assert CAPABILITIES[RECORD_NAMES[name]] == source.capabilities


def test_a_prometheus_source_without_a_prometheus_url_is_a_config_error() -> None:
    settings = parse_settings({}, path=None)
    with pytest.raises(ConfigError) as err:
        make(settings, "dcgm")
    assert err.value.key == "live.prometheus_url"
