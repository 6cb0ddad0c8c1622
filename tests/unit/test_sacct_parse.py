"""Parsing sacct output into JobRecords: framing, field forms, folding of steps."""

from __future__ import annotations

import pytest
from sacct_fixtures import FormatRunner, parse_rows, render, render_text, row, step

from slurm_gpu.accounting.sacct import (
    DELIM,
    SacctSource,
    UserText,
    parse_duration,
    parse_exit,
    parse_sacct_output,
    parse_state,
    split_records,
    verify_text,
)
from slurm_gpu.accounting.usertext import COMMENT_MAX_LEN, JOB_NAME_MAX_LEN
from slurm_gpu.textsafe import REPLACEMENT

MIB = 1024**2
GIB = 1024**3


def test_completed_job_fields() -> None:
    job = row(MaxRSS="")
    result = parse_rows([job, step(job, "batch", MaxRSS="51200K")])
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


def test_job_name_with_pipe_newline_and_non_ascii_is_kept_and_cleaned() -> None:
    job = row(JobName="a|b\nc é")
    rec = parse_sacct_output(
        render([job, step(job, "batch")]).encode(), text=render_text([job]).encode()
    ).jobs["101"]
    assert rec.job_name == f"a|b{REPLACEMENT}c é"


def test_newline_in_comment_and_workdir() -> None:
    job = row(Comment="line1\nline2|x", WorkDir="/tmp/we\nird")
    rec = parse_rows([job]).jobs["101"]
    assert rec.comment == f"line1{REPLACEMENT}line2|x"
    assert rec.work_dir == f"/tmp/we{REPLACEMENT}ird"


def test_user_strings_are_cleaned_and_bounded() -> None:
    job = row(JobName="\x1b[31mred\u202e" + "n" * 1000, Comment="c" * 5000, WorkDir="/w")
    rec = parse_rows([job]).jobs["101"]
    assert "\x1b" not in rec.job_name and "\u202e" not in rec.job_name
    assert len(rec.job_name) == JOB_NAME_MAX_LEN and rec.job_name.endswith("…")
    assert rec.comment is not None and len(rec.comment) == COMMENT_MAX_LEN


def test_delimiter_inside_job_name_drops_the_strings_not_the_record() -> None:
    job = row(JobName=f"x{DELIM}y")
    result = parse_rows([job, row(JobIDRaw="102", JobID="102", JobName="ok")])
    rec = result.jobs["101"]
    assert rec.state == "COMPLETED" and rec.uid == 1001
    assert rec.job_name == "" and rec.work_dir is None
    assert not result.text_verified


def test_accounting_record_with_a_field_too_many_is_skipped_not_refitted() -> None:
    text = render([row()]).replace("COMPLETED", f"COMPLETED{DELIM}x")
    result = parse_sacct_output(text)
    assert result.jobs == {} and result.skipped == 1


def test_without_the_text_query_strings_are_empty() -> None:
    rec = parse_sacct_output(render([row()])).jobs["101"]
    assert rec.job_name == "" and rec.comment is None and rec.work_dir is None


def test_cancelled_by_uid() -> None:
    rec = parse_rows([row(State="CANCELLED by 1001")]).jobs["101"]
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
    rec = parse_rows([row(ElapsedRaw="", Elapsed="1-00:00:01")]).jobs["101"]
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
        # Since 21.08 a bare ReqMem is the job's total: not multiplied by the nodes.
        ("16G", "", "4", "2", 16 * GIB),
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


