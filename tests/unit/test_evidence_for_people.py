"""A finding's evidence as people read it: named quantities with units, not the analysis's
internal keys and 0/1 flags; the keys stay in ``--json`` and behind ``--debug``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import gpueff_factory as F
from click.testing import CliRunner

from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.model import Telemetry
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.notify.message import MailContext, MessageBuilder
from slurm_gpu.records import JobRecord


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, Any]


EVIDENCE = {
    "duty_mean_pct": 0.0,
    "gpus_used": 1,
    "gpus_allocated": 2,
    "elapsed_s": 3600,
    "process_seen": 0,
    "ranks_share_gpu": 0,
    "whole_node": False,
}


def _report() -> Any:
    view = adapter.finding_view(_Finding("GPU_UNUSED", "critical", 6, EVIDENCE))
    gpus = adapter.gpu_lines_from_records([F.node_record()])
    base = adapter.accounting_report(F.job(), min_elapsed_s=30)
    return adapter.with_telemetry(base, gpus, live=False, findings=[view])


def _evidence_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if "evidence" in ln.lower())


def test_the_terminal_shows_quantities_not_flags() -> None:
    line = _evidence_line(TerminalRenderer(colour=False).report(_report()))
    assert "duty mean 0.0 %" in line and "gpus used 1" in line and "elapsed 01:00:00" in line
    for flag in ("process seen", "ranks share gpu", "whole node"):
        assert flag not in line, line


def test_debug_shows_the_keys() -> None:
    out = TerminalRenderer(colour=False, debug=True).report(_report())
    assert "process_seen=0" in out and "ranks_share_gpu=0" in out and "duty_mean_pct=" in out


def test_the_mail_shows_quantities_not_flags() -> None:
    msg = MessageBuilder(from_address="a@b.org", context=MailContext()).build(
        [_report()], to="sgtest1@example.org"
    )
    for part in ("plain", "html"):
        body = msg.get_body((part,)).get_content()  # type: ignore[union-attr]
        assert "duty mean" in body
        assert "process seen" not in body and "ranks share gpu" not in body, body


class _Accounting:
    name = "fake"

    def get_jobs(self, ids: Any) -> dict[str, JobRecord]:
        return {"1001": F.job()}

    def jobs_between(self, *a: Any) -> list[JobRecord]:
        return []


class _Reader:
    def final(self, job: JobRecord) -> Telemetry:
        r = _report()
        return Telemetry(gpus=r.gpus, live=False, findings=r.findings)

    def live(self, job: JobRecord) -> None:
        return None


def _gpueff(*args: str) -> str:
    res = CliRunner().invoke(
        cli,
        ["--no-color", *args],
        obj={BACKENDS_KEY: (_Accounting(), _Reader()), CALLER_UID_KEY: 1001},
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    return res.output


def test_json_keeps_every_key() -> None:
    (job,) = json.loads(_gpueff("--json", "1001"))["jobs"]
    (finding,) = job["findings"]
    assert finding["evidence_keys"]["process_seen"] == "0"
    assert set(finding["evidence_keys"]) == set(EVIDENCE)


def test_gpueff_debug_shows_the_keys() -> None:
    assert "process seen" not in _gpueff("1001")
    assert "process_seen=0" in _gpueff("--debug", "1001")
