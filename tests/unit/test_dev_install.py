"""The development install (``make venv``) starts interpreters as a wheel install does.

setuptools' default editable install adds an import hook that a ``.pth`` file imports in every
interpreter of the virtualenv (with ``pathlib``, ``importlib.util`` and what they import),
which no wheel install has. The hooks, ``gpueff`` and every benchmark start interpreters from
that virtualenv, so the development install is made in setuptools' ``compat`` editable mode: a
plain path in a ``.pth`` file (docs/performance.md, "The development install's start-up").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fresh_interpreter() -> dict[str, object]:
    """What a bare interpreter of this virtualenv has imported and hooked once ``site`` ran."""
    code = (
        "import json, sys; print(json.dumps({'modules': sorted(sys.modules), "
        "'meta_path': [type(f).__name__ if not isinstance(f, type) else f.__name__ "
        "for f in sys.meta_path]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def _installed_from_checkout() -> bool:
    import slurm_gpu

    return Path(slurm_gpu.__file__).resolve().parent == REPO / "slurm_gpu"


def test_makefile_installs_in_compat_editable_mode() -> None:
    text = (REPO / "Makefile").read_text()
    assert "editable_mode=compat" in text


@pytest.mark.skipif(
    not _installed_from_checkout(), reason="slurm_gpu not installed from this checkout"
)
def test_the_virtualenv_starts_without_an_import_hook() -> None:
    seen = _fresh_interpreter()
    modules = seen["modules"]
    assert isinstance(modules, list)
    hooks = [m for m in modules if m.startswith("__editable__")]
    assert hooks == [], f"an editable install's import hook runs at every start: {hooks}"
    assert "pathlib" not in modules
    meta_path = seen["meta_path"]
    assert isinstance(meta_path, list)
    assert not any("Editable" in name for name in meta_path)
    # And the package is still found, from the checkout.
    found = subprocess.run(
        [sys.executable, "-c", "import slurm_gpu; print(slurm_gpu.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()
    assert Path(found).resolve() == REPO / "slurm_gpu" / "__init__.py"
