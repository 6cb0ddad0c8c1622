"""The job's stack samples, over its nodes (``NodeRecord.stacks``, ``docs/stacks.md``): class
shares of the main processes' time, what they did while the GPUs were idle, per rank. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.records import NodeRecord

#: Deciding frames kept per class for the report.
DECIDING_SHOWN = 3


@dataclass(frozen=True, slots=True)
class RankShares:
    """One main process (a rank) on one node."""

    hostname: str
    pid: int
    samples: int
    shares_pct: tuple[tuple[str, float], ...]
    """(class, percent of this process's samples), every class."""

    def share(self, cls: str) -> float:
        return dict(self.shares_pct).get(cls, 0.0)


@dataclass(frozen=True, slots=True)
class StackMetrics:
    """Class shares of the job's main-thread stack samples, percent of the samples."""

    samples: int
    shares_pct: tuple[tuple[str, float], ...]
    """(class, percent), in the class table's order (``other`` last)."""
    idle_samples: int
    """Samples taken while every GPU of the node read idle."""
    idle_shares_pct: tuple[tuple[str, float], ...]
    deciding: tuple[tuple[str, tuple[str, ...]], ...]
    """(class, its most frequent deciding frames), classes with samples only."""
    bursts: int
    bursts_failed: int
    interval_s: float
    span_pct: float | None
    """Share of the job between the first and the last burst on the node that covered the
    most of it, percent (coverage)."""
    nodes: int
    ranks: tuple[RankShares, ...]
    worker_samples: int
    reader_cpu_s: float
    notes: tuple[str, ...] = ()
    """Why samples are missing, as the nodes said (``no_cgroup``, ``timeout``, ...), each once."""

    def share(self, cls: str) -> float:
        """Percent of the samples in ``cls`` (0 for a class no node has)."""
        return dict(self.shares_pct).get(cls, 0.0)

    def idle_share(self, cls: str) -> float:
        return dict(self.idle_shares_pct).get(cls, 0.0)


#: A note as the sampler writes it (a record from elsewhere may carry anything): short words.
_KEY = re.compile(r"[a-z][a-z_]{0,39}").fullmatch


def _pct(counts: dict[str, int], order: Sequence[str]) -> tuple[tuple[str, float], ...]:
    total = sum(counts.values())
    return tuple((c, 100.0 * counts.get(c, 0) / total if total else 0.0) for c in order)


def stack_metrics(nodes: Sequence[NodeRecord], elapsed_s: float) -> StackMetrics | None:
    """The job's stack metrics, or ``None`` when no node record has stack samples."""
    sampled = [n for n in nodes if n.stacks is not None]
    if not sampled:
        return None
    order: list[str] = []
    counts: dict[str, int] = {}
    idle: dict[str, int] = {}
    deciding: dict[str, list[str]] = {}
    ranks = []
    span = 0.0
    for n in sampled:
        st = n.stacks
        assert st is not None
        for i, cls in enumerate(st.classes):
            if cls not in counts:
                order.append(cls)
                counts[cls] = idle[cls] = 0
            counts[cls] += st.counts[i] if i < len(st.counts) else 0
            idle[cls] += st.idle_counts[i] if i < len(st.idle_counts) else 0
            names = st.deciding[i] if i < len(st.deciding) else ()
            kept = deciding.setdefault(cls, [])
            kept += [d for d in names if d not in kept]
        for p in st.processes:
            per = dict(zip(st.classes, p.counts, strict=False))
            ranks.append(RankShares(n.hostname, p.pid, p.samples, _pct(per, st.classes)))
        if st.first_s is not None and st.last_s is not None:
            span = max(span, st.last_s - st.first_s)
    if "other" in order:  # the fallback stays last, whatever order the nodes named classes
        order.remove("other")
        order.append("other")
    return StackMetrics(
        samples=sum(counts.values()),
        shares_pct=_pct(counts, order),
        idle_samples=sum(idle.values()),
        idle_shares_pct=_pct(idle, order),
        deciding=tuple(
            (c, tuple(deciding[c][:DECIDING_SHOWN])) for c in order if counts[c] and deciding[c]
        ),
        bursts=sum(n.stacks.bursts for n in sampled if n.stacks),
        bursts_failed=sum(n.stacks.bursts_failed for n in sampled if n.stacks),
        interval_s=max(n.stacks.interval_s for n in sampled if n.stacks),
        span_pct=min(100.0, 100.0 * span / elapsed_s) if elapsed_s > 0 else None,
        nodes=len(sampled),
        ranks=tuple(ranks),
        worker_samples=sum(n.stacks.worker_samples for n in sampled if n.stacks),
        reader_cpu_s=sum(n.stacks.reader_cpu_s for n in sampled if n.stacks),
        notes=tuple(
            sorted({note for n in sampled if n.stacks for note in n.stacks.notes if _KEY(note)})
        ),
    )
