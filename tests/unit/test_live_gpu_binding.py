"""Each GPU's number (issue 25, last point): every GPU series names the number Slurm knows
the GPU by on its node (``gpu_index``: the device minor number the prolog matched
``SLURM_JOB_GPUS`` against, or the source's index where it knows none).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_live_exporter import Clock, Host, parse
from test_live_police import HOUR, NOW

from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.capture.spool import read_live
from slurm_gpu.hooks.gpus import resolve_job_gpus
from slurm_gpu.live.exposition import render
from slurm_gpu.live.snapshot import parse_summary
from slurm_gpu.records import GpuInfo, GpuSample, NodeSnapshot

# ------------------------------------------------------ the node: sampler, file, exposition


def summary(gpus: list[dict[str, object]]) -> dict[str, object]:
    return {
        "job_id": "1",
        "hostname": "n1",
        "user": "alice",
        "started_s": NOW - 4 * HOUR,
        "updated_s": NOW - 5,
        "interval_s": 1.0,
        "gpus": gpus,
    }


def live_gpu(uuid: str, **extra: object) -> dict[str, object]:
    """A GPU of a live summary, never used and idle for 4 hours."""
    return {
        "uuid": uuid,
        "utilization_pct": 0.0,
        "utilization_recent_pct": 0.0,
        "recent_window_s": 300.0,
        "busy_s": 0.0,
        "sampled_s": 4 * HOUR,
        "idle_since_s": NOW - 4 * HOUR,
        **extra,
    }


def test_the_exposition_names_each_gpus_slurm_number() -> None:
    job = parse_summary(
        summary(
            [
                live_gpu("GPU-a", gpu_index=3, minor_number=3),
                # A sampler from before gpu_index: its minor number is the number it matched.
                live_gpu("GPU-b", minor_number=5),
                # A MIG slice: no number of its own.
                live_gpu("MIG-c", gpu_index=None, minor_number=None),
            ]
        )
    )
    assert [g.gpu_index for g in job.gpus] == [3, 5, None]
    families = parse(render(NodeSnapshot((job,), 0, 0)))
    for name, fam in families.items():
        for labels, _v in fam.samples:
            if "gpu_uuid" not in labels:
                assert "gpu_index" not in labels, name
    available = families["slurm_gpu_gpu_available"].samples
    avail = {lb["gpu_uuid"]: lb.get("gpu_index") for lb, _v in available}
    assert avail == {"GPU-a": "3", "GPU-b": "5", "MIG-c": None}


@pytest.mark.parametrize("bad", [True, -1, 2.5, "3", '3"} evil 1', 2**40, None])
def test_a_gpu_index_that_is_not_a_small_whole_number_is_left_out(bad: object) -> None:
    [g] = parse_summary(summary([live_gpu("GPU-a", gpu_index=bad)])).gpus
    assert g.gpu_index is None


class Source:
    """GPUs as a telemetry source lists them; every one idle."""

    name = "fake"

    def __init__(self, gpus: Sequence[GpuInfo]) -> None:
        self.gpus = gpus

    def list_gpus(self) -> Sequence[GpuInfo]:
        return self.gpus

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        return [GpuSample(uuid=u, time_s=0.0, utilization_pct=0.0) for u in uuids]

    def close(self) -> None:
        pass


WITH_MINORS = [
    GpuInfo(uuid="GPU-a", index=0, minor_number=2),
    GpuInfo(uuid="GPU-b", index=1, minor_number=0),
    GpuInfo(uuid="GPU-c", index=2, minor_number=1),
    GpuInfo(uuid="MIG-d", parent_uuid="GPU-c", gpu_instance_id=1, compute_instance_id=0),
]
NO_MINORS = [GpuInfo(uuid="GPU-a", index=0), GpuInfo(uuid="GPU-b", index=1)]


@pytest.mark.parametrize(
    ("gpus", "job", "expected"),
    [
        (WITH_MINORS, ("GPU-a", "GPU-c"), [2, 1]),
        (WITH_MINORS, ("MIG-d",), [None]),
        (NO_MINORS, ("GPU-b",), [1]),
    ],
)
def test_the_live_summary_carries_the_number_the_prolog_matched(
    tmp_path: Path, gpus: list[GpuInfo], job: tuple[str, ...], expected: list[int | None]
) -> None:
    clock = Clock()
    opts = SamplerOptions(
        job_id="42",
        hostname="n1",
        uid=1000,
        gpu_uuids=job,
        spool_dir=str(tmp_path / "spool"),
        interval_s=10.0,
        checkpoint_interval_s=600.0,
        idle_threshold_pct=1.0,
        timeline_points=64,
    )
    sampler = Sampler(opts, lambda: Source(gpus), Host(), clock=clock)
    sampler.open_spool()
    sampler.read_once()
    sampler.write_live()
    body = read_live(sampler.paths.live)
    assert [g["gpu_index"] for g in body["gpus"]] == expected
    json.dumps(body)  # plain JSON


@pytest.mark.parametrize("gpus", [WITH_MINORS, NO_MINORS])
def test_the_number_is_what_the_prolog_resolves_slurm_job_gpus_by(gpus: list[GpuInfo]) -> None:
    """The node's own rule (``hooks.gpus``): SLURM_JOB_GPUS=N is the GPU whose number is N."""
    from slurm_gpu.telemetry.base import slurm_gpu_index

    for g in gpus:
        n = slurm_gpu_index(g, gpus)
        if g.parent_uuid is not None:
            assert n is None
            continue
        assert n is not None
        assert resolve_job_gpus(str(n), None, gpus).uuids == (g.uuid,)
