"""Signals carried from the sampler to the wording (issue 11, items 7 and 12): the process list
in three states (seen, none, unknown), and GPU stalls against saturated cores counted at
sampling resolution. Each test is named after the real case it reproduces."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import jinja2
from analysis_factory import job

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_job, make_node

from slurm_gpu.analysis import Code, analyze
from slurm_gpu.analysis.wording import environment, wording
from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.spool import decode_record, encode_record
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.jobreport.adapter import gpu_line
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample, HostSample, NodeRecord, stall_bin
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

S = AnalysisSettings()
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "findings"
ENV = environment(jinja2.FileSystemLoader(str(TEMPLATES)))
T0 = 1_700_000_000.0
INFOS = [GpuInfo(uuid=f"GPU-{i}", minor_number=i, memory_total_bytes=80 * 2**30) for i in range(4)]


def aggregator(n_gpus: int, *, cores: int = 4, interval: float = 10.0) -> NodeAggregator:
    return NodeAggregator(
        job_id="42",
        hostname="gpu001",
        uid=1000,
        interval_s=interval,
        source="nvml",
        gpus=INFOS[:n_gpus],
        started_s=T0,
        allocated_cores=cores,
    )


def reading(
    agg: NodeAggregator,
    t: float,
    duties: list[float],
    procs: list[tuple[GpuProcess, ...] | None],
    cpu_s: float,
) -> None:
    samples = [
        GpuSample(
            uuid=f"GPU-{i}", time_s=t, utilization_pct=d, memory_used_bytes=2**30, processes=p
        )
        for i, (d, p) in enumerate(zip(duties, procs, strict=True))
    ]
    host = HostSample(t, cpu_s, 2**30, None, None, 1, "cgroup2")
    agg.add(t, samples, host)


def seal(agg: NodeAggregator, end: float) -> NodeRecord:
    return decode_record(encode_record(agg.record(ended_s=end, complete=True)))


# --------------------------------------------------------------------------- item 7


def _unreadable_node(duties: list[float]) -> NodeRecord:
    agg = aggregator(len(duties))
    for k in range(1, 361):
        reading(agg, T0 + 10 * k, duties, [None] * len(duties), 2.0 * 10 * k)
    return seal(agg, T0 + 3600)


def test_process_list_unreadable_on_a_99pct_busy_gpu_is_unknown_not_none() -> None:
    rec = _unreadable_node([99.0])
    g = rec.gpus[0]
    assert g.process_list_unread == 360 and not g.process_seen
    assert g.process_state is None
    # The report's GPU line says nothing rather than "no process ever ran on this GPU".
    assert gpu_line(rec.hostname, g).process_seen is None


def test_idle_gpus_of_a_node_whose_process_list_failed_are_not_said_to_have_no_process() -> None:
    # Every GPU idle: nothing to infer the failure from; the sampler's count says unknown.
    rec = _unreadable_node([0.0, 0.0])
    a = analyze(job(gpus=2, cpus=4, total_cpu=2.0 * 3600), [rec], S)
    unused = [f for f in a.findings if f.code is Code.GPU_UNUSED]
    # One finding for both (the same cause and remedy), naming both GPUs.
    assert len(unused) == 1 and unused[0].evidence["gpus_unused"] == 2
    assert all(f.evidence["process_seen"] is None for f in unused)
    text = wording(ENV, unused[0])[1]
    assert "could not be read" in text and "no compute process was seen" not in text


def test_process_list_read_empty_every_time_is_none() -> None:
    agg = aggregator(1)
    for k in range(1, 31):
        reading(agg, T0 + 10 * k, [0.0], [()], 10.0 * k)
    g = seal(agg, T0 + 300).gpus[0]
    assert g.process_list_unread == 0 and g.process_state is False
    assert gpu_line("gpu001", g).process_seen is False


def test_process_seen_once_is_seen_even_if_the_list_failed_at_other_readings() -> None:
    agg = aggregator(1)
    for k in range(1, 31):
        procs = (GpuProcess(pid=7),) if k == 5 else None
        reading(agg, T0 + 10 * k, [90.0], [procs], 10.0 * k)
    g = seal(agg, T0 + 300).gpus[0]
    assert g.process_state is True and g.process_list_unread == 29


def test_records_sealed_before_the_count_still_read_and_infer() -> None:
    rec = _unreadable_node([99.0, 0.0])
    body = json.loads(encode_record(rec))
    for g in body["record"]["gpus"]:
        del g["process_list_unread"], g["stall_grid"]
    old = decode_record(json.dumps(body).encode())
    assert old.gpus[0].process_list_unread is None and old.gpus[0].stall_grid == ()
    # The first slice's inference: a GPU that ran kernels without a process seen proves the
    # list unreadable on that node.
    assert old.gpus[0].process_state is None
    a = analyze(job(gpus=2, cpus=4, total_cpu=2.0 * 3600), [old], S)
    unused = next(f for f in a.findings if f.code is Code.GPU_UNUSED)
    assert unused.evidence["process_seen"] is None


def test_checkpoint_keeps_the_new_counters_and_reads_older_checkpoints() -> None:
    agg = aggregator(1)
    for k in range(1, 11):
        reading(agg, T0 + 10 * k, [30.0], [None], 4.0 * 10 * k)
    state = json.loads(json.dumps(agg.state()))
    again = NodeAggregator.from_state(state)
    g = again.record(ended_s=T0 + 100, complete=True).gpus[0]
    assert g.process_list_unread == 10 and sum(g.stall_grid) == 9
    for gs in state["gpus"]:
        del gs["process_list_unread"], gs["stall_grid"]
    older = NodeAggregator.from_state(state).record(ended_s=T0 + 100, complete=True).gpus[0]
    # Readings before the upgrade: whether the list was read is not known.
    assert older.process_list_unread == older.samples_available and older.stall_grid == ()


# --------------------------------------------------------------------------- item 12


def _alternating_stalls(readings: int, interval: float) -> NodeRecord:
    """One GPU, 4 cores: every other reading the GPU stalls at 20 % while all 4 cores are
    busy, in between it runs at 95 % with 1.2 cores busy (a loader refilling its queue)."""
    agg = aggregator(1, cores=4, interval=interval)
    cpu = 0.0
    for k in range(1, readings + 1):
        stalled = k % 2 == 0
        cpu += (4.0 if stalled else 1.2) * interval
        reading(agg, T0 + interval * k, [20.0 if stalled else 95.0], [(GpuProcess(1),)], cpu)
    return seal(agg, T0 + interval * readings)


def test_20_hour_job_stall_share_is_counted_per_reading_not_per_timeline_bucket() -> None:
    rec = _alternating_stalls(1200, 60.0)
    assert rec.timeline[0].width_s >= 240  # buckets of 4+ readings: stalls averaged away
    g = rec.gpus[0]
    assert sum(g.stall_grid) == 1199  # the first reading has no CPU rate yet
    assert g.stall_grid[stall_bin(20.0, 100.0)] == 600
    elapsed = 1200 * 60
    j = job(cpus=4, elapsed=elapsed, limit=elapsed + 3600, total_cpu=2.6 * elapsed)
    a = analyze(j, [rec], S)
    assert a.metrics.stall_from_readings
    assert a.metrics.stall_share_strict_pct is not None
    assert abs(a.metrics.stall_share_strict_pct - 50.0) < 0.1
    f = next((f for f in a.findings if f.code is Code.DATALOADER_BOUND), None)
    assert f is not None, [x.code for x in a.findings]
    assert f.evidence["stall_from_readings"] == 1


def test_without_the_grid_the_timeline_inference_stays() -> None:
    rec = _alternating_stalls(1200, 60.0)
    old = replace(rec, gpus=tuple(replace(g, stall_grid=()) for g in rec.gpus))
    elapsed = 1200 * 60
    j = job(cpus=4, elapsed=elapsed, limit=elapsed + 3600, total_cpu=2.6 * elapsed)
    a = analyze(j, [old], S)
    assert not a.metrics.stall_from_readings
    # On 4-minute buckets the stalls are averaged away: the old resolution's blind spot.
    assert a.metrics.stall_share_strict_pct is not None
    assert a.metrics.stall_share_strict_pct < 1.0
    assert not any(f.code is Code.DATALOADER_BOUND for f in a.findings)


def test_new_gpu_counters_survive_the_store(tmp_path: Path) -> None:
    rec = _alternating_stalls(30, 10.0)
    rec = replace(rec, job_id="5", gpus=(replace(rec.gpus[0], process_list_unread=3),))
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        store.write_batch(
            [JobBundle(job=make_job("5"), nodes=(rec,), telemetry=TELEMETRY_COMPLETE)],
            collected_at_s=1.0,
        )
        got = store.get_job("5")
    assert got is not None
    g = got.nodes[0].gpus[0]
    assert g.process_list_unread == 3 and g.stall_grid == rec.gpus[0].stall_grid
    # Jobs stored without the counters read back as "not counted".
    old = replace(
        make_node("6"), gpus=tuple(replace(x, stall_grid=()) for x in make_node("6").gpus)
    )
    with Store.open(url) as store:
        store.write_batch(
            [JobBundle(job=make_job("6"), nodes=(old,), telemetry=TELEMETRY_COMPLETE)],
            collected_at_s=2.0,
        )
        six = store.get_job("6")
    assert six is not None and six.nodes[0].gpus[0].stall_grid == ()