def test_four_node_job_reqmem_312g_without_mem_in_reqtres_is_the_jobs_total() -> None:
    # Another site's recorded 4-node job: ReqTRES without mem=, ReqMem=312.50G (sacct prints
    # the job's total there); read as 4 x 312.5 GiB = 1,250 GiB it inflated every memory
    # finding and recommendation.
    rec = parse_sacct_output(
        render(
            [
                row(
                    ReqMem="312.50G",
                    ReqTRES="billing=256,cpu=256,gres/gpu=16,node=4",
                    AllocCPUS="256",
                    NNodes="4",
                    AllocTRES="billing=256,cpu=256,gres/gpu=16,node=4",
                )
            ]
        )
    ).jobs["101"]
    assert rec.req_mem_bytes == int(312.5 * GIB)


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
    job = row(JobName="X")
    text = render_text([job]).encode().replace(b"X", b"\xff\xfe")
    assert parse_sacct_output(render([job]), text=text).jobs["101"].job_name == "\ufffd\ufffd"


def test_requeued_job_takes_the_text_of_its_last_run() -> None:
    first = row(State="REQUEUED", JobName="old")
    second = row(State="COMPLETED", JobName="new")
    rec = parse_rows([first, step(first, "batch"), second]).jobs["101"]
    assert rec.job_name == "new" and rec.restarts == 1


def test_a_name_holding_the_fixed_delimiter_does_not_blank_other_jobs() -> None:
    """The text query's delimiter is drawn at random per call, so a name written with the
    accounting query's delimiter is just text: every job keeps its strings."""
    rows = [row(JobName=f"evil{DELIM}\n101{DELIM}x"), row(JobIDRaw="102", JobID="102")]
    runner = FormatRunner(rows)
    source = SacctSource(runner=runner)
    jobs = source.get_jobs(["101", "102"])
    assert jobs["102"].job_name == "train" and jobs["101"].job_name.startswith("evil")
    assert source.last_text_dropped == 0
    delimiters = {a for c in runner.calls for a in c if a.startswith("--delimiter=")}
    assert len(delimiters) == 2  # the accounting query's and one random text delimiter


def test_text_that_does_not_match_is_retried_once_then_dropped() -> None:
    rows = [row()]
    runner = FormatRunner(rows, text_override=lambda d: "")
    source = SacctSource(runner=runner)
    rec = source.get_jobs(["101"])["101"]
    assert (rec.uid, rec.state, rec.job_name, rec.work_dir) == (1001, "COMPLETED", "", None)
    assert len(runner.calls) == 4 and source.last_text_dropped == 1


D = DELIM


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (f"1{D}a{D}b{D}c{D}s{D}1\n2{D}d{D}e{D}f{D}t{D}2\n", True),
        (f"1{D}a{D}b{D}c{D}s{D}1\n2{D}d{D}e{D}f{D}t{D}2", True),
        (f"1{D}a{D}b{D}c{D}s{D}1\n", False),  # a job missing
        (f"2{D}d{D}e{D}f{D}t{D}2\n1{D}a{D}b{D}c{D}s{D}1\n", False),
        (f"1{D}a{D}b{D}c{D}s\n{D}1\n2{D}d{D}e{D}f{D}t{D}2\n", True),
        (f"1{D}a{D}b{D}c{D}s{D}1\n3{D}d{D}e{D}f{D}t{D}2\n", False),
        (f"1{D}a{D}b{D}x{D}c{D}s{D}1\n2{D}d{D}e{D}f{D}t{D}2\n", False),
        # The frame before SubmitLine was asked for (three strings): refused.
        (f"1{D}a{D}b{D}c{D}1\n2{D}d{D}e{D}f{D}2\n", False),
    ],
)
def test_verify_text_accepts_only_the_exact_frame(text: str, ok: bool) -> None:
    got = verify_text(text, ["1", "2"], DELIM)
    assert (got is not None) == ok
    if got is not None:
        assert got["2"] == UserText(job_name="d", comment="e", work_dir="f", submit_line="t")


def test_node_list_too_large_rejects_that_job_with_a_reason() -> None:
    result = parse_rows([row(NodeList="n[1-70000]"), row(JobIDRaw="102", JobID="102")])
    assert list(result.jobs) == ["102"]
    assert "more than 65536 hosts" in result.rejected["101"]
