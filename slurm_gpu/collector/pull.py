"""The pull pass: jobs of partitions whose telemetry is not the hooks', read from the site's
existing monitoring (``slurm_gpu.sources``) after they ended.

One pass (``PullCollector.run_once``):

1. asks accounting for the jobs that ended since the watermark (``<state_dir>/pull-pass.json``,
   root's; the first pass looks ``lookback_s`` back, later ones ``relook_s`` before the
   watermark again, since accounting learns of some ends late), and keeps the GPU jobs of
   partitions whose source (``SourceMap``) is pulled; jobs already stored are skipped;
2. leaves for a later pass a job whose accounting is not settled yet (the watermark stays
   at or before its end), until ``settle_timeout_s`` after its end, then stores it as it is;
3. asks the job's source for its node records; a source that cannot be read
   (``TelemetryUnavailableError``) or fails leaves the job for the next pass, not stored;
4. stores each job like a pushed one (``collector.analysed_bundle``, ``publish_stored``):
   nodes the source had nothing for are listed in ``missing_hosts`` and the job is stored
   partial (telemetry ``recovered``), or ``missing`` when no node had data, so nothing
   automatic (mail advice, the live policy) acts on the gap;
5. moves the watermark to the end of the window, or to the earliest end of a job left for
   later, whichever is first.

The caller holds ``CollectorLock`` (the push pass and this one run under the same lock).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_gpu.accounting.base import is_settled
from slurm_gpu.collector import crosscheck, safefs
from slurm_gpu.collector.ports import Accounting, Analyse, CommentPublisher, ReportPublisher
from slurm_gpu.collector.statedir import open_state_dir
from slurm_gpu.collector.steps import analysed_bundle, publish_stored
from slurm_gpu.collector.tally import CollectReport, PassTally
from slurm_gpu.config import SOURCE_HOOKS, SOURCE_NONE
from slurm_gpu.errors import AccountingError, ConfigError, TelemetryUnavailableError
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.sources.base import SourceResult, TelemetrySource
from slurm_gpu.store import JobBundle, Store

log = logging.getLogger("slurm_gpu.collector.pull")

#: The pull pass's watermark in the state directory.
PULL_STATE = "pull-pass.json"


@dataclass(frozen=True, slots=True)
class SourceMap:
    """Which source each partition's jobs take their telemetry from (``[source]``)."""

    default: str = SOURCE_HOOKS
    partitions: Mapping[str, str] = field(default_factory=dict)

    def source_for(self, partition: str | None) -> str:
        """The source of a job in ``partition``. A job accounting lists in several partitions
        (``a100,v100``: it never ran) takes the first one's."""
        first = (partition or "").split(",", 1)[0].strip()
        return self.partitions.get(first, self.default)

    def uses_hooks(self, job: JobRecord) -> bool:
        """Whether ``job``'s telemetry comes from the node hooks (the push path)."""
        return self.source_for(job.partition) == SOURCE_HOOKS

    @property
    def pulled(self) -> frozenset[str]:
        """The source names that the pull pass reads (neither the hooks nor none)."""
        names = {self.default, *self.partitions.values()}
        return frozenset(names - {SOURCE_HOOKS, SOURCE_NONE})

    def check(self, known: Sequence[str]) -> SourceMap:
        """``self``, or ``ConfigError`` naming the first key whose source is not in ``known``."""
        keys = [("source.default", self.default)]
        keys += [(f"source.partitions.{p}", n) for p, n in self.partitions.items()]
        for key, name in keys:
            if not isinstance(name, str) or name not in known:
                raise ConfigError(
                    f"unknown telemetry source {name!r}",
                    key=key,
                    hint="one of " + ", ".join(known),
                )
        return self


@dataclass(frozen=True, slots=True)
class PullOptions:
    """Timing and batching of the pull pass (``[source]`` and ``[collector]`` settings)."""

    batch_size: int = 500
    """Jobs per store transaction."""
    lookback_s: float = 86400.0
    """How far back the first pass looks (no watermark yet)."""
    relook_s: float = 3600.0
    """How far before the watermark each pass looks again."""
    settle_timeout_s: float = 3600.0
    """How long after a job's end to wait for settled accounting before storing it as is."""
    analysis_version: str | None = None


SourceFactory = Callable[[str], TelemetrySource]


