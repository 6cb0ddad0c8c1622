"""share/dev/importgraph.py: the import graph's figures (modules, layers, upward imports, loops)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "share" / "dev" / "importgraph.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("importgraph", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path, files: dict[str, str]) -> None:
    (root / "pyproject.toml").write_text(
        "[[tool.importlinter.contracts]]\n"
        'name = "layers"\ntype = "layers"\ncontainers = ["slurm_gpu"]\n'
        'layers = ["top", "mid | side", "low"]\n'
    )
    for rel, text in {"slurm_gpu/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_an_upward_lazy_import_is_counted_and_closes_a_loop(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "slurm_gpu/top/__init__.py": "",
            "slurm_gpu/top/a.py": "from slurm_gpu.mid import b\n",
            "slurm_gpu/mid/__init__.py": "",
            "slurm_gpu/mid/b.py": "from slurm_gpu.low.c import f\n",
            "slurm_gpu/low/__init__.py": "",
            # Inside a function: still a dependency, and against the declared order.
            "slurm_gpu/low/c.py": "def f():\n    from slurm_gpu.top import a\n    return a\n",
            "slurm_gpu/side.py": "import slurm_gpu.low.c\n",
        },
    )
    figures, units, _ = _load().figures_of(tmp_path)
    assert units == ["slurm_gpu.low", "slurm_gpu.mid", "slurm_gpu.side", "slurm_gpu.top"]
    assert figures["upward imports"] == ["slurm_gpu.low.c -> slurm_gpu.top.a"]
    assert figures["module loops"] == [["slurm_gpu.low.c", "slurm_gpu.mid.b", "slurm_gpu.top.a"]]
    assert figures["unit loops"] == [["slurm_gpu.low", "slurm_gpu.mid", "slurm_gpu.top"]]
    assert figures["units outside the declared layers"] == []


def test_a_clean_tree_has_floors_and_no_climb(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "slurm_gpu/top.py": "import slurm_gpu.mid\n",
            "slurm_gpu/mid.py": "from . import low\n",
            "slurm_gpu/low.py": "",
            "slurm_gpu/extra.py": "",
        },
    )
    figures, _, edges = _load().figures_of(tmp_path)
    assert figures["floors"] == 3
    assert figures["upward imports"] == []
    assert figures["module loops"] == [] and figures["unit loops"] == []
    assert figures["units outside the declared layers"] == ["slurm_gpu.extra"]
    assert edges["slurm_gpu.mid"] == {"slurm_gpu.low"}


def test_the_project_itself_has_no_climb_and_no_loop() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, check=True
    )
    figures = json.loads(out.stdout)
    assert figures["modules"] > 100
    assert figures["upward imports"] == []
    assert figures["module loops"] == [] and figures["unit loops"] == []
    assert figures["units outside the declared layers"] == []
