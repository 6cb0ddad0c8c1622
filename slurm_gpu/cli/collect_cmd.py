"""``slurm-gpu collect``: ingest sealed records into the store (from a timer, or as the one
drainer of the queue that EpilogSlurmctld fills)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings
from slurm_gpu.errors import AccountingError, ConfigError, SlurmGpuError, UsageError
from slurm_gpu.records import JobRecord, NodeRecord

log = logging.getLogger("slurm_gpu.collector")


@dataclass(frozen=True, slots=True)
class _StorableFinding:
    """An analysis finding with the recommendation it motivated (``Recommendation.to_dict()``),
    in the shape the store keeps (``FindingLike`` plus ``recommendation``)."""

    finding: Any
    recommendation: dict[str, object] | None

    @property
    def code(self) -> Any:
        return self.finding.code

    @property
    def severity(self) -> Any:
        return self.finding.severity

    @property
    def cause(self) -> int | None:
        cause: int | None = self.finding.cause
        return cause

    @property
    def evidence(self) -> Any:
        return self.finding.evidence

    @property
    def scope(self) -> Any:
        return self.finding.scope

    @property
    def subject(self) -> str | None:
        subject: str | None = self.finding.subject
        return subject


def storable_findings(analysis: Any) -> list[_StorableFinding]:
    """Each recommendation goes with the finding that motivated it; one motivated by no
    finding of this job goes with the first finding that has none (a job without findings
    keeps no recommendation: there is nothing to fix)."""
    recs: list[dict[str, object] | None] = [None] * len(analysis.findings)
    for rec in analysis.recommendations:
        slot = next(
            (
                i
                for i, f in enumerate(analysis.findings)
                if recs[i] is None and rec.finding is not None and f.code == rec.finding
            ),
            None,
        )
        if slot is None:
            slot = next((i for i, r in enumerate(recs) if r is None), None)
        if slot is not None:
            recs[slot] = rec.to_dict()
    return [_StorableFinding(f, r) for f, r in zip(analysis.findings, recs, strict=True)]


class _HistoryPrefetch:
    """The accounting source, plus: for each batch the collector asks about, the similar past
    jobs (same user and job name) of the batch's jobs, read from the store in one query and
    summarised for the analysis (``PastJob``). A store that cannot be read for history only
    costs the recommendations their history."""

    def __init__(self, inner: Any, store: Any, settings: Settings) -> None:
        self.inner = inner
        self.store = store
        self.settings = settings
        self.history: dict[tuple[str, str], list[Any]] = {}

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        jobs: dict[str, JobRecord] = self.inner.get_jobs(job_ids)
        self.history = self._load({(j.user, j.job_name) for j in jobs.values()})
        return jobs

    def jobs_between(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.jobs_between(*args, **kwargs)

    def _load(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str], list[Any]]:
        from slurm_gpu.analysis import PastJob
        from slurm_gpu.analysis.metrics import job_metrics

        out: dict[tuple[str, str], list[Any]] = {}
        try:
            past = self.store.similar_jobs(keys)
        except SlurmGpuError as exc:
            log.warning("history of %d job name(s) not read (%s)", len(keys), exc)
            return out
        for stored in past:
            job = stored.job
            metrics = job_metrics(job, stored.nodes, self.settings.analysis)
            # Its stored faults (warning, critical): the repeated-fault memory.
            codes = [f.code for f in stored.findings if f.severity != "info"]
            out.setdefault((job.user, job.job_name), []).append(
                PastJob.from_metrics(job, metrics, codes)
            )
        return out


def with_slurm_partitions(settings: Settings, runner: Any = None) -> Settings:
    """``settings`` with the partitions Slurm configures ``OverSubscribe=EXCLUSIVE`` added to
    ``[analysis] exclusive_partitions`` (when ``exclusive_partitions_from_slurm``); read once
    per pass. When scontrol fails, the configured list alone, with a warning."""
    cfg = settings.analysis
    if not cfg.exclusive_partitions_from_slurm:
        return settings
    from slurm_gpu.accounting.partitions import exclusive_partitions, scontrol_path_for

    try:
        found = exclusive_partitions(
            scontrol_path_for(settings.accounting.sacct_path),
            runner=runner,
            timeout_s=settings.accounting.timeout_s,
        )
    except SlurmGpuError as exc:
        log.warning("exclusive partitions not read from Slurm (%s); using the configured ones", exc)
        return settings
    extra = tuple(sorted(found - set(cfg.exclusive_partitions)))
    if not extra:
        return settings
    analysis = dataclasses.replace(cfg, exclusive_partitions=(*cfg.exclusive_partitions, *extra))
    return dataclasses.replace(settings, analysis=analysis)


def _analyse_hook(
    settings: Settings, history: _HistoryPrefetch | None = None
) -> tuple[Any, str | None]:
    """The analysis as the collector's hook, or (None, None) where it is not installed."""
    try:
        from slurm_gpu.analysis.engine import ANALYSIS_VERSION, analyze
    except ImportError:
        return None, None
    cfg = settings.analysis

    def analyse(job: JobRecord, nodes: Sequence[NodeRecord]) -> Any:
        past = history.history.get((job.user, job.job_name), ()) if history else ()
        return storable_findings(analyze(job, nodes, cfg, history=past))

    return analyse, ANALYSIS_VERSION