class PullCollector:
    """Stores the ended jobs of pulled partitions. The caller holds ``CollectorLock``."""

    def __init__(
        self,
        *,
        store: Store,
        accounting: Accounting,
        state_dir: str,
        source_map: SourceMap,
        make_source: SourceFactory,
        options: PullOptions | None = None,
        analyse: Analyse | None = None,
        clock: Callable[[], float] = time.time,
        admin_comment: CommentPublisher | None = None,
        reports: ReportPublisher | None = None,
    ) -> None:
        self.store = store
        self.accounting = accounting
        self.state_dir = state_dir
        self.source_map = source_map
        self.make_source = make_source
        self.options = options or PullOptions()
        self.analyse = analyse
        self.clock = clock
        self.admin_comment = admin_comment
        self.reports = reports
        self._sources: dict[str, TelemetrySource] = {}

    def run_once(self) -> CollectReport:
        """One pull pass. Raises ``ConfigError`` when the state directory is not root's alone
        or a configured source cannot be made, ``StoreError`` when the store cannot be
        written (the watermark then stays). Accounting failures are reported in
        ``CollectReport.errors``, source failures in ``source_errors``; their jobs are retried
        by the next pass."""
        acc = PassTally()
        if not self.source_map.pulled:
            return acc.report()
        state = open_state_dir(self.state_dir)
        try:
            now = self.clock()
            start = now - self.options.lookback_s
            mark = _read_mark(state)
            if mark is not None:
                start = max(start, mark - self.options.relook_s)
            if now <= start:
                return acc.report()
            hold = self._pass(start, now, acc)
            if hold is not None:
                safefs.write_replace(
                    PULL_STATE,
                    json.dumps({"checked_until_s": min(now, hold)}).encode(),
                    dir_fd=state,
                )
            return acc.report()
        finally:
            if self.reports is not None:
                self.reports.flush()  # the pass ends when its reports are stored and written
            os.close(state)

    # ----------------------------------------------------------------- the pass

    def _pass(self, start: float, end: float, acc: PassTally) -> float | None:
        """Store what can be stored of the jobs that ended in ``[start, end)``; returns the
        new watermark (``None``: accounting could not be asked, keep the old one)."""
        try:
            jobs = self.accounting.jobs_between(start, end)
        except AccountingError as exc:
            msg = f"accounting query for jobs ended in pulled partitions failed: {exc}"
            log.error(msg)
            acc.errors.append(msg)
            return None
        hold = end
        wanted = [
            j
            for j in jobs
            if j.alloc_tres.gpus
            and j.end_s is not None
            and start <= j.end_s < end
            and self.source_map.source_for(j.partition) in self.source_map.pulled
        ]
        stored = self.store.existing_job_ids([j.job_id for j in wanted]) if wanted else set()
        bundles: list[JobBundle] = []
        for job in wanted:
            assert job.end_s is not None
            if job.job_id in stored:
                continue
            if not is_settled(job) and end - job.end_s < self.options.settle_timeout_s:
                acc.unsettled.append(job.job_id)
                hold = min(hold, job.end_s)
                log.info("job %s: accounting not settled (%s); will retry", job.job_id, job.state)
                continue
            bundle = self._bundle(job, acc)
            if bundle is None:
                hold = min(hold, job.end_s)
                continue
            bundles.append(bundle)
        size = max(1, self.options.batch_size)
        for i in range(0, len(bundles), size):
            chunk = bundles[i : i + size]
            self.store.write_batch(chunk, collected_at_s=end)
            for b in chunk:
                acc.ingested.append(b.job.job_id)
                if not b.nodes:
                    acc.missing.append(b.job.job_id)
                elif b.missing_hosts:
                    acc.partial.append(b.job.job_id)
                log.info(
                    "job %s stored from %s: %s telemetry, %d node record(s)",
                    b.job.job_id,
                    self.source_map.source_for(b.job.partition),
                    b.telemetry,
                    len(b.nodes),
                )
            publish_stored(chunk, self.admin_comment, self.reports, acc)
        return hold

    def _bundle(self, job: JobRecord, acc: PassTally) -> JobBundle | None:
        """The job's bundle from its source; ``None`` (retry later) when the source fails."""
        name = self.source_map.source_for(job.partition)
        source = self._source(name)
        try:
            result = source.records_for(job)
        except TelemetryUnavailableError as exc:
            msg = f"job {job.job_id}: {name} unavailable ({exc}); retried at the next pass"
            log.error(msg)
            acc.source_errors.append(msg)
            return None
        except Exception as exc:  # a source bug must not end the pass for the other jobs
            msg = f"job {job.job_id}: reading {name} failed ({exc}); retried at the next pass"
            log.exception(msg)
            acc.source_errors.append(msg)
            return None
        nodes = _own_nodes(job, result, name)
        missing = _missing_hosts(job, nodes)
        if missing and nodes:
            log.warning(
                "job %s: %s has no data for %s; storing the other nodes",
                job.job_id,
                name,
                ",".join(missing),
            )
        return analysed_bundle(
            job, nodes, missing, self.analyse, self.options.analysis_version, acc
        )

    def _source(self, name: str) -> TelemetrySource:
        if name not in self._sources:
            self._sources[name] = self.make_source(name)
        return self._sources[name]


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def _own_nodes(job: JobRecord, result: SourceResult, name: str) -> list[NodeRecord]:
    """The source's records that belong to ``job``: its id and one of its nodes, one per
    node (the first wins); any other is logged and left out, never stored under this job."""
    allowed = {_short(h) for h in job.nodelist}
    out: list[NodeRecord] = []
    seen: set[str] = set()
    for n in result.nodes:
        host = _short(n.hostname)
        if n.job_id != job.job_id or (allowed and host not in allowed) or host in seen:
            log.warning(
                "job %s: %s returned a record of job %s on %s; left out",
                job.job_id,
                name,
                n.job_id,
                n.hostname,
            )
            continue
        seen.add(host)
        out.append(n)
    reason = crosscheck.disagreement(job, out) if out else None
    if reason is not None:
        log.warning("job %s: %s disagrees with accounting (%s); left out", job.job_id, name, reason)
        return []
    return out


def _missing_hosts(job: JobRecord, nodes: Sequence[NodeRecord]) -> tuple[str, ...]:
    """The job's nodes without a record (those the source named missing, and any other of
    the node list it returned nothing for), in accounting's order."""
    have = {_short(n.hostname) for n in nodes}
    return tuple(h for h in job.nodelist if _short(h) not in have)


def _read_mark(state_fd: int) -> float | None:
    try:
        raw = safefs.read_bounded(PULL_STATE, dir_fd=state_fd, max_bytes=4096)
        return float(json.loads(raw)["checked_until_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def merged(*reports: CollectReport) -> CollectReport:
    """One report of several passes (the push pass and the pull pass of one run)."""
    names = [f.name for f in dataclasses.fields(CollectReport)]
    return CollectReport(**{n: tuple(x for r in reports for x in getattr(r, n)) for n in names})


__all__ = [
    "PULL_STATE",
    "PullCollector",
    "PullOptions",
    "SourceFactory",
    "SourceMap",
    "merged",
]
