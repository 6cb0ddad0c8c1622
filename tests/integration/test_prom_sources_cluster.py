"""The Prometheus sources on the test cluster: demo jobs run on virtual GPUs with the hooks,
the cluster's real Prometheus scrapes the node's exporter and the TEST-ONLY shapes exposition
(``slurm_gpu.live.testshapes``: the same live summaries under dcgm-exporter's and jobstats'
exact names and labels, started by ``share/testcluster/start``), and each source reads the
finished jobs back from Prometheus.

The first tests call the sources directly and run the analysis on their records as the
collector runs it on the hooks' records (``analysis.analyze`` with the cluster's settings);
the last runs ``slurm-gpu collect`` itself with ``[source]`` naming each source (the pull
pass). The reference is what the collector stored from the hooks' sealed records of the same
jobs.

Tolerances: per GPU, the mean duty cycle from Prometheus is within 10 percentage points of
the hooks' (the hooks read every second, Prometheus keeps the last reading every 2 s), and
the warnings a user is told to act on are the same codes. A job whose series the shapes
exposition hides has its node marked missing by dcgm-exporter and jobstats, and the analysis
of it from those sources finds nothing to act on.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.analysis import CODES, Audience
from slurm_gpu.analysis.engine import analyze
from slurm_gpu.config import load_settings
from slurm_gpu.prometheus.client import PrometheusClient
from slurm_gpu.sources.prometheus_common import PromSourceOptions
from slurm_gpu.sources.prometheus_dcgm import DcgmExporterSource
from slurm_gpu.sources.prometheus_exporter import SlurmExporterSource
from slurm_gpu.sources.prometheus_jobstats import JobstatsSource
from slurm_gpu.store import open_store

pytestmark = pytest.mark.cluster

DEMO = slurmtools.REPO / "share" / "demo"
PATTERNS = {"healthy": 20, "idle-gpu": 20, "imbalance": 20}
SOURCES = (DcgmExporterSource, JobstatsSource, SlurmExporterSource)
DUTY_TOLERANCE_PCT = 10.0


def _script(pattern: str, duration_s: int) -> str:
    text = (DEMO / f"{pattern}.sbatch").read_text()
    shorter, n = re.subn(r"--duration \d+", f"--duration {duration_s}", text)
    assert n == 1, f"{pattern}.sbatch has no --duration"
    return shorter


def _settings():  # type: ignore[no-untyped-def]
    return load_settings(str(slurmtools.slurm_gpu_config_path()))


def _user_problems(findings: list[tuple[str, str]]) -> set[str]:
    return {
        code
        for code, severity in findings
        if CODES[code].audience is Audience.USER and severity != "info"  # type: ignore[index]
    }


@pytest.fixture(scope="module")
def jobs() -> dict[str, str]:
    """name -> job id of its finished, collected job; ``hidden`` is a healthy job whose
    series the shapes exposition left out."""
    config = slurmtools.slurm_gpu_config_path()
    python = slurmtools.venv_python()
    args = (
        "--chdir=/tmp",
        "--output=/tmp/slurm-gpu-promsrc-%j.out",
        f"--export=ALL,SLURM_GPU_PYTHON={python},SLURM_GPU_CONFIG={config}",
    )
    out = {p: slurmtools.submit(_script(p, d), args=args) for p, d in PATTERNS.items()}
    hidden = slurmtools.submit(_script("healthy", 20), args=(*args, "--hold"))
    hide = slurmtools.tc_root() / "test-shapes.hide"
    hide.write_text(f"{hidden}\n")
    subprocess.run(["scontrol", "release", hidden], check=True, timeout=30)
    out["hidden"] = hidden
    try:
        for name, job_id in out.items():
            state = slurmtools.wait_done(job_id, timeout_s=600)
            assert state == "COMPLETED", f"{name} job {job_id} ended {state}"
    finally:
        hide.unlink(missing_ok=True)
    slurm_gpu = str(python.with_name("slurm-gpu"))
    deadline = time.monotonic() + 120
    with open_store(_settings()) as store:
        while True:
            subprocess.run(
                [slurm_gpu, "--config", str(config), "collect", "--once", "--no-missing"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            missing = set(out.values()) - store.existing_job_ids(out.values())
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert not missing, f"not collected: {sorted(missing)}"
    return out


def _client() -> PrometheusClient:
    url = _settings().live.prometheus_url
    assert url, "the test cluster's [live] must name its Prometheus"
    return PrometheusClient(url, 30.0)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("cls", SOURCES, ids=lambda c: c.__name__)
def test_each_source_gets_the_hooks_findings(jobs: dict[str, str], pattern: str, cls: type) -> None:
    settings = _settings()
    job_id = jobs[pattern]
    with open_store(settings, readonly=True) as store:
        stored = store.get_job(job_id, timelines=True)
    assert stored is not None and stored.telemetry == "complete"
    job = SacctSource().get_jobs([job_id])[job_id]
    result = cls(_client(), PromSourceOptions(interval_s=2.0)).records_for(job)
    assert result.missing_hosts == (), result
    assert [n.hostname for n in result.nodes] == [n.hostname for n in stored.nodes]
    hooks = {g.info.uuid: g for n in stored.nodes for g in n.gpus}
    for node in result.nodes:
        for g in node.gpus:
            ref = hooks[g.info.uuid]
            assert g.utilization.mean is not None and ref.utilization.mean is not None
            assert abs(g.utilization.mean - ref.utilization.mean) <= DUTY_TOLERANCE_PCT, (
                g.info.uuid,
                g.utilization.mean,
                ref.utilization.mean,
            )
            assert g.process_state is None  # no process list from Prometheus: unknown
    analysis = analyze(job, result.nodes, settings.analysis)
    from_source = _user_problems([(f.code.value, f.severity.value) for f in analysis.findings])
    from_hooks = _user_problems([(f.code, f.severity) for f in stored.findings])
    assert from_source == from_hooks, (pattern, cls.__name__, from_source, from_hooks)


@pytest.mark.parametrize("cls", SOURCES[:2], ids=lambda c: c.__name__)
def test_a_job_without_series_has_its_node_missing_and_nothing_to_act_on(
    jobs: dict[str, str], cls: type
) -> None:
    settings = _settings()
    job_id = jobs["hidden"]
    job = SacctSource().get_jobs([job_id])[job_id]
    result = cls(_client(), PromSourceOptions(interval_s=2.0)).records_for(job)
    assert result.nodes == ()
    assert result.missing_hosts == job.nodelist == (slurmtools.node_name(),)
    analysis = analyze(job, result.nodes, settings.analysis)
    assert _user_problems([(f.code.value, f.severity.value) for f in analysis.findings]) == set()
    assert [f.code.value for f in analysis.findings] == ["NO_TELEMETRY"]
    # The hooks had it all: the gap is the source's, not the job's.
    with open_store(settings, readonly=True) as store:
        stored = store.get_job(job_id)
    assert stored is not None and stored.telemetry == "complete"


def _pull_config(tmp_path: Path, name: str) -> Path:
    """The cluster's settings (thresholds scaled to its short jobs) with an empty spool, a
    store of its own, and every partition read from the Prometheus source ``name``."""
    base = slurmtools.slurm_gpu_config_path().read_text()
    text = re.sub(r"(?m)^spool_dir = .*$", f'spool_dir = "{tmp_path}/spool"', base, count=1)
    text = re.sub(r"(?m)^state_dir = .*$", f'state_dir = "{tmp_path}/state"', text, count=1)
    text = re.sub(r"(?m)^\[store\]\n", f'[store]\nurl = "sqlite:///{tmp_path}/state/s.db"\n', text)
    text += f'\n[source]\ndefault = "{name}"\npull_lookback_s = 3600.0\n'
    (tmp_path / "spool").mkdir(exist_ok=True)
    cfg = tmp_path / f"pull-{name}.toml"
    cfg.write_text(text)
    return cfg


@pytest.mark.parametrize(
    ("name", "record_name"),
    [("dcgm", "dcgm-exporter"), ("jobstats", "jobstats"), ("exporter", "slurm-exporter")],
)
def test_collect_pulls_the_demo_jobs_from_each_prometheus_source(
    jobs: dict[str, str], tmp_path: Path, name: str, record_name: str
) -> None:
    # ``slurm-gpu collect`` itself, configured as a site without hooks would be: the pull pass
    # finds the ended jobs in accounting and reads each from the source.
    cfg = _pull_config(tmp_path, name)
    slurm_gpu = str(slurmtools.venv_python().with_name("slurm-gpu"))
    done = subprocess.run(
        [slurm_gpu, "--config", str(cfg), "collect", "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pulled = load_settings(str(cfg))
    with open_store(_settings(), readonly=True) as hooks_store, open_store(pulled) as store:
        for pattern in PATTERNS:
            got = store.get_job(jobs[pattern])
            ref = hooks_store.get_job(jobs[pattern])
            assert got is not None and ref is not None, pattern
            assert {n.source for n in got.nodes} == {record_name}
            assert got.missing_hosts == () and got.telemetry != "missing", (pattern, got)
            from_source = _user_problems([(f.code, f.severity) for f in got.findings])
            from_hooks = _user_problems([(f.code, f.severity) for f in ref.findings])
            assert from_source == from_hooks, (pattern, name, from_source, from_hooks)
        hidden = store.get_job(jobs["hidden"])
        assert hidden is not None
        if name != "exporter":  # our exporter's own series were not hidden
            assert tuple(hidden.missing_hosts) == (slurmtools.node_name(),)
            assert hidden.telemetry != "complete"
