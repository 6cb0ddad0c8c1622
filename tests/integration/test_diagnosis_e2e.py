"""End to end on the real cluster: every demo pattern, submitted with sbatch, goes through the
prolog, the sampler, the epilog's seal, the collector (with sacct) and the analysis into the
store, and comes out with the diagnosis its pattern deserves, in the store and in
``gpueff --json`` as its owner sees it.

The jobs are the demo's own scripts (share/demo) with shorter durations; the cluster's
slurm-gpu.toml scales the analysis thresholds to jobs of seconds (share/testcluster).
All eleven are submitted at once: with four GPUs they run in rounds (``DEMO_ORDER``).
``test_diagnosis_patterns_cluster.py`` checks the task farm, the ranks sharing a GPU and the
busy-but-empty job in detail (evidence, wording, the e-mail).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from datetime import UTC, datetime

import pytest
import slurmtools

from slurm_gpu.analysis import CODES, Audience
from slurm_gpu.config import load_settings
from slurm_gpu.demo.submit import DEMO_ORDER
from slurm_gpu.store import open_store

pytestmark = pytest.mark.cluster

DEMO = slurmtools.REPO / "share" / "demo"

#: pattern -> (seconds it runs, finding code it must get, the cause of that code)
EXPECTED: dict[str, tuple[int, str | None, int | None]] = {
    "healthy": (20, None, None),
    "idle-gpu": (20, "GPU_UNUSED", 6),
    "imbalance": (20, "GPU_IMBALANCE", 5),
    "dataloader": (25, "DATALOADER_BOUND", 2),
    "small-batch": (20, "LOW_PARALLELISM", 1),
    "near-oom": (20, "GPU_MEMORY_NEAR_FULL", 4),
    "overtime": (20, "TIME_OVERREQUESTED", 6),
    "idle-tail": (30, "IDLE_TAIL", 6),
    "task-farm": (33, "IDLE_PHASES", 6),
    "busy-empty": (20, "LOW_PARALLELISM", 1),
    "ranks-share-gpu": (20, "RANKS_SHARE_GPU", 6),
}
#: Other causes a pattern may also show: the task farm's one-core steps are CPU-bound
#: (cause 2) when the shared machine gives them their cores' worth of CPU time.
ALSO: dict[str, set[int]] = {"small-batch": {6}, "task-farm": {2}}


def _script(pattern: str, duration_s: int) -> str:
    """The demo's script for ``pattern`` with a shorter run."""
    text = (DEMO / f"{pattern}.sbatch").read_text()
    shorter, n = re.subn(r"--duration \d+", f"--duration {duration_s}", text)
    assert n == 1, f"{pattern}.sbatch has no --duration"
    return shorter


def _user_problems(findings: list[tuple[str, int | None, str]]) -> list[str]:
    """Codes of the findings a user is told to act on (warning or worse)."""
    return [
        code
        for code, _cause, severity in findings
        if CODES[code].audience is Audience.USER and severity != "info"  # type: ignore[index]
    ]