def admin_comment_publisher(settings: Settings, runner: Any = None) -> Any:
    """The AdminComment step when ``collector.admin_comment`` is on, else ``None``.

    The collector runs after accounting settled, so slurmdbd accepts at once: a short retry
    window bounds the sacctmgr calls per job (one, in the normal case, plus a read-back)."""
    if not settings.collector.admin_comment:
        return None
    from slurm_gpu.accounting.admincomment import AdminCommentWriter, sacctmgr_path_for
    from slurm_gpu.collector.admincomment import AdminCommentPublisher

    acct = settings.accounting
    writer = AdminCommentWriter(
        sacctmgr_path=sacctmgr_path_for(settings.collector.sacctmgr_path, acct.sacct_path),
        sacct_path=acct.sacct_path,
        timeout_s=acct.timeout_s,
        retry_for_s=3.0,
        runner=runner,
    )
    return AdminCommentPublisher(writer)


def report_prerenderer(settings: Settings, store: Any) -> Any:
    """The step that renders stored jobs' ``gpueff`` reports (``[gpueff] cache_reports`` on a
    SQLite store), else ``None``."""
    if not settings.gpueff.cache_reports:
        return None
    from slurm_gpu.jobreport.prerender import ReportPrerenderer

    prerenderer = ReportPrerenderer(settings, store)
    return prerenderer if prerenderer.enabled else None


def _one_pass(
    settings: Settings,
    job_id: str | None,
    missing: bool,
    admin_comment: Any = None,
    only: frozenset[str] | None = None,
) -> Any:
    """Lock, open, collect (only ``job_id``, or the jobs in ``only``, when given); ``None``
    when another collector holds the lock."""
    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.collector import Collector, CollectorLock, CollectorOptions
    from slurm_gpu.store import open_store

    lock = CollectorLock(settings.paths.state_dir)
    if not lock.acquire():
        return None
    try:
        settings = with_slurm_partitions(settings)
        c = settings.collector
        options = CollectorOptions(
            batch_size=settings.accounting.batch_size,
            node_wait_s=c.node_wait_s,
            settle_timeout_s=c.settle_timeout_s,
            missing_lookback_s=c.missing_lookback_s,
            missing_grace_s=c.missing_grace_s,
            done_retention_s=c.done_retention_s,
        )
        check_transport(settings)
        source_map = _source_map(settings)
        with open_store(settings) as store:
            inbox = None
            if settings.ship.transport == "postgresql":
                from slurm_gpu.store.inbox import PgInbox

                inbox = PgInbox(store.engine)
            source = open_accounting(settings, batch_scripts=settings.accounting.batch_scripts)
            accounting = _HistoryPrefetch(source, store, settings)
            analyse, version = _analyse_hook(settings, accounting)
            options = dataclasses.replace(options, analysis_version=version)
            reports = report_prerenderer(settings, store)
            pushed = Collector(
                store=store,
                accounting=accounting,
                spool_dir=settings.paths.inbox_dir or settings.paths.spool_dir,
                state_dir=settings.paths.state_dir,
                options=options,
                analyse=analyse,
                admin_comment=admin_comment,
                reports=reports,
                uses_hooks=source_map.uses_hooks,
                inbox=inbox,
            ).run_once(job_id, missing_pass=missing, only=only)
            if job_id is not None or only is not None or not source_map.pulled:
                return pushed
            return _pull_pass(
                settings, source_map, store, accounting, analyse, version, admin_comment, reports
            )(pushed)
    finally:
        lock.release()


