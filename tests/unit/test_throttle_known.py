"""Throttling known, partly known and unknown, from the aggregates to every reader.

A driver that gives no clock-event reasons (before R535 without the fallback, per-field
errors) must read as "unknown", never "0 % throttled"; a job where reasons were known for
part of the time reports the throttled share of that part. Records sealed before the known
time was counted read as before (the observed span), so stored results do not change.
"""

from __future__ import annotations

import json
from dataclasses import replace
from email.message import EmailMessage
from typing import Any

import gpueff_factory as F
import pytest

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.analysis.metrics import gpu_metrics
from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.recordcodec import from_jsonable, to_jsonable
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.jsonout import job_json
from slurm_gpu.jobreport.terminal import TerminalRenderer
from slurm_gpu.notify.message import MailContext, MessageBuilder
from slurm_gpu.records import GpuInfo, GpuSample, GpuSummary, NodeRecord
from slurm_gpu.telemetry.base import THROTTLE_SW_POWER_CAP

S = AnalysisSettings()
INFO = GpuInfo(uuid="GPU-0", minor_number=0, memory_total_bytes=40 * 2**30)
T0 = 1_700_000_100.0


def aggregate(reasons: list[int | None], interval: float = 10.0) -> NodeRecord:
    """One GPU read every ``interval`` s with these bitmasks (``None``: not reported)."""
    agg = NodeAggregator(
        job_id="1001", hostname="node1", uid=1001, interval_s=interval, source="nvml",
        gpus=[INFO], started_s=T0,
    )  # fmt: skip
    for i, r in enumerate(reasons):
        t = T0 + interval * (i + 1)
        agg.add(
            t, [GpuSample(uuid="GPU-0", time_s=t, utilization_pct=90.0, throttle_reasons=r)], None
        )
    return agg.record(ended_s=T0 + interval * len(reasons), complete=True)


def with_throttle(record: NodeRecord, **over: float | None) -> NodeRecord:
    """``F.node_record()`` with its first GPU's throttle fields replaced."""
    gpus = list(record.gpus)
    gpus[0] = replace(gpus[0], **over)
    return replace(record, gpus=tuple(gpus))


def report_text_json_mail(record: NodeRecord) -> tuple[str, dict[str, Any], str]:
    lines = adapter.gpu_lines_from_records([record])
    report = adapter.with_telemetry(adapter.accounting_report(F.job()), lines, live=False)
    text = TerminalRenderer(colour=False).report(report)
    doc = json.loads(json.dumps(job_json(report)))
    msg = MessageBuilder(
        from_address="slurm-gpu@example.org", context=MailContext(docs_url="https://x")
    ).build([report], to="sgtest1@example.org")
    assert isinstance(msg, EmailMessage)
    mail = "\n".join(
        part.get_content() for part in msg.walk() if part.get_content_maintype() == "text"
    )
    return text, doc, mail


# --------------------------------------------------------------------- aggregates


def test_driver_without_throttle_reasons_reports_unknown_not_zero() -> None:
    rec = aggregate([None] * 30)
    g = rec.gpus[0]
    assert (g.throttle_power_known_s, g.throttle_thermal_known_s) == (0.0, 0.0)
    m = gpu_metrics(g, rec, S)
    assert m.throttle_power_pct is None and m.throttle_thermal_pct is None


def test_throttle_known_for_part_of_the_job_uses_the_known_time_as_denominator() -> None:
    # 10 readings with the power cap set, then 20 without any reasons (per-field errors)
    rec = aggregate([THROTTLE_SW_POWER_CAP] * 10 + [None] * 20)
    m = gpu_metrics(rec.gpus[0], rec, S)
    assert m.throttle_power_pct == pytest.approx(100.0)
    assert m.throttle_thermal_pct == 0.0
    assert m.throttle_known_pct == pytest.approx(100.0 * 10 / 30)


