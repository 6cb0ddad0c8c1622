"""Parsing sacct output into JobRecords: framing, field forms, folding of steps."""

from __future__ import annotations

import pytest
from sacct_fixtures import render, row, step

from slurm_gpu.accounting.sacct import (
    DELIM,
    parse_duration,
    parse_exit,
    parse_sacct_output,
    parse_state,
    split_records,
)

MIB = 1024**2
GIB = 1024**3


def test_completed_job_fields() -> None:
    job = row(MaxRSS="")
    result = parse_sacct_output(render([job, step(job, "batch", MaxRSS="51200K")]))
    assert result.skipped == 0
    rec = result.jobs["101"]
    assert rec.state == "COMPLETED"
    assert (rec.exit_code, rec.exit_signal) == (0, 0)
    assert rec.user == "sgtest1" and rec.uid == 1001
    assert rec.alloc_tres.gpus == 1 and rec.alloc_tres.cpus == 2
    assert rec.req_mem_bytes == 1000 * MIB
    assert rec.max_rss_bytes == 51200 * 1024
    assert rec.total_cpu_s == pytest.approx(1.5)
    assert rec.elapsed_s == 12 and rec.time_limit_s == 600
    assert (rec.submit_s, rec.start_s, rec.end_s) == (1795000000.0, 1795000001.0, 1795000013.0)
    assert rec.nodelist == ("vm",)
    assert rec.comment is None and rec.admin_comment is None
    assert rec.work_dir == "/home/sgtest1"


def test_max_rss_is_the_largest_step() -> None:
    job = row()
    text = render(
        [
            job,
            step(job, "batch", MaxRSS="2G"),
            step(job, "extern", MaxRSS="1M"),
            step(job, "0", MaxRSS="3000M"),
        ]
    )
    assert parse_sacct_output(text).jobs["101"].max_rss_bytes == 3000 * MIB


def test_job_name_with_pipe_newline_and_non_ascii() -> None:
    job = row(JobName="a|b\nc é")
    rec = parse_sacct_output(render([job, step(job, "batch")]).encode()).jobs["101"]
    assert rec.job_name == "a|b\nc é"


def test_newline_in_comment_and_workdir() -> None:
    job = row(Comment="line1\nline2|x", WorkDir="/tmp/we\nird")
    rec = parse_sacct_output(render([job])).jobs["101"]
    assert rec.comment == "line1\nline2|x" and rec.work_dir == "/tmp/we\nird"


def test_delimiter_inside_job_name_goes_back_to_the_name() -> None:
    job = row(JobName=f"x{DELIM}y")
    rec = parse_sacct_output(render([job])).jobs["101"]
    assert rec.job_name == f"x{DELIM}y" and rec.state == "COMPLETED"


def test_cancelled_by_uid() -> None:
    rec = parse_sacct_output(render([row(State="CANCELLED by 1001")])).jobs["101"]
    assert rec.state == "CANCELLED" and rec.cancelled_by_uid == 1001


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("COMPLETED", ("COMPLETED", None)),
        ("CANCELLED by 0", ("CANCELLED", 0)),
        ("", ("UNKNOWN", None)),
    ],
)
def test_parse_state(text: str, expected: tuple[str, int | None]) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("0:0", (0, 0)), ("3:0", (3, 0)), ("0:9", (0, 9)), ("", (None, None))]
)
def test_parse_exit(text: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_exit(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:12", 12.0),
        ("01:02.500", 62.5),
        ("01:00:00", 3600.0),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("", None),
    ],
)
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_unlimited_and_partition_limit_time_limits() -> None:
    jobs = parse_sacct_output(
        render(
            [
                row(JobIDRaw="1", JobID="1", TimelimitRaw="UNLIMITED", Timelimit="UNLIMITED"),
                row(
                    JobIDRaw="2",
                    JobID="2",
                    TimelimitRaw="Partition_Limit",
                    Timelimit="Partition_Limit",
                ),
                row(JobIDRaw="3", JobID="3", TimelimitRaw="", Timelimit="1-00:00:00"),
                row(JobIDRaw="4", JobID="4", TimelimitRaw="4294967295", Timelimit=""),
            ]
        )
    ).jobs
    assert [jobs[i].time_limit_s for i in "1234"] == [None, None, 86400, None]