def _source_map(settings: Settings) -> Any:
    """``[source]`` as the collector's ``SourceMap``, its names checked (``ConfigError``)."""
    from slurm_gpu.collector.pull import SourceMap
    from slurm_gpu.sources.registry import NAMES

    src = settings.source
    return SourceMap(src.default, dict(src.partitions)).check(NAMES)


def _pull_pass(
    settings: Settings,
    source_map: Any,
    store: Any,
    accounting: Any,
    analyse: Any,
    version: str | None,
    admin_comment: Any,
    reports: Any,
) -> Any:
    """The pull pass over the partitions whose source is not the hooks (``collector.pull``),
    as a function of the push pass's report that returns both passes' report."""
    from slurm_gpu.collector.pull import PullCollector, PullOptions, merged
    from slurm_gpu.sources.registry import make

    def run(pushed: Any) -> Any:
        pulled = PullCollector(
            store=store,
            accounting=accounting,
            state_dir=settings.paths.state_dir,
            source_map=source_map,
            make_source=lambda name: make(settings, name),
            options=PullOptions(
                batch_size=settings.accounting.batch_size,
                lookback_s=settings.source.pull_lookback_s,
                relook_s=settings.source.pull_relook_s,
                settle_timeout_s=settings.collector.settle_timeout_s,
                analysis_version=version,
            ),
            analyse=analyse,
            admin_comment=admin_comment,
            reports=reports,
        ).run_once()
        return merged(pushed, pulled)

    return run


def check_transport(settings: Settings) -> None:
    """The PostgreSQL inbox lives in the store's own server: refuse it for a SQLite store
    (``ConfigError``)."""
    if settings.ship.transport != "postgresql":
        return
    if not settings.store_url.startswith("postgresql"):
        scheme = settings.store_url.split(":", 1)[0].split("+", 1)[0]
        kind = "SQLite" if scheme == "sqlite" else (scheme or "not PostgreSQL")
        raise ConfigError(
            f"ship.transport = postgresql needs a PostgreSQL store, and the store is {kind}",
            key="ship.transport",
            path=settings.path,
            hint="set [store] url to the PostgreSQL server the nodes push to, or set [ship] "
            'transport = "directory" (a shared inbox_dir)',
        )


def _summary(report: Any) -> str:
    parts = [f"{len(report.ingested)} stored"]
    for name, label in (
        ("missing_telemetry", "without telemetry"),
        ("partial", "with missing nodes"),
        ("waiting_nodes", "waiting for nodes"),
        ("unsettled", "waiting for accounting"),
        ("no_accounting", "unknown to accounting"),
        ("accounting_mismatch", "disagreeing with accounting"),
        ("quarantined", "files quarantined"),
        ("analysis_failed", "analysis failed"),
        ("admin_comment_written", "AdminComment written"),
        ("admin_comment_failed", "AdminComment not written"),
        ("source_errors", "left for the next pass (source not read)"),
    ):
        if getattr(report, name):
            parts.append(f"{len(getattr(report, name))} {label}")
    return ", ".join(parts)


