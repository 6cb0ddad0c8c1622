"""The NVML tests against the oldest and the newest nvidia-ml-py that setup.cfg admits.

The venv holds the newest (a plain install picks it); the oldest is installed with pip into
a cache directory once (a 40 kB wheel) and the driver-boundary tests run again in a child
interpreter that imports it first.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/unit/test_nvml_source.py", "tests/unit/test_nvml_driver_behaviour.py"]


def _pin() -> tuple[str, int]:
    """(lowest admitted version, major version excluded) from setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for line in cfg["options"]["install_requires"].splitlines():
        found = re.fullmatch(r"\s*nvidia-ml-py>=([\d.]+),<(\d+)\s*", line)
        if found:
            return found.group(1), int(found.group(2))
    raise AssertionError("no nvidia-ml-py pin in setup.cfg")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def test_installed_nvidia_ml_py_is_admitted_by_the_pin() -> None:
    lowest, below = _pin()
    installed = importlib.metadata.version("nvidia-ml-py")
    assert _key(lowest) <= _key(installed) and _key(installed)[0] < below


def test_driver_boundary_suite_passes_on_the_oldest_admitted_nvidia_ml_py() -> None:
    lowest, _below = _pin()
    target = Path(tempfile.gettempdir()) / f"slurm-gpu-nvidia-ml-py-{lowest}-{os.getuid()}"
    if not (target / "pynvml.py").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
             "--disable-pip-version-check", "--target", str(target), f"nvidia-ml-py=={lowest}"],
            check=True,
        )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    probe = (
        "import importlib.metadata as m, pynvml; print(m.version('nvidia-ml-py'), pynvml.__file__)"
    )
    version, path = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert version == lowest and Path(path).parent == target
    # The interpreter that runs the suite imports the oldest pynvml before pytest does, and
    # says so, so the suite cannot silently run on the venv's newest.
    child = (
        "import sys, importlib.metadata as m, pynvml, pytest; "
        f"assert m.version('nvidia-ml-py') == {lowest!r}, m.version('nvidia-ml-py'); "
        f"assert pynvml.__file__.startswith({str(target)!r}), pynvml.__file__; "
        "print('pynvml', m.version('nvidia-ml-py'), pynvml.__file__); "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', *sys.argv[1:]]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", child, *MODULES],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    out = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, out
    assert f"pynvml {lowest} {target}" in run.stdout, out
    # Every test of the driver-boundary suite ran there: none skipped or left uncollected.
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
         *MODULES],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    total = re.search(r"(\d+) tests? collected", collected)
    passed = re.search(r"(\d+) passed", run.stdout)
    assert total and passed and passed.group(1) == total.group(1), out
    assert "skipped" not in run.stdout, out