def test_throttle_known_time_survives_a_checkpoint() -> None:
    agg = NodeAggregator(
        job_id="1", hostname="n", uid=1, interval_s=10.0, source="nvml", gpus=[INFO], started_s=T0
    )
    agg.add(
        T0 + 10,
        [GpuSample(uuid="GPU-0", time_s=T0 + 10, throttle_reasons=0x20, violation_thermal_ns=5)],
        None,
    )
    restored = NodeAggregator.from_state(json.loads(json.dumps(agg.state())))
    for a in (agg, restored):
        a.add(
            T0 + 20,
            [GpuSample(uuid="GPU-0", time_s=T0 + 20, violation_thermal_ns=3 * 10**9 + 5)],
            None,
        )
    one, two = (a.record(ended_s=T0 + 20, complete=True).gpus[0] for a in (agg, restored))
    assert one == two
    assert (one.throttle_thermal_s, one.throttle_thermal_known_s) == (13.0, 20.0)
    assert one.throttle_power_known_s == 10.0  # the second reading had neither for power


def _agg() -> NodeAggregator:
    return NodeAggregator(
        job_id="1", hostname="n", uid=1, interval_s=10.0, source="nvml", gpus=[INFO], started_s=T0
    )


def _reading(agg: NodeAggregator, i: int, counter: int | None, reasons: int | None) -> None:
    t = T0 + 10 * i
    agg.add(
        t,
        [GpuSample(uuid="GPU-0", time_s=t, throttle_reasons=reasons, violation_power_ns=counter)],
        None,
    )


def test_readings_without_the_counter_are_covered_by_the_next_one() -> None:
    # The counters are read at one reading in three (issue 29): the two between hold their
    # bitmasks (power cap set) until the next counter settles all three intervals: 6 s.
    agg = _agg()
    _reading(agg, 1, 10**12, 0)
    _reading(agg, 2, None, THROTTLE_SW_POWER_CAP)
    _reading(agg, 3, None, THROTTLE_SW_POWER_CAP)
    pending = agg.record(ended_s=T0 + 30, complete=True).gpus[0]
    assert (pending.throttle_power_s, pending.throttle_power_known_s) == (20.0, 30.0)
    _reading(agg, 4, 10**12 + 6 * 10**9, 0)
    g = agg.record(ended_s=T0 + 40, complete=True).gpus[0]
    assert (g.throttle_power_s, g.throttle_power_known_s) == (6.0, 40.0)


def test_pending_readings_survive_a_checkpoint() -> None:
    agg = _agg()
    _reading(agg, 1, 10**12, 0)
    _reading(agg, 2, None, THROTTLE_SW_POWER_CAP)
    restored = NodeAggregator.from_state(json.loads(json.dumps(agg.state())))
    for a in (agg, restored):
        _reading(a, 3, 10**12 + 10**9, 0)
    one, two = (a.record(ended_s=T0 + 30, complete=True).gpus[0] for a in (agg, restored))
    assert one == two and (one.throttle_power_s, one.throttle_power_known_s) == (1.0, 30.0)


@pytest.mark.parametrize("breaker", ["reset", "unavailable"])
def test_a_broken_chain_counts_the_pending_readings_from_their_bitmasks(breaker: str) -> None:
    agg = _agg()
    _reading(agg, 1, 10**12, 0)
    _reading(agg, 2, None, THROTTLE_SW_POWER_CAP)
    _reading(agg, 3, None, 0)
    if breaker == "reset":  # a driver reload restarts the counter: this interval, its mask
        _reading(agg, 4, 5, THROTTLE_SW_POWER_CAP)
    else:
        agg.add(T0 + 40, [GpuSample(uuid="GPU-0", time_s=T0 + 40, available=False)], None)
    g = agg.record(ended_s=T0 + 40, complete=True).gpus[0]
    assert g.throttle_power_s == (20.0 if breaker == "reset" else 10.0)
    assert g.throttle_power_known_s == (40.0 if breaker == "reset" else 30.0)


def test_checkpoint_from_before_the_counters_cadence_restores_without_pending() -> None:
    agg = _agg()
    _reading(agg, 1, 10**12, 0)
    state = json.loads(json.dumps(agg.state()))
    for gpu in state["gpus"]:
        gpu["throttle_power"] = gpu["throttle_power"][:2]  # [known_s, prev_ns], as before
    restored = NodeAggregator.from_state(state)
    _reading(restored, 2, 10**12 + 10**9, 0)
    g = restored.record(ended_s=T0 + 20, complete=True).gpus[0]
    assert (g.throttle_power_s, g.throttle_power_known_s) == (1.0, 20.0)


