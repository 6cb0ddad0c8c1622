"""Series bound to the GPUs Slurm allocated (issue 25, last point).

Every GPU series names the number Slurm knows the GPU by on its node (``gpu_index``: the
device minor number the prolog matched ``SLURM_JOB_GPUS`` against, or the source's index where
it knows none), and ``slurm-gpu police`` acts on a job only where the numbers its series name
on each host are the GPU indices Slurm allocated it there (``scontrol -d show job``
``IDX:``). A series naming other GPUs, the same GPU twice, or no number at all is a
``mismatch``, reported and never acted on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from test_live_exporter import Clock, Host, parse
from test_live_police import HOUR, NOW, _labels, acts, of, sj, warned

from slurm_gpu import doctor
from slurm_gpu.capture.livefile import read_live
from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.config import Settings, load_settings
from slurm_gpu.errors import ConfigError
from slurm_gpu.hooks.gpus import resolve_job_gpus
from slurm_gpu.live.exposition import render
from slurm_gpu.live.localwindows import local_windows
from slurm_gpu.live.policy import Decision, PolicyConfig, decide
from slurm_gpu.live.snapshot import parse_summary
from slurm_gpu.prometheus.client import Sample
from slurm_gpu.prometheus.windows import assemble, window_queries
from slurm_gpu.records import GpuInfo, GpuSample, NodeSnapshot

#: Cancel a matched job at once: the strongest action a wrong binding could trigger.
CANCEL = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
PAST = [warned("1", "never_used", NOW - 2 * HOUR)]


def answers(indices: Mapping[str, str | Sequence[str] | None]) -> dict[str, list[Sample]]:
    """Prometheus' answers for job 1 on n1, each GPU never used and idle over the whole
    window by both signals; ``indices``: each GPU's ``gpu_index`` label value(s) now (None:
    its series carry none, as an exporter before the label)."""
    part = _labels("")
    out: dict[str, list[Sample]] = {
        "last": [Sample(part, NOW - 3)],
        "span": [Sample(part, 4 * HOUR)],
        "scraped": [Sample(part, NOW - 2)],
        "changes": [Sample(part, 12.0)],
    }
    for uuid, idx in indices.items():
        gpu = _labels("", uuid)
        for what, value in (
            ("util_max", 0.0),
            ("util_scraped", NOW - 2),
            ("util_points", 1800.0),
            ("busy_growth", 0.0),
            ("sampled_growth", HOUR - 10),
            ("resets", 0.0),
            ("busy_s", 0.0),
            ("sampled_s", 4 * HOUR),
        ):
            out.setdefault(what, []).append(Sample(gpu, value))
        values = [idx] if isinstance(idx, str) else list(idx or [None])
        for v in values:
            labels = gpu if v is None else {**gpu, "gpu_index": v}
            out.setdefault("gpu_index", []).append(Sample(labels, 1.0))
    return out


def police(
    indices: Mapping[str, str | Sequence[str] | None], cfg: PolicyConfig = CANCEL
) -> list[Decision]:
    """The decisions on job 1 (Slurm: GPUs 0 and 1 on n1, already warned) from ``indices``."""
    parts = assemble(answers(indices), NOW, HOUR, "instance")
    return decide(parts, {"1": sj("1", {"n1": 2})}, PAST, cfg, NOW)


# ------------------------------------------------------------------ the policy's binding


@pytest.mark.parametrize(
    ("indices", "why"),
    [
        # Slurm gave the job GPUs 0 and 1; its series describe GPUs 2 and 3 (idle ones).
        ({"GPU-a": "2", "GPU-b": "3"}, "name GPU(s) 2, 3; Slurm allocated the job 0, 1"),
        ({"GPU-a": "0", "GPU-b": "2"}, "name GPU(s) 0, 2; Slurm allocated the job 0, 1"),
        ({"GPU-a": "0", "GPU-b": "0"}, "name GPU(s) 0, 0; Slurm allocated the job 0, 1"),
    ],
)
def test_series_naming_gpus_slurm_did_not_allocate_are_a_mismatch_never_acted_on(
    indices: dict[str, str], why: str
) -> None:
    out = police(indices)
    assert acts(out) == {}
    d = of(out, "1")
    assert d.status == "mismatch" and why in d.reason, d.reason


def test_series_naming_the_allocated_gpus_are_judged_and_cancellable() -> None:
    for indices in ({"GPU-a": "0", "GPU-b": "1"}, {"GPU-a": "1", "GPU-b": "0"}):
        out = police(indices)
        assert acts(out) == {("1", "never_used"): "cancel"}, of(out, "1")


@pytest.mark.parametrize(
    ("indices", "why"),
    [
        ({"GPU-a": None, "GPU-b": None}, "GPU-a on n1: its series carry no gpu_index"),
        ({"GPU-a": "0", "GPU-b": None}, "GPU-b on n1: its series carry no gpu_index"),
        ({"GPU-a": "0", "GPU-b": ["1", "3"]}, "GPU-b on n1 is named GPU 1 and GPU 3 at once"),
        ({"GPU-a": "0", "GPU-b": ["1", None]}, "GPU-b on n1 is named GPU 1 and no GPU at once"),
        ({"GPU-a": "0", "GPU-b": "x1"}, "GPU-b on n1: unreadable gpu_index"),
        ({"GPU-a": "0", "GPU-b": "-1"}, "GPU-b on n1: unreadable gpu_index"),
    ],
)
def test_a_gpu_without_one_readable_number_is_a_mismatch(
    indices: dict[str, str | list[str | None] | None], why: str
) -> None:
    out = police(indices)  # type: ignore[arg-type]
    assert acts(out) == {}
    d = of(out, "1")
    assert d.status == "mismatch" and why in d.reason, d.reason
    if "no gpu_index" in why:
        assert "upgrade" in d.reason and 'police_bind_gpus = "count"' in d.reason


def test_counting_mode_checks_the_number_of_gpus_only() -> None:
    count = PolicyConfig(
        cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0, bind_gpus="count"
    )
    for indices in ({"GPU-a": "2", "GPU-b": "3"}, {"GPU-a": None, "GPU-b": None}):
        assert acts(police(indices, count)) == {("1", "never_used"): "cancel"}
    three = police({"GPU-a": "0", "GPU-b": "1", "GPU-c": "2"}, count)
    assert of(three, "1").status == "mismatch" and "3 GPU series on n1" in of(three, "1").reason


def test_the_window_read_asks_each_gpus_number_now() -> None:
    q = window_queries(3600.0, 120.0, 1.0, "node")
    assert q["gpu_index"] == (
        "max by (job_id, host, job, instance, node, gpu_uuid, gpu_index) (slurm_gpu_gpu_available)"
    )
    # The window answers group without it: series from before and after an exporter upgrade
    # are one GPU's window, not two GPUs.
    assert "gpu_index" not in q["util_max"]


def test_the_policy_config_key_is_declared_with_its_choices(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert Settings().live.police_bind_gpus == "index"
    path.write_text('[live]\npolice_bind_gpus = "count"\n')
    assert load_settings(str(path)).live.police_bind_gpus == "count"
    path.write_text('[live]\npolice_bind_gpus = "uuid"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    assert "must be one of" in str(info.value)
    assert PolicyConfig().bind_gpus == "index"


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


def test_this_nodes_live_files_are_bound_the_same_way() -> None:
    """Without Prometheus (a single GPU server) the live files' numbers are checked."""
    slurm = {"1": sj("1", {"n1": 1})}  # IDX 0
    cfg = PolicyConfig(scrape_job="")
    for extra, status in (
        ({"gpu_index": 0}, "judged"),
        ({"gpu_index": 2}, "mismatch"),
        ({"minor_number": 0}, "judged"),  # a sampler from before gpu_index
        ({}, "mismatch"),
    ):
        job = parse_summary(summary([live_gpu("GPU-a", **extra)]))
        parts = local_windows([job], NOW, HOUR, 120.0)
        out = decide(parts, slurm, [], cfg, NOW)
        assert of(out, "1").status == status, (extra, of(out, "1"))
        assert (acts(out) != {}) == (status == "judged")


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


# ---------------------------------------------------------------------------- the doctor


PROM_CONFIG = "scrape_configs:\n- job_name: slurm-gpu\n  honor_labels: false\n"


def _host(host: str) -> Sample:
    return Sample({"host": host, "job": "slurm-gpu", "instance": f"{host}:9817"}, 1.0)


def test_doctor_warns_of_hosts_whose_gpu_series_carry_no_number() -> None:
    asked: list[str] = []

    def query(q: str) -> list[Sample]:
        asked.append(q)
        return [_host("gpu-02")] if 'gpu_index=""' in q else [_host("gpu-01"), _host("gpu-02")]

    check = doctor.check_live_identity(lambda: PROM_CONFIG, query, "slurm-gpu", "instance", "index")
    assert check.status is doctor.Status.WARN, check.detail
    assert "gpu-02" in check.detail and "gpu_index" in check.detail
    assert 'count by (host) (slurm_gpu_gpu_available{job="slurm-gpu",gpu_index=""})' in asked
    asked.clear()
    counted = doctor.check_live_identity(
        lambda: PROM_CONFIG, query, "slurm-gpu", "instance", "count"
    )
    assert counted.status is doctor.Status.OK and not any("gpu_index" in q for q in asked)
