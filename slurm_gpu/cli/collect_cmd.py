"""``slurm-gpu collect``: ingest sealed records into the store (from a timer or EpilogSlurmctld)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings
from slurm_gpu.errors import AccountingError, UsageError
from slurm_gpu.records import JobRecord, NodeRecord


def _analyse_hook(settings: Settings) -> tuple[Any, str | None]:
    """The analysis as the collector's hook, or (None, None) where it is not installed."""
    try:
        from slurm_gpu.analysis.engine import ANALYSIS_VERSION, analyze
    except ImportError:
        return None, None
    cfg = settings.analysis

    def analyse(job: JobRecord, nodes: Sequence[NodeRecord]) -> Any:
        return analyze(job, nodes, cfg).findings

    return analyse, ANALYSIS_VERSION


def _one_pass(settings: Settings, job_id: str | None, missing: bool) -> Any:
    """Lock, open, collect; ``None`` when another collector holds the lock."""
    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.collector import Collector, CollectorLock, CollectorOptions
    from slurm_gpu.store import open_store

    lock = CollectorLock(settings.paths.state_dir)
    if not lock.acquire():
        return None
    try:
        analyse, version = _analyse_hook(settings)
        c = settings.collector
        options = CollectorOptions(
            batch_size=settings.accounting.batch_size,
            node_wait_s=c.node_wait_s,
            settle_timeout_s=c.settle_timeout_s,
            missing_lookback_s=c.missing_lookback_s,
            missing_grace_s=c.missing_grace_s,
            done_retention_s=c.done_retention_s,
            analysis_version=version,
        )
        with open_store(settings) as store:
            return Collector(
                store=store,
                accounting=open_accounting(settings),
                spool_dir=settings.paths.spool_dir,
                state_dir=settings.paths.state_dir,
                options=options,
                analyse=analyse,
            ).run_once(job_id, missing_pass=missing)
    finally:
        lock.release()


def _summary(report: Any) -> str:
    parts = [f"{len(report.ingested)} stored"]
    for name, label in (
        ("missing_telemetry", "without telemetry"),
        ("partial", "with missing nodes"),
        ("waiting_nodes", "waiting for nodes"),
        ("unsettled", "waiting for accounting"),
        ("no_accounting", "unknown to accounting"),
        ("quarantined", "files quarantined"),
        ("analysis_failed", "analysis failed"),
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
@click.option("--no-missing", is_flag=True, help="Skip the pass for GPU jobs without telemetry.")
@click.option("--json", "as_json", is_flag=True, help="Print what each pass did as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Log every job (to stderr).")
@click.pass_context
def cli(
    ctx: click.Context,
    job_id: str | None,
    once: bool,
    wait_s: float,
    no_missing: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    """Ingest sealed telemetry records with Slurm accounting into the store.

    A second collector started while one runs exits at once with status 0. Without --once
    (and without --job) it runs a pass every collector.interval_s seconds until stopped.
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
    settings = settings_from(ctx)
    deadline = time.monotonic() + wait_s
    while True:
        report = _one_pass(settings, job_id, missing=not no_missing)
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
        if report.errors:
            for line in report.errors:
                click.echo(f"slurm-gpu collect: {line}", err=True)
        if job_id is not None:
            if job_id in report.ingested or time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
            continue
        if once:
            break
        time.sleep(settings.collector.interval_s)
    if report.errors and not report.ingested:
        raise AccountingError(
            "accounting could not be asked; the records stay in the spool",
            hint="check that sacct works for this user (slurmdbd up), then run again",
        )


def _as_dict(report: Any) -> dict[str, list[str]]:
    return {f.name: list(getattr(report, f.name)) for f in dataclasses.fields(report)}
