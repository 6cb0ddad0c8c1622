"""The steps of a pass around the store's commit: each job's analysed bundle before it, the
AdminComment and ``gpueff`` report publication after it, and the parts a batch is committed in.
Shared by the push pass (``collector``) and the pull pass (``pull``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slurm_gpu.collector.ports import Analyse, CommentPublisher, ReportPublisher
from slurm_gpu.collector.tally import PassTally
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import (
    TELEMETRY_COMPLETE,
    TELEMETRY_MISSING,
    TELEMETRY_NONE,
    TELEMETRY_RECOVERED,
    FindingLike,
    JobBundle,
)

log = logging.getLogger("slurm_gpu.collector")


def telemetry_status(job: JobRecord, nodes: Sequence[NodeRecord], missing: Sequence[str]) -> str:
    """``complete`` / ``recovered`` / ``missing`` / ``none`` for a job and its records."""
    has_gpus = bool(job.alloc_tres.gpus) or any(n.gpus for n in nodes)
    if not has_gpus:
        return TELEMETRY_NONE
    if not nodes:
        return TELEMETRY_MISSING
    if missing or not all(n.complete for n in nodes):
        return TELEMETRY_RECOVERED
    return TELEMETRY_COMPLETE


def analysed_bundle(
    job: JobRecord,
    nodes: Sequence[NodeRecord],
    missing: tuple[str, ...],
    analyse: Analyse | None,
    analysis_version: str | None,
    acc: PassTally,
) -> JobBundle:
    """The bundle the store gets for one job whose records are all in (pushed or pulled):
    its nodes sorted, its telemetry status, and the findings of ``analyse`` (a rule that
    raises stores the job without findings and counts it in ``analysis_failed``)."""
    ordered = tuple(sorted(nodes, key=lambda n: n.hostname))
    findings: tuple[FindingLike, ...] = ()
    version = None
    if analyse is not None:
        try:
            findings = tuple(analyse(job, ordered))
            version = analysis_version
        except Exception as exc:  # a rule bug must not keep the job out of the store
            acc.analysis_failed.append(job.job_id)
            log.exception("job %s: analysis failed (%s); stored without findings", job.job_id, exc)
    return JobBundle(
        job=job,
        nodes=ordered,
        telemetry=telemetry_status(job, ordered, missing),
        missing_hosts=missing,
        findings=findings,
        analysis_version=version,
    )


def publish_stored(
    bundles: Sequence[JobBundle],
    admin_comment: CommentPublisher | None,
    reports: ReportPublisher | None,
    acc: PassTally,
) -> None:
    """After the commit of ``bundles``: their JS1 summaries into AdminComment (when a
    publisher is given; a failure is counted, never undoes the commit), then their
    ``gpueff`` reports."""
    if admin_comment is not None:
        try:
            written, failed = admin_comment.publish(bundles)
        except Exception:  # the jobs are stored; a publisher bug must not end the pass
            log.exception("AdminComment step failed; the jobs are stored")
        else:
            acc.admin_comment_written.extend(written)
            acc.admin_comment_failed.extend(failed)
    if reports is not None:
        reports.publish([b.job for b in bundles])


def _parts(items: list[JobBundle], most: int) -> list[list[JobBundle]]:
    """``items`` cut into the fewest parts of at most ``most``, of sizes as equal as can be
    (500 in parts of 128: four of 125)."""
    count = max(1, -(-len(items) // max(1, most)))
    size, extra = divmod(len(items), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return out