def test_elapsed_falls_back_to_formatted() -> None:
    rec = parse_sacct_output(render([row(ElapsedRaw="", Elapsed="1-00:00:01")])).jobs["101"]
    assert rec.elapsed_s == 86401


def test_pending_job_has_unknown_times_and_no_nodes() -> None:
    rec = parse_sacct_output(
        render(
            [
                row(
                    State="PENDING",
                    Start="Unknown",
                    End="Unknown",
                    NodeList="None assigned",
                    AllocTRES="",
                    AllocCPUS="0",
                )
            ]
        )
    ).jobs["101"]
    assert rec.start_s is None and rec.end_s is None and rec.nodelist == ()
    assert rec.alloc_tres.gpus is None


@pytest.mark.parametrize(
    ("req_mem", "req_tres", "cpus", "nodes", "expected"),
    [
        ("4000Mc", "", "4", "1", 16000 * MIB),
        ("4000Mn", "", "4", "2", 8000 * MIB),
        ("16G", "", "4", "2", 32 * GIB),
        ("16G", "cpu=4,mem=16G,node=1", "4", "1", 16 * GIB),
        ("0", "", "4", "1", None),
    ],
)
def test_req_mem_forms(
    req_mem: str, req_tres: str, cpus: str, nodes: str, expected: int | None
) -> None:
    rec = parse_sacct_output(
        render([row(ReqMem=req_mem, ReqTRES=req_tres, AllocCPUS=cpus, NNodes=nodes)])
    ).jobs["101"]
    assert rec.req_mem_bytes == expected


def test_array_and_het_ids() -> None:
    jobs = parse_sacct_output(
        render(
            [
                row(JobIDRaw="200", JobID="200_[3-5%1]", State="PENDING"),
                row(JobIDRaw="201", JobID="200_1"),
                row(JobIDRaw="300", JobID="300+0"),
                row(JobIDRaw="301", JobID="300+1"),
            ]
        )
    ).jobs
    assert (jobs["200"].array_job_id, jobs["200"].array_task_id) == ("200", "3-5")
    assert jobs["200"].job_id_display == "200_[3-5]"
    assert (jobs["201"].array_job_id, jobs["201"].array_task_id) == ("200", "1")
    assert (jobs["301"].het_job_id, jobs["301"].het_job_offset) == ("300", 1)
    assert jobs["300"].het_job_offset == 0


def test_requeued_job_keeps_the_last_run_and_counts_restarts() -> None:
    first = row(State="REQUEUED", Start="1795000001", End="1795000005")
    second = row(State="COMPLETED", Start="1795000100", End="1795000200")
    text = render(
        [first, step(first, "batch", MaxRSS="9G"), second, step(second, "batch", MaxRSS="1G")]
    )
    rec = parse_sacct_output(text).jobs["101"]
    assert rec.state == "COMPLETED" and rec.restarts == 1
    assert rec.start_s == 1795000100.0
    assert rec.max_rss_bytes == GIB


def test_total_cpu_sums_steps_when_job_line_is_empty() -> None:
    job = row(TotalCPU="")
    text = render(
        [job, step(job, "batch", TotalCPU="00:02.000"), step(job, "0", TotalCPU="00:03.000")]
    )
    assert parse_sacct_output(text).jobs["101"].total_cpu_s == pytest.approx(5.0)


def test_garbage_is_skipped_not_raised() -> None:
    good = render([row()])
    text = "garbage line\n" + good + "123" + DELIM + "truncated"
    result = parse_sacct_output(text)
    assert list(result.jobs) == ["101"]
    assert result.skipped == 2


def test_record_without_trailing_newline() -> None:
    records, skipped = split_records(render([row()]).rstrip("\n"))
    assert len(records) == 1 and skipped == 0


def test_invalid_utf8_is_replaced() -> None:
    text = render([row(JobName="X")]).encode().replace(b"X", b"\xff\xfe")
    assert parse_sacct_output(text).jobs["101"].job_name == "\ufffd\ufffd"
