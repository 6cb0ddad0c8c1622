"""The collector's optional last step: each stored GPU job's JS1 summary into AdminComment.

Runs only after the store commit, so a failure here never keeps a job out of the store. It
writes one summary per job with ``sacctmgr`` (``AdminCommentWriter.write``: bounded retries,
then a read-back check), and stops for the rest of the run when writing cannot work:

- the read-back shows the comment lower-cased (Slurm 22.05's sacctmgr does that to every
  value, measured on the test cluster): every later write would be broken too;
- ``max_consecutive_failures`` writes in a row failed (no rights, slurmdbd down): asking
  slurmdbd again for each of thousands of jobs would only add load.

Either is logged once; the jobs not written after that are counted, not logged one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from slurm_gpu.accounting.admincomment import AdminCommentCaseError, build_summary, encode
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, TELEMETRY_RECOVERED, JobBundle

log = logging.getLogger("slurm_gpu.collector")

CASE_HINT = (
    "this Slurm's sacctmgr lower-cases AdminComment (seen on 22.05); upgrade Slurm or leave "
    "collector.admin_comment off"
)


class CommentWriter(Protocol):
    """What the publisher needs of ``AdminCommentWriter``."""

    def write(self, job: JobRecord, comment: str) -> int: ...


class AdminCommentPublisher:
    """Writes the JS1 summary of stored GPU jobs with telemetry into Slurm's AdminComment.

    One instance lives for a whole ``slurm-gpu collect`` run, so that a stop holds across
    passes. ``stopped`` is the reason it stopped, ``None`` while it still writes.
    """

    def __init__(self, writer: CommentWriter, *, max_consecutive_failures: int = 3) -> None:
        self.writer = writer
        self.max_consecutive_failures = max_consecutive_failures
        self.stopped: str | None = None
        self._failures_in_a_row = 0

    def publish(self, bundles: Sequence[JobBundle]) -> tuple[list[str], list[str]]:
        """Write the summaries of ``bundles`` that have GPU telemetry; never raises.

        Returns (job ids written, job ids not written). Jobs without telemetry are in neither.
        """
        written: list[str] = []
        failed: list[str] = []
        for bundle in bundles:
            if not has_gpu_telemetry(bundle.telemetry, bundle.nodes):
                continue
            job_id = bundle.job.job_id
            if self.stopped is not None:
                failed.append(job_id)
                continue
            try:
                comment = encode(build_summary(bundle.job, bundle.nodes))
                attempts = self.writer.write(bundle.job, comment)
            except AdminCommentCaseError as exc:
                failed.append(job_id)
                self.stopped = "lower-cased"
                log.error(
                    "job %s: AdminComment not written: %s; hint: %s. No more summaries are "
                    "written in this run",
                    job_id,
                    exc,
                    CASE_HINT,
                )
                continue
            except SlurmGpuError as exc:
                failed.append(job_id)
                self._failures_in_a_row += 1
                log.warning("job %s: AdminComment not written: %s", job_id, exc)
                if self._failures_in_a_row >= self.max_consecutive_failures:
                    self.stopped = "failures"
                    log.error(
                        "%d AdminComment writes failed in a row; no more are tried in this run "
                        "(hint: %s)",
                        self._failures_in_a_row,
                        exc.hint or "run the collector as root or a Slurm operator",
                    )
                continue
            self._failures_in_a_row = 0
            written.append(job_id)
            log.info("job %s: AdminComment written (%d attempt(s))", job_id, attempts)
        return written, failed


def has_gpu_telemetry(telemetry: str, nodes: Sequence[NodeRecord]) -> bool:
    """Whether a stored job has GPU readings worth a summary."""
    return telemetry in (TELEMETRY_COMPLETE, TELEMETRY_RECOVERED) and any(n.gpus for n in nodes)


__all__ = ["CASE_HINT", "AdminCommentPublisher", "CommentWriter", "has_gpu_telemetry"]
