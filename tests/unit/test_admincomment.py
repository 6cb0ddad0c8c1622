"""JS1 AdminComment: the summary is what reportseff's own parser reads; the writer retries."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping, Sequence

import pytest
from reportseff import job as reportseff_job
from sacct_fixtures import render, row

from slurm_gpu.accounting.admincomment import (
    AdminCommentWriter,
    build_summary,
    decode,
    encode,
    sacctmgr_target,
)
from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import parse_sacct_output
from slurm_gpu.capture.aggregate import distribution_of as dist
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import (
    GpuInfo,
    GpuSummary,
    HostSummary,
    JobRecord,
    NodeRecord,
)

GIB = 1024**3


def gpu(minor: int, util: list[float], used_gib: float, total_gib: float = 80) -> GpuSummary:
    return GpuSummary(
        info=GpuInfo(
            uuid=f"GPU-{minor}", minor_number=minor, memory_total_bytes=int(total_gib * GIB)
        ),
        samples=len(util),
        samples_available=len(util),
        first_time_s=0.0,
        last_time_s=float(len(util)),
        utilization=dist(util),
        sub_samples=dist([]),
        idle_samples=0,
        active_first_time_s=None,
        active_last_time_s=None,
        memory_used_max_bytes=int(used_gib * GIB),
        memory_used_mean_bytes=None,
        power_mean_w=None,
        power_max_w=None,
        energy_j=None,
        sm_clock_mean_mhz=None,
        temperature_max_c=None,
        throttle_power_s=0.0,
        throttle_thermal_s=0.0,
        pcie_tx_mean_bytes_per_s=None,
        pcie_rx_mean_bytes_per_s=None,
        nvlink_bytes=None,
        nvlink_bytes_while_idle=None,
        ecc_corrected=None,
        ecc_uncorrected=None,
        xid_events=(),
        process_seen=True,
        max_processes=1,
        pids=(),
        sm_active_mean_pct=None,
        tensor_active_mean_pct=None,
    )


def node(host: str, gpus: tuple[GpuSummary, ...], cpu_s: float = 100.0) -> NodeRecord:
    return NodeRecord(
        job_id="101",
        hostname=host,
        uid=1001,
        interval_s=1.0,
        source="virtual",
        started_s=0.0,
        ended_s=100.0,
        gpus=gpus,
        host=HostSummary(
            method="cgroup1",
            samples=100,
            cpu_time_s=cpu_s,
            cpu_cores_busy=dist([]),
            allocated_cores=4,
            rss_max_bytes=2 * GIB,
            rss_mean_bytes=None,
            io_read_bytes=None,
            io_write_bytes=None,
        ),
        timeline=(),
        complete=True,
    )


def job(**over: str) -> JobRecord:
    fields = {
        "AllocTRES": "cpu=8,mem=16G,node=2,billing=8,gres/gpu=3",
        "ReqTRES": "cpu=8,mem=16G,node=2,billing=8,gres/gpu=3",
        "AllocCPUS": "8",
        "NNodes": "2",
        "ElapsedRaw": "100",
    }
    fields.update(over)
    return parse_sacct_output(render([row(**fields)])).jobs[fields.get("JobIDRaw", "101")]


def nodes() -> list[NodeRecord]:
    return [
        node("gpu01", (gpu(0, [50.0, 70.0], 10), gpu(1, [0.0, 0.0], 0.5))),
        node("gpu02", (gpu(3, [90.0, 90.0], 40),), cpu_s=200.0),
    ]


def test_summary_shape() -> None:
    summary = build_summary(job(), nodes())
    assert summary["gpus"] == 3 and summary["total_time"] == 100
    n1 = summary["nodes"]["gpu01"]
    assert n1["gpu_utilization"] == {"0": 60.0, "1": 0.0}
    assert n1["gpu_used_memory"] == {"0": 10 * GIB, "1": GIB // 2}
    assert n1["gpu_total_memory"] == {"0": 80 * GIB, "1": 80 * GIB}
    assert n1["total_memory"] == 8 * GIB and n1["used_memory"] == 2 * GIB
    assert n1["cpus"] == 4 and n1["total_time"] == 100.0


def test_reportseff_reads_our_numbers() -> None:
    comment = encode(build_summary(job(), nodes()))
    parsed = reportseff_job._parse_admin_comment_to_dict(comment)
    assert parsed is not None
    per_node = {n: reportseff_job._get_node_data(parsed, d) for n, d in parsed["nodes"].items()}
    assert per_node["gpu01"]["GPUEff"] == 30.0  # mean of 60 and 0
    assert per_node["gpu02"]["GPUEff"] == 90.0
    assert per_node["gpu02"]["GPUMem"] == 50.0  # 40 of 80 GiB
    assert per_node["gpu01"]["MemEff"] == 25.0  # 2 of 8 GiB
    # CPUEff: 100 CPU-s over 4 cores over 100 s
    assert per_node["gpu01"]["CPUEff"] == 25.0


def test_reportseff_job_object_shows_gpu_columns() -> None:
    comment = encode(build_summary(job(), nodes()))
    rjob = reportseff_job.Job("101", "101", None)
    rjob.update(
        {
            "JobID": "101",
            "JobIDRaw": "101",
            "State": "COMPLETED",
            "AdminComment": comment,
            "Elapsed": "00:01:40",
            "Timelimit": "00:10:00",
            "TotalCPU": "00:05:00",
            "AllocCPUS": "8",
            "ReqMem": "16G",
            "NNodes": "2",
        }
    )
    # reportseff averages per node first: ((60 + 0) / 2 + 90) / 2
    assert rjob.get_entry("GPUEff") == 60.0
    assert rjob.get_entry("GPUMem") == pytest.approx(((12.5 + 0.6) / 2 + 50) / 2, abs=0.1)


def test_round_trip_and_size_for_8_gpus() -> None:
    eight = [node("gpu01", tuple(gpu(i, [float(10 * i)] * 50, i) for i in range(8)))]
    summary = build_summary(job(AllocTRES="cpu=8,mem=16G,node=1,gres/gpu=8", NNodes="1"), eight)
    comment = encode(summary)
    assert comment.startswith("JS1:")
    assert len(comment) < 1024
    assert decode(comment) == summary


def test_missing_totals_are_left_out_not_zero() -> None:
    record = job(ReqTRES="", ReqMem="0")
    summary = build_summary(record, [node("gpu01", (gpu(0, [5.0], 1, total_gib=0),))])
    entry = summary["nodes"]["gpu01"]
    assert "total_memory" not in entry and "gpu_total_memory" not in entry
    parsed = reportseff_job._parse_admin_comment_to_dict(encode(summary))
    assert parsed is not None
    reportseff_job._get_node_data(parsed, parsed["nodes"]["gpu01"])  # no ZeroDivisionError


@pytest.mark.parametrize(
    ("comment", "message"),
    [
        ("JS2:abcd", "unknown job summary version"),
        ("hello", "not a job summary"),
        ("JS1:!!!notbase64", "corrupt"),
        ("JS1:" + base64.b64encode(b"not gzip").decode(), "corrupt"),
        ("JS1:" + base64.b64encode(gzip.compress(b"[1,2]")).decode(), "lacks"),
    ],
)
def test_decode_rejects(comment: str, message: str) -> None:
    with pytest.raises(AccountingError, match=message):
        decode(comment)


def test_encode_is_deterministic() -> None:
    summary = build_summary(job(), nodes())
    assert encode(summary) == encode(json.loads(json.dumps(summary)))


def test_sacctmgr_target_names_array_tasks_by_array_and_task() -> None:
    task = parse_sacct_output(render([row(JobIDRaw="14", JobID="5_2")])).jobs["14"]
    plain = parse_sacct_output(render([row()])).jobs["101"]
    het = parse_sacct_output(render([row(JobIDRaw="12", JobID="11+1")])).jobs["12"]
    assert (sacctmgr_target(task), sacctmgr_target(plain), sacctmgr_target(het)) == (
        "5_2",
        "101",
        "12",
    )


class FlakyRunner:
    """sacctmgr that fails ``failures`` times; sacct that reads back ``stored`` (default: what
    was written); scontrol that refuses as for a finished job."""

    def __init__(self, failures: int, stored: str | None = None) -> None:
        self.failures = failures
        self.stored = stored
        self.written = ""
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        if argv[0] == "sacct":
            value = self.stored if self.stored is not None else self.written
            return CommandResult(0, (value + "\n").encode(), "")
        self.calls.append(list(argv))
        if argv[0] == "scontrol":
            return CommandResult(1, b"", "Job has already finished for job 101")
        self.written = argv[-1].split("=", 1)[1]
        if len(self.calls) <= self.failures:
            return CommandResult(1, b"", " Nothing modified\n")
        return CommandResult(
            0, b" Modified job(s)...\n  101 submitted at 2026-11-21T10:00:00\n", ""
        )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_writer_retries_until_slurmdbd_accepts() -> None:
    runner, clock = FlakyRunner(failures=3), FakeClock()
    writer = AdminCommentWriter(runner=runner, clock=clock, sleep=clock.sleep, retry_for_s=10)
    comment = encode(build_summary(job(), nodes()))
    assert writer.write(job(), comment) == 4
    assert runner.calls[-1] == [
        "sacctmgr",
        "-i",
        "modify",
        "job",
        "where",
        "jobid=101",
        "set",
        f"AdminComment={comment}",
    ]


def test_writer_gives_up_with_a_typed_error() -> None:
    runner, clock = FlakyRunner(failures=100), FakeClock()
    writer = AdminCommentWriter(runner=runner, clock=clock, sleep=clock.sleep, retry_for_s=5)
    with pytest.raises(AccountingError, match="Nothing modified"):
        writer.write(job(), encode(build_summary(job(), nodes())))
    assert len(runner.calls) == 6


def test_writer_refuses_non_js1_text() -> None:
    with pytest.raises(AccountingError):
        AdminCommentWriter(runner=FlakyRunner(0)).write(job(), "JS1:a b")


def test_writer_detects_a_lowercased_comment() -> None:
    """Slurm 22.05's sacctmgr stores AdminComment lower-cased (measured on the test cluster)."""
    comment = encode(build_summary(job(), nodes()))
    runner = FlakyRunner(failures=0, stored=comment.lower())
    with pytest.raises(AccountingError, match="lower-cased"):
        AdminCommentWriter(runner=runner).write(job(), comment)


def test_write_running_uses_scontrol_and_types_its_refusal() -> None:
    runner = FlakyRunner(failures=0)
    comment = encode(build_summary(job(), nodes()))
    with pytest.raises(AccountingError, match="already finished"):
        AdminCommentWriter(runner=runner).write_running(job(), comment)
    assert runner.calls[0] == ["scontrol", "update", "jobid=101", f"AdminComment={comment}"]


def test_cpus_only_with_cpu_time() -> None:
    """reportseff raises KeyError on a node with cpus but no total_time (found on the cluster)."""
    bare = node("gpu01", (gpu(0, [5.0], 1),))
    no_host = NodeRecord(**{**{f: getattr(bare, f) for f in bare.__slots__}, "host": None})
    entry = build_summary(job(), [no_host])["nodes"]["gpu01"]
    assert "cpus" not in entry and "total_time" not in entry
    parsed = reportseff_job._parse_admin_comment_to_dict(encode(build_summary(job(), [no_host])))
    assert parsed is not None
    reportseff_job._get_node_data(parsed, parsed["nodes"]["gpu01"])
