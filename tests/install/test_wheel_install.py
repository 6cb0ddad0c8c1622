"""The README's install path, from a release of this repository: ``make dist`` builds the
wheel and the sdist, a fresh virtualenv installs the wheel by file (its dependencies from the
package index), and both commands run from it, templates found under the install's prefix.

No cluster is needed; the package index must be reachable (CI's is: ``make venv`` installs
from it too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        **kw,  # type: ignore[call-overload]
    )


def test_the_wheel_installs_into_a_fresh_virtualenv_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = _run(["make", "-s", "dist", f"DIST={dist}"], cwd=REPO)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("slurm_gpu-*-py3-none-any.whl")
    (sdist,) = dist.glob("slurm-gpu-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("templates/gpueff/report.txt.j2") for n in names)
    assert any(n.endswith("prolog/slurm-gpu-prolog") for n in names)

    # As the README says: python3 -m venv DIR && DIR/bin/pip install dist/slurm_gpu-*.whl
    venv = tmp_path / "opt-slurm-gpu"
    base = getattr(sys, "_base_executable", sys.executable)
    made = _run([base, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    installed = _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)])
    assert installed.returncode == 0, installed.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLURM_GPU_CONFIG")}
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # Then, as the README says: DIR/bin/python -m slurm_gpu.precompile
    pre = _run([str(venv / "bin" / "python"), "-m", "slurm_gpu.precompile"], cwd=elsewhere, env=env)
    assert pre.returncode == 0 and "modules kept" in pre.stdout, pre.stderr
    assert list(venv.glob("lib/python3*/site-packages/slurm_gpu/__pycache__/records.*.methods"))
    for command in ("gpueff", "slurm-gpu"):
        res = _run([str(venv / "bin" / command), "--help"], cwd=elsewhere, env=env)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("Usage:"), res.stdout
    # The installed copy, not this checkout, and its data files under the venv's prefix.
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import slurm_gpu.resources as r; print(r.__file__); print(r.data_path('templates'))",
        ],
        cwd=elsewhere,
        env=env,
    )
    module, templates = where.stdout.split()
    assert module.startswith(str(venv)) and templates.startswith(str(venv)), where.stdout
    assert (Path(templates) / "gpueff" / "report.txt.j2").is_file()
    example = _run([str(venv / "bin" / "slurm-gpu"), "config", "example"], cwd=elsewhere, env=env)
    assert example.returncode == 0 and "[paths]" in example.stdout, example.stderr
