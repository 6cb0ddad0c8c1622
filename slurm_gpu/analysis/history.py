"""Similar past jobs of the same user, as the analysis needs them (no I/O: the caller, which
reads the store, passes them in)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_gpu.analysis.metrics import JobMetrics
from slurm_gpu.records import JobRecord


@dataclass(frozen=True, slots=True)
class PastJob:
    """The peaks of one earlier job, enough to size a request that would have fit it too."""

    job_id: str
    user: str
    job_name: str
    work_dir: str | None
    state: str
    elapsed_s: int
    gpus_allocated: int
    gpus_used: int | None
    """GPUs that ran kernels; ``None`` without telemetry."""
    gpu_memory_peak_bytes: int | None
    """Largest GPU memory peak over its GPUs."""
    host_rss_peak_bytes: int | None
    """Largest resident memory on one node."""
    host_cores_peak: float | None
    """Most cores busy on one node at once."""
    account: str | None = None
    """The Slurm account it ran under (similar jobs share it)."""
    finding_codes: tuple[str, ...] = ()
    """The codes of its warning and critical findings, as stored (repeated faults)."""

    @classmethod
    def from_metrics(
        cls, job: JobRecord, metrics: JobMetrics, finding_codes: Iterable[str] = ()
    ) -> PastJob:
        """The summary of an analysed job, for storing and for later recommendations;
        ``finding_codes``: its stored warning and critical findings' codes."""
        peaks = [g.memory_peak_bytes for g in metrics.gpus if g.memory_peak_bytes is not None]
        rss = metrics.host_rss_peak_bytes
        if rss is None:
            rss = job.max_rss_bytes
        return cls(
            job_id=job.job_id,
            user=job.user,
            job_name=job.job_name,
            work_dir=job.work_dir,
            state=job.state,
            elapsed_s=job.elapsed_s,
            gpus_allocated=metrics.gpus_allocated,
            gpus_used=metrics.gpus_used if metrics.gpus_observed else None,
            gpu_memory_peak_bytes=max(peaks) if peaks else None,
            host_rss_peak_bytes=rss,
            host_cores_peak=metrics.host_cores_peak,
            account=job.account,
            finding_codes=tuple(dict.fromkeys(finding_codes)),
        )


def similar_jobs(
    job: JobRecord, history: Iterable[PastJob], limit: int = 20
) -> tuple[PastJob, ...]:
    """The user's earlier jobs with the same name (same script, same work directory and same
    account when both are known), at most ``limit``, in the order given (newest first by
    convention)."""
    out = []
    for past in history:
        if past.job_id == job.job_id or past.user != job.user or past.job_name != job.job_name:
            continue
        if job.work_dir and past.work_dir and job.work_dir != past.work_dir:
            continue
        if job.account and past.account and job.account != past.account:
            continue
        out.append(past)
        if len(out) >= limit:
            break
    return tuple(out)


def repeated_codes(codes: Iterable[str], past: Sequence[PastJob]) -> dict[str, int]:
    """For each of ``codes``, how many of the most recent similar jobs in a row (``past``,
    newest first) had it too: "the same finding as your last 5 jobs". Codes no recent job
    had are left out."""
    out: dict[str, int] = {}
    for code in dict.fromkeys(codes):
        run = 0
        for p in past:
            if code not in p.finding_codes:
                break
            run += 1
        if run:
            out[code] = run
    return out
