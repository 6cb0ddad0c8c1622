"""Data files are found in a checkout and in an installed package alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_gpu import resources


def test_checkout_copy_is_used_when_present() -> None:
    assert (resources.data_dir("templates") / "gpueff").is_dir()
    assert (resources.data_dir("share") / "demo").is_dir()


def test_installed_copy_is_used_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "_CHECKOUT", tmp_path)
    assert resources.data_dir("templates") == Path(sys.prefix, "share", "slurm-gpu", "templates")
