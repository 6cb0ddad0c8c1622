"""Streaming aggregates (slurm_gpu.capture.aggregate): streaming results equal full-list results."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpu.capture.aggregate import MAX_PIDS, DistAccumulator, NodeAggregator, Timeline
from slurm_gpu.records import Distribution, GpuInfo, GpuProcess, GpuSample, HostSample
from slurm_gpu.telemetry.base import (
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
)

G0 = GpuInfo(uuid="GPU-0", minor_number=0, memory_total_bytes=80 * 2**30)
G1 = GpuInfo(uuid="GPU-1", minor_number=1, memory_total_bytes=80 * 2**30)


def make(n_gpus: int = 1, *, points: int = 512, interval: float = 10.0, cores: int | None = 4):
    return NodeAggregator(
        job_id="42",
        hostname="n1",
        uid=1000,
        interval_s=interval,
        source="virtual",
        gpus=[G0, G1][:n_gpus],
        started_s=1000.0,
        idle_threshold_pct=1.0,
        timeline_points=points,
        allocated_cores=cores,
    )


def host(t: float, cpu: float | None, rss: int | None = 100) -> HostSample:
    return HostSample(
        time_s=t,
        cpu_time_s=cpu,
        rss_bytes=rss,
        io_read_bytes=10 if cpu is not None else None,
        io_write_bytes=20,
        process_count=1,
        method="proc",
    )


def exact_percentile(values: list[float], q: float) -> float:
    """The same rank rule as Distribution.percentile, on the full sorted list, floored to the
    1 % bin."""
    ordered = sorted(min(100.0, max(0.0, v)) for v in values)
    rank = q / 100.0 * (len(ordered) - 1)
    return float(math.floor(ordered[math.floor(rank)]))


pct = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(st.lists(pct, min_size=1, max_size=300), st.sampled_from([0, 5, 25, 50, 90, 95, 100]))
def test_distribution_percentile_and_mean_match_full_list(values: list[float], q: float) -> None:
    acc = DistAccumulator()
    for v in values:
        acc.add(v)
    dist = acc.freeze()
    assert dist.n == len(values)
    assert dist.mean is not None
    assert math.isclose(dist.mean, sum(values) / len(values), rel_tol=1e-9, abs_tol=1e-9)
    assert dist.percentile(q) == exact_percentile(values, q)


def test_distribution_clamps_out_of_range() -> None:
    acc = DistAccumulator()
    for v in (-5.0, 100.0, 130.0):
        acc.add(v)
    counts = acc.freeze().counts
    assert counts[0] == 1 and counts[100] == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), pct), min_size=1, max_size=400),
    st.integers(min_value=2, max_value=40),
)
def test_gpu_summary_matches_full_list(utils: list[float | None], points: int) -> None:
    agg = make(points=points)
    for i, u in enumerate(utils):
        t = 1000.0 + 10 * i
        agg.add(t, [GpuSample(uuid="GPU-0", time_s=t, utilization_pct=u)], None)
    g = agg.record(ended_s=2e9, complete=True).gpus[0]
    read = [u for u in utils if u is not None]
    assert g.samples == len(utils)
    assert g.utilization.n == len(read)
    assert g.idle_samples == sum(1 for u in read if u <= 1.0)
    active = [1000.0 + 10 * i for i, u in enumerate(utils) if u is not None and u > 1.0]
    assert g.active_first_time_s == (active[0] if active else None)
    assert g.active_last_time_s == (active[-1] if active else None)
    if read:
        assert g.utilization.mean is not None
        assert math.isclose(g.utilization.mean, sum(read) / len(read), abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(pct, st.integers(0, 2**40)), min_size=1, max_size=600),
    st.integers(min_value=2, max_value=64),
)
def test_timeline_merging_preserves_totals(readings: list[tuple[float, int]], points: int) -> None:
    tl = Timeline(1, points, 10.0, 1000.0)
    for i, (u, mem) in enumerate(readings):
        tl.add(1000.0 + 10 * i, [u], [mem], [None], None, None)
    out = tl.points()
    assert len(out) <= points
    assert sum(p.samples for p in out) == len(readings)
    # Bucket means weighted by their sample counts give back the overall mean.
    weighted = sum((p.gpu_utilization_pct[0] or 0.0) * p.samples for p in out)
    assert math.isclose(weighted, sum(u for u, _ in readings), rel_tol=1e-9, abs_tol=1e-6)
    assert max(p.gpu_memory_used_max_bytes[0] or 0 for p in out) == max(m for _, m in readings)
    widths = {p.width_s for p in out}
    assert len(widths) == 1
    # Buckets are contiguous in time and cover every reading.
    assert out[0].t_s == 1000.0
    assert out[-1].t_s + out[-1].width_s > 1000.0 + 10 * (len(readings) - 1)


def test_timeline_memory_is_constant_for_a_week() -> None:
    agg = make(points=512)
    s = [GpuSample(uuid="GPU-0", time_s=0, utilization_pct=50.0)]
    for i in range(60_480):
        agg.add(1000.0 + 10 * i, s, None)
    assert len(agg.timeline.buckets) <= 512
    assert sum(p.samples for p in agg.timeline.points()) == 60_480


def test_energy_from_counter_else_power_integral() -> None:
    agg = make(interval=10.0)
    for i in range(4):
        agg.add(
            1000.0 + 10 * i,
            [GpuSample(uuid="GPU-0", time_s=0, power_w=100.0, energy_mj=5_000_000 + i * 1_000_000)],
            None,
        )
    assert agg.record(ended_s=0, complete=True).gpus[0].energy_j == 3000.0
    agg = make(interval=10.0)
    for i in range(4):
        agg.add(1000.0 + 10 * i, [GpuSample(uuid="GPU-0", time_s=0, power_w=100.0)], None)
    # First reading stands for one interval, the others for the 10 s since the previous one.
    assert agg.record(ended_s=0, complete=True).gpus[0].energy_j == 4000.0


def test_energy_counter_reset_falls_back_to_integral() -> None:
    agg = make(interval=10.0)
    for i, e in enumerate([9_000_000, 9_500_000, 100]):
        agg.add(
            1000.0 + 10 * i, [GpuSample(uuid="GPU-0", time_s=0, power_w=50.0, energy_mj=e)], None
        )
    assert agg.record(ended_s=0, complete=True).gpus[0].energy_j == 1500.0


def test_throttle_nvlink_ecc_xids_processes() -> None:
    agg = make(interval=10.0)
    seq = [
        # util, throttle, nvlink tx, ecc corrected, xids, pids
        (0.0, THROTTLE_GPU_IDLE, 100, 3, (), ()),
        (0.0, THROTTLE_SW_POWER_CAP, 600, 3, (79,), (11,)),
        (90.0, THROTTLE_HW_THERMAL | THROTTLE_SW_POWER_CAP, 700, 5, (79, 48), (11, 12)),
        (0.5, 0, 1700, 6, (), ()),
    ]
    for i, (u, thr, nvl, ecc, xids, pids) in enumerate(seq):
        agg.add(
            1000.0 + 10 * i,
            [
                GpuSample(
                    uuid="GPU-0",
                    time_s=0,
                    utilization_pct=u,
                    throttle_reasons=thr,
                    nvlink_tx_bytes=nvl,
                    nvlink_rx_bytes=0,
                    ecc_corrected_total=ecc,
                    ecc_uncorrected_total=0,
                    xid_events=xids,
                    processes=tuple(GpuProcess(pid=p) for p in pids),
                )
            ],
            None,
        )
    g = agg.record(ended_s=0, complete=True).gpus[0]
    assert g.throttle_power_s == 20.0
    assert g.throttle_thermal_s == 10.0
    assert g.nvlink_bytes == 1600
    # Idle readings: 2nd (500 bytes moved since the 1st) and 4th (1000 bytes).
    assert g.nvlink_bytes_while_idle == 1500
    assert g.ecc_corrected == 3
    assert g.ecc_uncorrected == 0
    assert g.xid_events == (79, 48)
    assert g.process_seen
    assert g.max_processes == 2
    assert g.pids == (11, 12)
    assert g.idle_samples == 3


def test_pids_capped() -> None:
    agg = make()
    for i in range(40):
        agg.add(
            1000.0 + i, [GpuSample(uuid="GPU-0", time_s=0, processes=(GpuProcess(pid=i),))], None
        )
    assert agg.record(ended_s=0, complete=True).gpus[0].pids == tuple(range(MAX_PIDS))


def test_unavailable_gpu_counts_attempts_only() -> None:
    agg = make()
    agg.add(1000.0, [GpuSample(uuid="GPU-0", time_s=0, available=False)], None)
    agg.add(1010.0, [GpuSample(uuid="GPU-0", time_s=0, utilization_pct=40.0)], None)
    g = agg.record(ended_s=0, complete=True).gpus[0]
    assert (g.samples, g.samples_available, g.utilization.n) == (2, 1, 1)
    assert g.energy_j is None and g.nvlink_bytes is None and g.ecc_corrected is None


def test_host_cpu_and_cores_busy() -> None:
    agg = make(cores=4, interval=10.0)
    for i, cpu in enumerate([0.0, 20.0, 60.0, 60.0]):
        agg.add(1000.0 + 10 * i, [], host(1000.0 + 10 * i, cpu, rss=100 * (i + 1)))
    h = agg.record(ended_s=0, complete=True).host
    assert h is not None
    assert h.cpu_time_s == 60.0
    # 2, 4 and 0 cores busy of 4 -> 50 %, 100 %, 0 %.
    assert h.cpu_cores_busy.counts[50] == 1 and h.cpu_cores_busy.counts[100] == 1
    assert h.cpu_cores_busy.counts[0] == 1
    assert h.rss_max_bytes == 400 and h.rss_mean_bytes == 250.0
    assert h.io_read_bytes == 0 and h.io_write_bytes == 0
    tl = agg.record(ended_s=0, complete=True).timeline
    assert [p.host_cpu_cores for p in tl] == [None, 2.0, 4.0, 0.0]


def test_unknown_core_count_leaves_distribution_empty_until_set() -> None:
    agg = make(cores=None)
    agg.add(1000.0, [], host(1000.0, 0.0))
    agg.add(1010.0, [], host(1010.0, 10.0))
    agg.set_allocated_cores(2)
    agg.add(1020.0, [], host(1020.0, 20.0))
    h = agg.record(ended_s=0, complete=True).host
    assert h is not None and h.allocated_cores == 2 and h.cpu_cores_busy.n == 1


def _feed(agg: NodeAggregator, start: int, stop: int) -> None:
    for i in range(start, stop):
        t = 1000.0 + 10 * i
        agg.add(
            t,
            [
                GpuSample(
                    uuid="GPU-0",
                    time_s=t,
                    utilization_pct=float(i % 101),
                    utilization_samples_pct=(1.0, 2.5),
                    power_w=100.0 + i,
                    energy_mj=1000 * i,
                    memory_used_bytes=i * 1000,
                    nvlink_tx_bytes=i * 10,
                    processes=(GpuProcess(pid=5),),
                    sm_active_pct=30.0,
                ),
                GpuSample(uuid="GPU-1", time_s=t, available=i % 3 != 0, utilization_pct=1.0),
            ],
            host(t, float(i)),
        )


def test_state_roundtrip_through_json_continues_identically() -> None:
    a = make(2, points=16)
    _feed(a, 0, 100)
    restored = NodeAggregator.from_state(json.loads(json.dumps(a.state())))
    assert restored.record(ended_s=5, complete=True) == a.record(ended_s=5, complete=True)
    _feed(a, 100, 250)
    _feed(restored, 100, 250)
    assert restored.record(ended_s=9, complete=False) == a.record(ended_s=9, complete=False)


def test_record_notes_deduplicated_and_gpus_in_order() -> None:
    agg = make(2)
    rec = agg.record(ended_s=1, complete=True, notes=["a", "b", "a"])
    assert rec.notes == ("a", "b")
    assert [g.info.uuid for g in rec.gpus] == ["GPU-0", "GPU-1"]
    assert rec.host is None
    assert isinstance(rec.gpus[0].utilization, Distribution)


def test_memory_utilization_is_the_mean_of_the_readings_that_had_it() -> None:
    agg = make(1)
    for i, mem_util in enumerate((10.0, None, 30.0)):
        t = 1010.0 + 10 * i
        sample = GpuSample(
            uuid="GPU-0", time_s=t, utilization_pct=90.0, memory_utilization_pct=mem_util
        )
        agg.add(t, [sample], host(t, float(i)))
    (gpu,) = agg.record(ended_s=1040.0, complete=True).gpus
    assert gpu.memory_utilization_mean_pct == 20.0


def test_a_checkpoint_without_memory_utilization_restores_and_counts_from_then() -> None:
    """A sampler restarted after an upgrade resumes from a checkpoint written before memory
    utilization was counted: the mean covers the readings after the upgrade."""
    agg = make(1)
    agg.add(1010.0, [GpuSample(uuid="GPU-0", time_s=1010.0, utilization_pct=90.0)], None)
    state = json.loads(json.dumps(agg.state()))
    for gpu_state in state["gpus"]:
        del gpu_state["mem_util"]
    restored = NodeAggregator.from_state(state)
    sample = GpuSample(
        uuid="GPU-0", time_s=1020.0, utilization_pct=90.0, memory_utilization_pct=8.0
    )
    restored.add(1020.0, [sample], None)
    (gpu,) = restored.record(ended_s=1030.0, complete=True).gpus
    assert gpu.memory_utilization_mean_pct == 8.0


def test_state_json_is_the_state_with_the_timeline_encoded_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A checkpoint of a long job was mostly the timeline's JSON (issue 29): the buckets that
    # did not change since the last checkpoint are not encoded again, and the text is the
    # same state, through compactions and a restore.
    from slurm_gpu.capture.spool import read_state, write_state

    agg = make(2, points=16)
    for i in range(200):
        util = float(i % 7) * 10.0
        s = [GpuSample(uuid=u, time_s=0, utilization_pct=util, power_w=100.0 + i) for u in
             ("GPU-0", "GPU-1")]  # fmt: skip
        agg.add(1000.0 + 10 * i, s, host(1000.0 + 10 * i, float(i)))
        if i % 6 == 0:
            assert json.loads(agg.state_json()) == json.loads(json.dumps(agg.state()))
    restored = NodeAggregator.from_state(json.loads(agg.state_json()))
    assert json.loads(restored.state_json()) == json.loads(json.dumps(agg.state()))
    path = str(tmp_path / "n1.state")
    write_state(path, agg.state_json(), 77, ["a"])
    state, offset, notes = read_state(path)
    assert offset == 77 and notes == ["a"]
    assert state == json.loads(json.dumps(agg.state()))
    assert agg.record(ended_s=0, complete=True) == (
        NodeAggregator.from_state(state).record(ended_s=0, complete=True)
    )
