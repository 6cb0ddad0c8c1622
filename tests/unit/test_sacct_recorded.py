"""Parser on sacct 22.05 output recorded from the local test cluster (tests/data/sacct)."""

from __future__ import annotations

from sacct_fixtures import DATA, parse_rows, recorded_rows

from slurm_gpu.accounting import is_settled
from slurm_gpu.textsafe import REPLACEMENT

MIB = 1024**2


def test_cluster_jobs() -> None:
    jobs = parse_rows(recorded_rows(DATA / "cluster_jobs.txt")).jobs
    one, two, name, fail, tout, canc, mem = (jobs[i] for i in ("2", "3", "4", "6", "7", "8", "9"))
    assert one.alloc_tres.gpus == 1 and one.alloc_tres.gpu_types == (("a100", 1),)
    assert one.max_rss_bytes == 96596 * 1024 and one.total_cpu_s == 3.08
    # --mem-per-cpu=300M with -c 2: sacct 22.05 already reports the 600M node total.
    assert two.alloc_tres.gpus == 2 and two.req_mem_bytes == 600 * MIB and two.alloc_cpus == 2
    # The newline of the name is a control character: replaced where it enters.
    assert name.job_name == f"a|b{REPLACEMENT}c é" and name.comment == "note|x"
    assert (fail.state, fail.exit_code) == ("FAILED", 3)
    assert tout.state == "TIMEOUT" and tout.time_limit_s == 60 and tout.elapsed_s >= 60
    assert (canc.state, canc.cancelled_by_uid) == ("CANCELLED", 1001)
    # ConstrainRAMSpace=no on the test cluster: the over-allocation is recorded, not killed.
    assert mem.state == "COMPLETED" and mem.max_rss_bytes is not None
    assert mem.req_mem_bytes is not None and mem.max_rss_bytes > mem.req_mem_bytes
    tasks = sorted(j.array_task_id or "" for j in jobs.values() if j.array_job_id == "5")
    assert tasks == ["1", "2", "3", "4", "5"]
    assert jobs["12"].het_job_offset == 1 and jobs["11"].het_job_offset == 0
    assert jobs["17"].restarts == 1
    assert all(is_settled(j) for j in (one, two, name, fail, tout, canc, mem))


def test_array_with_pending_range() -> None:
    jobs = parse_rows(recorded_rows(DATA / "array_pending.txt")).jobs
    pending = jobs["5"]
    assert pending.job_id_display == "5_[4-5]" and pending.array_task_id == "4-5"
    assert pending.state == "PENDING" and pending.start_s is None and pending.nodelist == ()
    assert jobs["7"].state == "RUNNING" and jobs["7"].end_s is None and not is_settled(jobs["7"])


def test_records_seen_before_slurmdbd_has_the_job_are_not_settled() -> None:
    """Seconds after submission sacct shows job lines built from the steps alone: no
    partition, UID 0, JobName 'allocation', no ReqTRES, ReqMem '16?'."""
    jobs = parse_rows(recorded_rows(DATA / "early_unsettled.txt")).jobs
    early = jobs["2"]
    assert (
        early.state == "COMPLETED" and early.req_tres.raw == "" and early.job_name == "allocation"
    )
    assert not is_settled(early)
