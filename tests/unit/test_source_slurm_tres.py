"""The accounting-only source (``slurm-tres``) on sacct output in Slurm's documented format.

The per-step GPU TRES fixtures in tests/data/sacct_tres are written by hand (Slurm records
``gres/gpuutil`` only on real GPUs with its NVML plugin; README there). The runner is the
seam: it answers the source's own sacct command line with a fixture, so the argv, the
delimiter and the parsing are the real ones."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import make_job

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.analysis.engine import analyze
from slurm_gpu.analysis.findings import Code
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.errors import AccountingError, TelemetryUnavailableError
from slurm_gpu.records import JobRecord
from slurm_gpu.sources.accounting import (
    DELIM,
    NAME,
    SlurmTresSource,
    parse_steps,
    usage_value,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct_tres"
T0 = 1_700_000_000.0


class FixtureRunner:
    """Answers the per-step query of a job with its fixture, in the asked delimiter."""

    def __init__(self, name: str, *, returncode: int = 0, stderr: str = "") -> None:
        self.text = (DATA / name).read_text().replace("|", DELIM)
        self.returncode = returncode
        self.stderr = stderr
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        assert env["SLURM_TIME_FORMAT"] == "%s"
        return CommandResult(self.returncode, self.text.encode(), self.stderr)


def _job(job_id: str, nodes: tuple[str, ...], gpus: int, elapsed: int = 3600) -> JobRecord:
    j = make_job(job_id, gpus=gpus, nodes=nodes)
    return replace(j, start_s=T0, end_s=T0 + elapsed, elapsed_s=elapsed, uid=1001)


def test_usage_value_reads_one_entry_of_a_tres_usage_list() -> None:
    tres = "cpu=00:56:24,energy=0,gres/gpumem=38888M,gres/gpuutil=100,mem=10372780K"
    assert usage_value(tres, "gres/gpuutil") == "100"
    assert usage_value(tres, "gres/gpumem") == "38888M"
    assert usage_value(tres, "gres/gpu") is None


def test_two_node_job_gets_one_record_per_node_with_per_step_means() -> None:
    runner = FixtureRunner("two_nodes.txt")
    job = _job("501", ("gpu001", "gpu002"), gpus=4)
    result = SlurmTresSource(runner=runner).records_for(job)
    [argv] = runner.calls
    assert "--jobs=501" in argv and f"--delimiter={DELIM}" in argv
    assert not any("JobName" in a or "Comment" in a for a in argv)  # no user text asked
    assert result.missing_hosts == ()
    by_host = {n.hostname: n for n in result.nodes}
    assert set(by_host) == {"gpu001", "gpu002"}
    for n in result.nodes:
        assert n.source == NAME and n.timeline == () and n.host is None
        assert len(n.gpus) == 2 and n.job_id == "501" and n.uid == 1001
        for g in n.gpus:
            assert g.power_mean_w is None and g.process_list_unread == g.samples
    # gpu001 ran steps 0 (62 %) and 1 (30 %); its batch step holds no GPU and is left out.
    g1 = by_host["gpu001"].gpus[0]
    assert g1.samples == 2 and g1.utilization.mean == pytest.approx(46.0, abs=1.0)
    assert g1.memory_used_max_bytes == 38888 * 2**20
    g2 = by_host["gpu002"].gpus[0]
    assert g2.samples == 1 and g2.utilization.mean == pytest.approx(62.0, abs=1.0)


def test_a_task_using_two_gpus_has_its_summed_utilisation_split_per_gpu() -> None:
    job = _job("502", ("gpu001",), gpus=2, elapsed=1800)
    result = SlurmTresSource(runner=FixtureRunner("one_task_two_gpus.txt")).records_for(job)
    [node] = result.nodes
    # 150 % over the task's two GPUs: 75 % each; memory 24000M over two.
    assert [g.utilization.mean for g in node.gpus] == [pytest.approx(75.0, abs=1.0)] * 2
    assert node.gpus[0].memory_used_max_bytes == 12000 * 2**20


def test_without_slurms_gpu_plugin_every_node_is_missing() -> None:
    job = _job("503", ("gpu001",), gpus=1, elapsed=1800)
    result = SlurmTresSource(runner=FixtureRunner("no_plugin.txt")).records_for(job)
    assert result.nodes == () and result.missing_hosts == ("gpu001",)
    assert "gres/gpuutil" in result.notes[0]


def test_a_node_without_any_step_is_missing() -> None:
    job = _job("504", ("gpu001", "gpu002", "gpu003"), gpus=3)
    result = SlurmTresSource(runner=FixtureRunner("node_without_steps.txt")).records_for(job)
    assert sorted(n.hostname for n in result.nodes) == ["gpu001", "gpu002"]
    assert result.missing_hosts == ("gpu003",)


def test_steps_of_other_jobs_and_malformed_lines_are_skipped() -> None:
    text = (DATA / "two_nodes.txt").read_text().replace("|", DELIM)
    text += "garbage line\n" + text.replace("501", "999")
    steps = parse_steps(text, "501")
    assert sorted(s.step_id for s in steps) == ["0", "1", "batch"]  # extern skipped


def test_sacct_failing_is_telemetry_unavailable_and_not_an_empty_job() -> None:
    job = _job("501", ("gpu001", "gpu002"), gpus=4)
    runner = FixtureRunner("two_nodes.txt", returncode=1, stderr="slurmdbd: unreachable\n")
    with pytest.raises(TelemetryUnavailableError, match="unreachable"):
        SlurmTresSource(runner=runner).records_for(job)

    def missing(argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> CommandResult:
        raise AccountingError("sacct: command not found")

    with pytest.raises(TelemetryUnavailableError, match="not found"):
        SlurmTresSource(runner=missing).records_for(job)


def test_the_analysis_of_a_slurm_tres_job_says_what_it_cannot_tell() -> None:
    job = _job("501", ("gpu001", "gpu002"), gpus=4)
    result = SlurmTresSource(runner=FixtureRunner("two_nodes.txt")).records_for(job)
    findings = analyze(job, result.nodes, AnalysisSettings()).findings
    codes = {f.code for f in findings}
    assert Code.NO_TELEMETRY not in codes and Code.TOO_SHORT not in codes
    assert not codes & {Code.IDLE_HEAD, Code.IDLE_TAIL, Code.IDLE_PHASES, Code.DATALOADER_BOUND}
    [note] = [f for f in findings if f.code is Code.SOURCE_CANNOT_TELL]
    assert note.subject == "Slurm accounting (per-step GPU TRES)"
    assert note.evidence["cannot_tell_IDLE_HEAD"] == 1 and note.evidence["lacks_timeline"] == 1


def test_the_registry_makes_the_source_by_its_configured_name() -> None:
    from slurm_gpu.config import Settings
    from slurm_gpu.sources import registry

    made = registry.make(Settings(), "slurm-tres")
    assert isinstance(made, SlurmTresSource) and made.capabilities.name == NAME
    with pytest.raises(Exception, match="handled by the collector itself"):
        registry.factory("hooks")
    with pytest.raises(Exception, match="unknown telemetry source"):
        registry.factory("nagios")