def test_checkpoint_from_before_the_known_time_restores_as_not_counted() -> None:
    agg = NodeAggregator(
        job_id="1",
        hostname="n",
        uid=1,
        interval_s=10.0,
        source="virtual",
        gpus=[INFO],
        started_s=T0,
    )
    agg.add(
        T0 + 10,
        [GpuSample(uuid="GPU-0", time_s=T0 + 10, throttle_reasons=THROTTLE_SW_POWER_CAP)],
        None,
    )
    state = json.loads(json.dumps(agg.state()))
    for gpu in state["gpus"]:
        del gpu["throttle_power"], gpu["throttle_thermal"]
    restored = NodeAggregator.from_state(state)
    restored.add(
        T0 + 20,
        [GpuSample(uuid="GPU-0", time_s=T0 + 20, throttle_reasons=THROTTLE_SW_POWER_CAP)],
        None,
    )
    g = restored.record(ended_s=T0 + 20, complete=True).gpus[0]
    assert g.throttle_power_s == 20.0 and g.throttle_power_known_s is None
    assert (
        gpu_metrics(g, restored.record(ended_s=T0 + 20, complete=True), S).throttle_power_pct
        == 100.0
    )


def test_record_sealed_before_the_known_time_reads_over_the_observed_span() -> None:
    rec = with_throttle(F.node_record(), throttle_power_s=900.0)
    old = to_jsonable(rec.gpus[0], omit_defaults=True)
    assert "throttle_power_known_s" not in old  # what a record of the previous release holds
    g = from_jsonable(GpuSummary, old)
    assert g.throttle_power_known_s is None
    assert gpu_metrics(g, rec, S).throttle_power_pct == pytest.approx(25.0)  # 900 s of 3600 s


# --------------------------------------------------------------------- readers


def test_throttled_finding_says_the_share_of_the_known_time() -> None:
    rec = with_throttle(
        F.node_record(),
        throttle_thermal_s=600.0,
        throttle_thermal_known_s=1200.0,
        throttle_power_known_s=1200.0,
    )
    analysis = analyze(F.job(), [rec], S)
    [f] = [f for f in analysis.findings if f.code.value == "GPU_THROTTLED_THERMAL"]
    assert f.evidence["throttled_pct"] == 50.0
    assert f.evidence["throttle_known_pct"] == pytest.approx(33.3)
    _, words = adapter.findings_wording()(f)
    assert "50 % of the time the driver reported clock-event reasons (33 % of the job" in words


def test_driver_without_throttle_reasons_raises_no_finding_and_no_zero() -> None:
    rec = with_throttle(F.node_record(), throttle_power_known_s=0.0, throttle_thermal_known_s=0.0)
    analysis = analyze(F.job(), [rec], S)
    assert not [f for f in analysis.findings if "THROTTLED" in f.code.value]


def test_gpueff_and_mail_say_throttling_unknown_where_never_known() -> None:
    rec = with_throttle(F.node_record(), throttle_power_known_s=0.0, throttle_thermal_known_s=0.0)
    text, doc, mail = report_text_json_mail(rec)
    gpus = doc["gpus"]
    assert gpus[0]["throttled_pct"] is None
    assert gpus[1]["throttled_pct"] == 0.0
    assert text.count("throttling unknown") == 1 and "held down" not in text
    assert mail.count("throttling unknown") == 2  # the plain text and the HTML part


def test_gpueff_and_mail_show_the_throttled_share_of_the_known_time() -> None:
    rec = with_throttle(
        F.node_record(),
        throttle_power_s=300.0,
        throttle_power_known_s=600.0,
        throttle_thermal_known_s=600.0,
    )
    text, doc, mail = report_text_json_mail(rec)
    gpus = doc["gpus"]
    assert gpus[0]["throttled_pct"] == 50.0
    assert "clocks held down 50 %" in text and "unknown" not in text
    assert mail.count("clocks held down 50 %") == 2


def test_stored_gpu_rows_keep_the_analysed_reading() -> None:
    # Store rows carry no known time (the schema has no column for it): they read over the
    # observed span, as the record was analysed, and never as "unknown".
    rec = with_throttle(F.node_record(), throttle_thermal_s=360.0)
    line = adapter.gpu_lines_from_records([rec])[0]
    assert line.throttled_pct == pytest.approx(10.0) and not line.throttle_unknown
