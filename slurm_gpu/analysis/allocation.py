"""What the site allocated to a job, as opposed to what the job asked for.

Some sites and partitions give every job whole nodes (``OverSubscribe=EXCLUSIVE``, or a job's
own ``--exclusive``): the job holds every core and all the memory of its nodes whatever it
requested. On such an allocation, "you asked for too many cores" cannot be acted on: asking for
fewer changes nothing. The rules and recommendations use this module to say so only where the
user can act, and to give advice about using the node instead.
"""

from __future__ import annotations

from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord


def _exceeds(alloc: int | None, req: int | None, factor: float) -> bool:
    """``alloc`` is more than ``factor`` times ``req`` (both known and positive)."""
    return bool(alloc and req and req > 0 and alloc > factor * req)


def whole_node_allocation(job: JobRecord, s: AnalysisSettings) -> bool:
    """Whether the job was given whole nodes rather than what it requested.

    True when its partition is listed in ``exclusive_partitions``, or when accounting shows
    more allocated than requested CPUs or memory by more than ``whole_node_alloc_factor``
    (more than hyper-thread rounding, which at most doubles a CPU count). A job that asked for
    exactly a whole node is not detected: its request was what it got.
    """
    if job.partition and job.partition in s.exclusive_partitions:
        return True
    factor = s.whole_node_alloc_factor
    alloc_cpus = job.alloc_cpus if job.alloc_cpus is not None else job.alloc_tres.cpus
    if _exceeds(alloc_cpus, job.req_tres.cpus, factor):
        return True
    return _exceeds(job.alloc_tres.mem_bytes, job.req_tres.mem_bytes, factor)
