"""The web page of demo jobs on the real test cluster (issue 30, point 1): the demo's
``idle-gpu`` and ``healthy`` jobs, submitted by sgtest1 and collected into the store, get a
page with their timelines from real accounting (``sacct``), the real store and Slurm's own
visibility facts (``scontrol``, ``sacctmgr``: the cluster sets ``PrivateData=jobs``); sgtest2
gets a 404 for them. ``slurm-gpu demo run --serve-web PORT`` (``make demo``) serves these
pages; here the same application is driven through Flask's test client.

With ``SLURM_GPU_TC_NO_START=1`` it uses the running cluster as it is (``conftest.cluster``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.web.app import create_app

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "share" / "demo"


def _submit_demo(name: str) -> str:
    export = (
        f"--export=ALL,SLURM_GPU_PYTHON={slurmtools.venv_python()},"
        f"SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}"
    )
    out = slurmtools.user_dir("sgtest1")
    return slurmtools.submit(str(DEMO / f"{name}.sbatch"), "sgtest1", (export, f"--chdir={out}"))


def _collect(job_id: str) -> None:
    slurm_gpu = slurmtools.venv_python().parent / "slurm-gpu"
    cfg = str(slurmtools.slurm_gpu_config_path())
    slurmtools.run_as(
        None,
        [str(slurm_gpu), "--config", cfg, "collect", "--job", job_id, "--wait", "60"],
        timeout_s=90,
    )


@pytest.fixture(scope="module")
def demo_jobs() -> dict[str, str]:
    jobs = {name: _submit_demo(name) for name in ("idle-gpu", "healthy")}
    for job_id in jobs.values():
        slurmtools.wait_done(job_id, timeout_s=240)
        _collect(job_id)
    return jobs


def test_each_demo_jobs_page_renders_with_its_timelines(demo_jobs: dict[str, str]) -> None:
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    app = create_app(replace(settings, web=replace(settings.web, identity="remote_user")))
    client = app.test_client()
    for name, job_id in demo_jobs.items():
        resp = client.get(f"/job/{job_id}", environ_base={"REMOTE_USER": "sgtest1"})
        assert resp.status_code == 200, (name, resp.status_code)
        html = resp.get_data(as_text=True)
        assert f"Job {job_id}" in html and "COMPLETED" in html
        assert "(final, from the job&#39;s sealed record)" in html
        points = [
            int(n) for n in re.findall(r'<figure class="chart"[^>]*data-points="(\d+)"', html)
        ]
        assert len(points) == 5 and all(p > 0 for p in points), (name, points)
        if name == "idle-gpu":
            assert "no process ever ran on this GPU" in html
            assert '<rect class="idle"' in html  # the never-used GPU: idle phases shaded
        other = client.get(f"/job/{job_id}", environ_base={"REMOTE_USER": "sgtest2"})
        assert other.status_code == 404
        assert "demo-" not in other.get_data(as_text=True)
    recent = client.get("/", environ_base={"REMOTE_USER": "sgtest1"}).get_data(as_text=True)
    for job_id in demo_jobs.values():
        assert f'href="/job/{job_id}"' in recent