@click.command("collect")
@click.option(
    "--job", "job_id", metavar="JOBID", help="Only this job (its raw id, as Slurm gives it)."
)
@click.option("--once", is_flag=True, help="One pass, then exit (timers, cron).")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="With --job: keep looking this many seconds until the job is stored.",
)
@click.option(
    "--queue",
    "from_queue",
    is_flag=True,
    help="Drain paths.queue_dir (filled by EpilogSlurmctld): store the queued jobs as one "
    "batch, waiting up to collector.queue_wait_s for each, then exit.",
)
@click.option("--no-missing", is_flag=True, help="Skip the pass for GPU jobs without telemetry.")
@click.option("--json", "as_json", is_flag=True, help="Print what each pass did as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Log every job (to stderr).")
@click.pass_context
def cli(
    ctx: click.Context,
    job_id: str | None,
    once: bool,
    wait_s: float,
    from_queue: bool,
    no_missing: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    """Ingest sealed telemetry records with Slurm accounting into the store.

    A second collector started while one runs exits at once with status 0. Without --once
    (and without --job or --queue) it runs a pass every collector.interval_s seconds until
    stopped; such full passes also empty the EpilogSlurmctld queue, whose jobs they cover.
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="slurm-gpu collect: %(message)s",
        stream=sys.stderr,
    )
    if job_id is not None and not job_id.isdigit():
        raise UsageError(
            f"--job {job_id!r} is not a raw job id",
            hint="pass SLURM_JOB_ID (digits only; array tasks have their own raw id)",
        )
    if from_queue and job_id is not None:
        raise UsageError(
            "--queue and --job exclude each other",
            hint="EpilogSlurmctld runs 'collect --queue'; --job stores one job by hand",
        )
    settings = settings_from(ctx, trusted=True)
    # One publisher for the whole run: once it stops (lower-cased comments), it stays stopped.
    publisher = admin_comment_publisher(settings)
    if from_queue:
        _drain(settings, publisher)
        return
    deadline = time.monotonic() + wait_s
    while True:
        report = _one_pass(settings, job_id, missing=not no_missing, admin_comment=publisher)
        if report is None:
            if job_id is not None and time.monotonic() < deadline:
                time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
                continue
            click.echo("another collector is running; exiting (it or the next run does the work)")
            return
        if as_json:
            click.echo(json.dumps(_as_dict(report)))
        else:
            click.echo(_summary(report))
        for line in (*report.errors, *report.source_errors):
            click.echo(f"slurm-gpu collect: {line}", err=True)
        if job_id is not None:
            if job_id in report.ingested or time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
            continue
        if job_id is None:
            _discard_queued(settings)
        if once:
            break
        time.sleep(settings.collector.interval_s)
    if report.errors and not report.ingested:
        raise AccountingError(
            "accounting could not be asked; the records stay in the spool",
            hint="check that sacct works for this user (slurmdbd up), then run again",
        )


def _drain(settings: Settings, publisher: Any) -> None:
    """``collect --queue``: the single drainer of the EpilogSlurmctld queue."""
    from slurm_gpu.collector.jobqueue import JobQueue, drain

    if not settings.paths.queue_dir:
        raise ConfigError(
            "no job queue to drain",
            key="paths.queue_dir",
            hint="set paths.queue_dir to the QUEUE directory of epilog-slurmctld.sh",
        )

    def collect(ids: frozenset[str]) -> Sequence[str] | None:
        report = _one_pass(settings, None, missing=False, admin_comment=publisher, only=ids)
        if report is None:
            return None
        for line in report.errors:
            click.echo(f"slurm-gpu collect: {line}", err=True)
        ingested: tuple[str, ...] = report.ingested
        return ingested

    result = drain(
        JobQueue(settings.paths.queue_dir), collect, wait_s=settings.collector.queue_wait_s
    )
    click.echo(
        f"queue drained: {len(result.stored)} stored, {len(result.dropped)} left to the timer "
        f"({result.passes} passes)"
    )


def _discard_queued(settings: Settings) -> None:
    """A full pass covers every queued job (stored now, or by the next pass): empty the queue,
    so that it cannot grow where no drainer runs (no sudoers line)."""
    from slurm_gpu.collector.jobqueue import JobQueue

    try:
        JobQueue(settings.paths.queue_dir).take()
    except ConfigError as exc:
        log.error("%s", exc)


def _as_dict(report: Any) -> dict[str, list[str]]:
    return {f.name: list(getattr(report, f.name)) for f in dataclasses.fields(report)}
