"""``slurm-gpu demo``: run the demo workloads on the local test cluster and show the capture."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.config import Settings
from slurm_gpu.demo.patterns import PATTERNS, describe
from slurm_gpu.demo.showcase import (
    EndedJob,
    as_user,
    collect_until_stored,
    iso_utc,
    mail_command,
    tool,
)
from slurm_gpu.demo.submit import (
    MAILED,
    Submitted,
    default_scripts_dir,
    demo_order,
    describe_gpu,
    describe_host,
    find_records,
    job_states,
    mail_program,
    submit_all,
    wait_for,
)
from slurm_gpu.errors import UsageError
from slurm_gpu.store.store import mask_url

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.group("demo")
def cli() -> None:
    """Demo jobs that reproduce each cause of low GPU utilization on virtual GPUs."""


@cli.command("list")
def list_patterns() -> None:
    """List the demo patterns."""
    click.echo(describe())


@cli.command("run")
@click.option(
    "--user",
    default="sgtest1",
    show_default=True,
    help="Submit as this user (through runuser when run as root).",
)
@click.option(
    "--patterns",
    default=",".join(PATTERNS),
    show_default=True,
    help="Comma-separated patterns to submit.",
)
@click.option(
    "--scripts",
    "scripts_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Directory of <pattern>.sbatch (default: share/demo).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="demo-output",
    show_default=True,
    help="Where the e-mails, the gpueff outputs and the weekly report go.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the jobs, collect them and show what users and admins get.",
)
@click.option(
    "--records",
    is_flag=True,
    help="Also print the sealed per-node records the hooks wrote.",
)
@click.option(
    "--record",
    "record_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also save each job's accounting and sealed records as a labelled trace here "
    "(e.g. tests/data/traces).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=900.0,
    show_default=True,
    help="Seconds to wait for the jobs.",
)
@click.pass_context
def run(
    ctx: click.Context,
    user: str,
    patterns: str,
    scripts_dir: str | None,
    out_dir: str,
    wait: bool,
    records: bool,
    record_dir: str | None,
    timeout_s: float,
) -> None:
    """Submit the demo jobs, wait for them, collect them, and show per job what its owner sees
    (gpueff), the e-mails after the jobs, and the weekly admin report."""
    settings = settings_from(ctx)
    started_s = time.time()
    t0 = time.monotonic()
    base = Path(scripts_dir) if scripts_dir else default_scripts_dir()
    wanted = demo_order([p.strip() for p in patterns.split(",") if p.strip()])
    unknown = [p for p in wanted if p not in PATTERNS]
    if unknown:
        raise UsageError(
            f"unknown pattern(s): {', '.join(unknown)}", hint=f"one of: {', '.join(PATTERNS)}"
        )
    scripts = [base / f"{p}.sbatch" for p in wanted]
    missing = [str(s) for s in scripts if not s.is_file()]
    if missing:
        raise UsageError(f"no such script: {', '.join(missing)}", hint="pass --scripts DIR")
    as_root = os.geteuid() == 0
    run_as = user if as_root else None
    owner = user if as_root else _me()
    # A bare user name, as Slurm's default --mail-user; [mail] recipient_domain completes it.
    recipient = owner
    mail_args = ["--mail-type=END", f"--mail-user={recipient}"]
    jobs = submit_all(
        scripts,
        user=run_as,
        python=sys.executable,
        config_path=settings.path,
        extra_args={p: mail_args for p in MAILED},
    )
    for job in jobs:
        mailed = "  (--mail-type=END)" if job.pattern in MAILED else ""
        click.echo(f"submitted {job.pattern:<12} job {job.job_id}{mailed}")
    if not wait:
        return
    out = Path(out_dir).resolve()
    (out / "gpueff").mkdir(parents=True, exist_ok=True)
    sink = _start_sink(settings, out / "mail")
    try:
        ids = [j.job_id for j in jobs]
        click.echo(f"waiting for {len(ids)} jobs (4 GPUs, so they run in rounds) ...")
        left = wait_for(ids, timeout_s=timeout_s)
        if left:
            click.echo(f"still running after {timeout_s:g}s: {', '.join(sorted(left))}", err=True)
        ended = [j for j in jobs if j.job_id not in left]
        if records:
            _print_records(settings, ended)
        click.echo(f"jobs ended after {time.monotonic() - t0:.0f} s; collecting ...")
        stored = _collect(settings, [j.job_id for j in ended])
        for job in ended:
            _show_gpueff(settings, job, run_as, out / "gpueff")
        if record_dir:
            _record(settings, [j for j in ended if j.job_id in stored], Path(record_dir))
        mails = _send_mails(settings, [j for j in ended if j.pattern in MAILED], stored, recipient)
        report = out / "weekly-report.html"
        _weekly_report(settings, started_s, report)
        if sink is not None:
            deadline = time.monotonic() + 10
            while len(sink.saved) < mails and time.monotonic() < deadline:
                time.sleep(0.2)
        click.echo("")
        click.echo(f"done in {time.monotonic() - t0:.0f} s. Where everything is:")
        click.echo(f"  what each job's owner sees:  gpueff JOBID  (saved in {out / 'gpueff'})")
        if sink is not None:
            click.echo(f"  e-mails after the jobs:      {len(sink.saved)} .eml in {out / 'mail'}")
        else:
            click.echo(
                f"  e-mails after the jobs:      sent through {settings.mail.smtp_host}:"
                f"{settings.mail.smtp_port} ({settings.mail.transport})"
            )
        click.echo(f"  weekly admin report:         {report}")
        click.echo(f"  the store:                   {mask_url(settings.store_url)}")
        click.echo(f"  sealed records (collected):  {settings.paths.state_dir}/done")
    finally:
        if sink is not None:
            sink.stop()
    if left or set(ids) - set(stored):
        sys.exit(1)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _start_sink(settings: Settings, directory: Path) -> Any:
    """A loopback SMTP sink writing .eml files, when [mail] sends by SMTP to this machine."""
    m = settings.mail
    if m.transport != "smtp" or m.smtp_host not in _LOOPBACK:
        return None
    from slurm_gpu.demo.mailsink import EmlSink

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.eml"):
        old.unlink()
    sink = EmlSink(directory, host="127.0.0.1", port=m.smtp_port)
    sink.start()
    return sink


def _cfg_args(settings: Settings) -> list[str]:
    return ["--config", settings.path] if settings.path else []


def _collect(settings: Settings, ids: list[str]) -> dict[str, Any]:
    """Run ``slurm-gpu collect`` until every job is stored; the stored jobs by id."""
    from slurm_gpu.store import open_store

    argv = [tool("slurm-gpu"), *_cfg_args(settings), "collect", "--once", "--no-missing"]
    with open_store(settings) as store:
        missing = collect_until_stored(
            argv, ids, lambda want: store.existing_job_ids(want), timeout_s=120.0
        )
        got = {i: store.get_job(i) for i in ids if i not in missing}
    if missing:
        click.echo(f"not in the store after 120 s: {', '.join(sorted(missing))}", err=True)
    click.echo(f"{len(got)} of {len(ids)} jobs in the store")
    return got


def _show_gpueff(settings: Settings, job: Submitted, user: str | None, out: Path) -> None:
    env = {"SLURM_GPU_CONFIG": settings.path} if settings.path else {}
    argv = as_user([tool("gpueff"), job.job_id], user, env)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    text = result.stdout + result.stderr
    (out / f"{job.job_id}-{job.pattern}.txt").write_text(text, encoding="utf-8")
    who = f"{user}$ " if user else "$ "
    click.echo("")
    click.echo(f"==== {job.pattern} (cause {PATTERNS[job.pattern].cause}) ====")
    click.echo(f"{who}gpueff {job.job_id}")
    click.echo(text.rstrip())


def _send_mails(
    settings: Settings, jobs: list[Submitted], stored: dict[str, Any], recipient: str
) -> int:
    """Mail each job's owner as Slurm's MailProg would; returns how many were sent."""
    prog = mail_program() or ""
    if "slurm-gpu" in os.path.basename(prog):
        click.echo(f"\ne-mails: sent by slurmctld through MailProg={prog}")
        return len(jobs)
    click.echo(
        f"\ne-mails: slurm.conf has MailProg={prog or '(default)'}, not the slurm-gpu wrapper; "
        "running 'slurm-gpu mail' the way MailProg would for each --mail-type=END job"
    )
    sent = 0
    for job in jobs:
        s = stored.get(job.job_id)
        if s is None:
            continue
        ended = EndedJob(
            job.job_id, s.job.job_name, s.job.state, s.job.elapsed_s, s.job.exit_code or 0
        )
        argv, env = mail_command(
            [tool("slurm-gpu"), "mail", *_cfg_args(settings)], ended, recipient
        )
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=180, check=False
        )
        status = "sent" if result.returncode == 0 else f"failed ({result.returncode})"
        click.echo(f"  job {job.job_id} {job.pattern}: {status} to {recipient}")
        if result.returncode != 0 or result.stderr.strip():
            click.echo("    " + (result.stderr.strip() or result.stdout.strip()), err=True)
        sent += result.returncode == 0
    return sent


def _record(settings: Settings, jobs: list[Submitted], directory: Path) -> None:
    """Save each job's sacct record and sealed node records (from the collector's done/
    directory, exactly as the epilog wrote them) as a labelled trace."""
    from datetime import UTC, datetime

    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.evaluation.recorded import analysis_overrides, dump_trace, write_trace
    from slurm_gpu.spool import decode_record

    accounting = open_accounting(settings).get_jobs([j.job_id for j in jobs])
    version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, check=False)
    recorded = {
        "cluster": f"local test cluster ({version.stdout.strip() or 'slurm'}, one node, "
        "virtual GPUs)",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "slurm-gpu demo run --record tests/data/traces",
    }
    for job in jobs:
        record = accounting.get(job.job_id)
        done = Path(settings.paths.state_dir) / "done" / job.job_id
        nodes = [decode_record(p.read_bytes(), where=str(p)) for p in sorted(done.glob("*.record"))]
        if record is None or not nodes:
            click.echo(f"job {job.job_id}: nothing to record", err=True)
            continue
        data = dump_trace(
            record,
            nodes,
            job.pattern,
            analysis=analysis_overrides(settings.analysis),
            recorded={**recorded, "job_id": job.job_id},
        )
        click.echo(f"recorded {write_trace(directory, data)}")


def _weekly_report(settings: Settings, started_s: float, path: Path) -> None:
    argv = [
        tool("slurm-gpu"),
        *_cfg_args(settings),
        "report",
        "weekly",
        "--since",
        iso_utc(started_s - 60),
        "--out",
        str(path),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        click.echo(f"weekly report failed: {result.stderr.strip()}", err=True)
    else:
        click.echo(f"weekly report: {path}")


def _print_records(settings: Settings, jobs: list[Submitted]) -> None:
    """What the hooks sealed for each job (before the collector moves it out of the spool)."""
    ids = [j.job_id for j in jobs]
    states = job_states(ids)
    found = find_records(settings.paths.spool_dir, ids, wait_s=15.0)
    for job in jobs:
        click.echo(f"job {job.job_id} {job.pattern} {states.get(job.job_id, '?')}")
        got = found.get(job.job_id, "not found")
        if isinstance(got, str):
            click.echo(f"  {got}")
            continue
        for record in got:
            click.echo(
                f"  {record.hostname}: {len(record.gpus)} GPU(s), "
                f"{'complete' if record.complete else 'recovered'}"
            )
            for gpu in record.gpus:
                click.echo(f"    {describe_gpu(gpu)}")
            if record.host is not None:
                click.echo(f"    host: {describe_host(record.host)}")