@pytest.fixture(scope="module")
def demo_jobs() -> dict[str, str]:
    """pattern -> job id of its finished, collected demo job."""
    config = slurmtools.slurm_gpu_config_path()
    python = slurmtools.venv_python()
    jobs = {}
    for pattern in DEMO_ORDER:
        duration, _, _ = EXPECTED[pattern]
        jobs[pattern] = slurmtools.submit(
            _script(pattern, duration),
            args=(
                "--chdir=/tmp",
                "--output=/tmp/slurm-gpu-e2e-%j.out",
                f"--export=ALL,SLURM_GPU_PYTHON={python},SLURM_GPU_CONFIG={config}",
            ),
        )
    for pattern, job_id in jobs.items():
        state = slurmtools.wait_done(job_id, timeout_s=600)
        assert state == "COMPLETED", f"{pattern} job {job_id} ended {state}"
    settings = load_settings(str(config))
    slurm_gpu = str(python.with_name("slurm-gpu"))
    deadline = time.monotonic() + 120
    with open_store(settings) as store:
        while True:
            subprocess.run(
                [slurm_gpu, "--config", str(config), "collect", "--once", "--no-missing"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            missing = set(jobs.values()) - store.existing_job_ids(jobs.values())
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert not missing, f"not collected: {sorted(missing)}"
    return jobs


@pytest.mark.parametrize("pattern", DEMO_ORDER)
def test_the_store_has_the_patterns_diagnosis(demo_jobs: dict[str, str], pattern: str) -> None:
    settings = load_settings(str(slurmtools.slurm_gpu_config_path()))
    with open_store(settings, readonly=True) as store:
        stored = store.get_job(demo_jobs[pattern])
    assert stored is not None
    assert stored.telemetry == "complete"
    findings = [(f.code, f.cause, f.severity) for f in stored.findings]
    _, code, cause = EXPECTED[pattern]
    if code is None:
        assert _user_problems(findings) == [], findings
    else:
        assert (code, cause) in [(c, k) for c, k, _ in findings], findings
        assert all(
            k in (cause, None) or k in ALSO.get(pattern, set())
            for c, k, _ in findings
            if c in _user_problems(findings)
        ), findings


@pytest.mark.parametrize("pattern", DEMO_ORDER)
def test_gpueff_json_reports_it_to_the_owner(demo_jobs: dict[str, str], pattern: str) -> None:
    job_id = demo_jobs[pattern]
    gpueff = str(slurmtools.venv_python().with_name("gpueff"))
    proc = slurmtools.run_as(
        "sgtest1",
        [gpueff, "--json", "--config", str(slurmtools.slurm_gpu_config_path()), job_id],
    )
    report = json.loads(proc.stdout)["jobs"][0]
    assert report["job_id"] == job_id
    findings = [(f["code"], f["cause"], f["severity"]) for f in report["findings"]]
    _, code, cause = EXPECTED[pattern]
    if code is None:
        assert _user_problems(findings) == [], findings
    else:
        assert (code, cause) in [(c, k) for c, k, _ in findings], findings


def test_the_weekly_report_shows_them_with_their_causes(demo_jobs: dict[str, str]) -> None:
    """The admins' report over the span in which the demo jobs ended attributes waste to the
    causes the patterns exhibit, and lists the never-used GPU and the idle tail by job."""
    config = str(slurmtools.slurm_gpu_config_path())
    settings = load_settings(config)
    with open_store(settings, readonly=True) as store:
        ends = [store.get_job(j).job.end_s for j in demo_jobs.values()]  # type: ignore[union-attr]
    assert all(e is not None for e in ends)
    stamp = "%Y-%m-%dT%H:%M:%S"
    since = datetime.fromtimestamp(math.floor(min(ends)) - 1, UTC).strftime(stamp)  # type: ignore[type-var,arg-type]
    until = datetime.fromtimestamp(math.ceil(max(ends)) + 1, UTC).strftime(stamp)  # type: ignore[type-var,arg-type]
    slurm_gpu = str(slurmtools.venv_python().with_name("slurm-gpu"))
    proc = subprocess.run(
        [
            slurm_gpu,
            "--config",
            config,
            "report",
            "weekly",
            "--format",
            "json",
            "--since",
            since,
            "--until",
            until,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["report"]
    assert report["headline"]["jobs"] >= len(demo_jobs)
    causes = {c["cause"]: c for c in report["causes"]}
    for pattern in ("idle-gpu", "dataloader", "small-batch", "imbalance"):
        cause = EXPECTED[pattern][2]
        assert causes[cause]["jobs"] >= 1, (pattern, report["causes"])
    never_used = {w["job_id"] for w in report["never_used"]["worst"]}
    assert demo_jobs["idle-gpu"] in never_used
    idle_edges = {w["job_id"] for w in report["idle_edges"]["worst"]}
    assert demo_jobs["idle-tail"] in idle_edges
