"""The interface every non-hook telemetry source implements.

The collector's pull pass (jobs that ended, found in accounting, in a partition whose
configured source is not the hooks) asks the job's source for its node records. A source
reads only what the job's own window and nodes need, and reports the nodes it found nothing
for as missing: the analysis then sees the job as partial, and nothing automatic (mail advice,
the live policy) acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.sourcecaps import SourceCapabilities


@dataclass(frozen=True, slots=True)
class SourceResult:
    """What one source found for one job."""

    nodes: tuple[NodeRecord, ...]
    """One record per node that had data, built through the streaming aggregates."""
    missing_hosts: tuple[str, ...] = ()
    """Nodes of the job's allocation for which the source had no data (short names)."""
    notes: tuple[str, ...] = field(default=())
    """Short notes for the log and the evidence (``no process list from dcgm-exporter``)."""


class TelemetrySource(Protocol):
    """A reader of one kind of existing monitoring."""

    @property
    def capabilities(self) -> SourceCapabilities:
        """What this source can tell; its ``name`` is written in ``NodeRecord.source``."""
        ...

    def records_for(self, job: JobRecord) -> SourceResult:
        """The node records of the finished ``job`` (its hosts, GPUs and time window from
        accounting). Raises ``slurm_gpu.errors.TelemetryUnavailableError`` (for Prometheus its
        subclass ``PrometheusUnavailableError``) when the source cannot be read
        at all (unreachable, refused): the job is then retried at the next pass, not stored."""
        ...
