"""``slurm-gpu demo run`` as a library: submit the demo jobs, wait for them, collect them, and
show per job what its owner sees (``gpueff``), the e-mails after the jobs and the weekly report.

The CLI (``slurm_gpu.cli.demo_cmd``) only parses options into ``DemoOptions`` and calls
``run_demo``; what the run prints goes through the ``Echo`` it is given.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slurm_gpu.config import Settings
from slurm_gpu.demo.mailcheck import failure_line, fallback_dir_of, summary_line, tally_mail
from slurm_gpu.demo.patterns import PATTERNS
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

#: Seconds to wait, after the collection, for the e-mails of the jobs that asked for one.
MAIL_WAIT_S = 60.0


@dataclass(frozen=True)
class Echo:
    """Where the run's lines go: ``out`` for the story, ``err`` for problems."""

    out: Callable[[str], None]
    err: Callable[[str], None]


@dataclass(frozen=True)
class DemoOptions:
    """What ``slurm-gpu demo run`` was asked (see its ``--help``); times in seconds."""

    user: str
    patterns: str
    scripts_dir: str | None
    out_dir: str
    wait: bool
    records: bool
    record_dir: str | None
    timeout_s: float
    web_port: int = 0
    """Serve each job's web page on this loopback port after the run; 0: none."""


def run_demo(settings: Settings, opts: DemoOptions, echo: Echo) -> int:
    """Run the demo; returns the exit status (0 when every job ended and was stored)."""
    user, scripts_dir, out_dir = opts.user, opts.scripts_dir, opts.out_dir
    wait, records, record_dir, timeout_s = opts.wait, opts.records, opts.record_dir, opts.timeout_s
    patterns = opts.patterns
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
        echo.out(f"submitted {job.pattern:<12} job {job.job_id}{mailed}")
    if not wait:
        return 0
    out = Path(out_dir).resolve()
    (out / "gpueff").mkdir(parents=True, exist_ok=True)
    sink = _start_sink(settings, out / "mail")
    try:
        ids = [j.job_id for j in jobs]
        echo.out(f"waiting for {len(ids)} jobs (4 GPUs, so they run in rounds) ...")
        left = wait_for(ids, timeout_s=timeout_s, progress=echo.out)
        if left:
            echo.err(f"still running after {timeout_s:g}s: {', '.join(sorted(left))}")
        ended = [j for j in jobs if j.job_id not in left]
        if records:
            _print_records(echo, settings, ended)
        echo.out(f"jobs ended after {time.monotonic() - t0:.0f} s; collecting ...")
        stored = _collect(echo, settings, [j.job_id for j in ended])
        for job in ended:
            _show_gpueff(echo, settings, job, run_as, out / "gpueff")
        if record_dir:
            _record(echo, settings, [j for j in ended if j.job_id in stored], Path(record_dir))
        asked = [j for j in ended if j.pattern in MAILED]
        mails = _send_mails(echo, settings, asked, stored, recipient)
        report = out / "weekly-report.html"
        _weekly_report(echo, settings, started_s, report)
        fallback_dir = fallback_dir_of(settings.mail.fallback_mailprog)
        tally = None
        if sink is not None:
            # slurmctld's MailProg sends once the job is stored, i.e. moments after the
            # collection above; wait until each job that asked has one message or the other.
            tally = tally_mail(
                [j.job_id for j in asked],
                lambda: sink.saved,
                fallback_dir,
                since_s=started_s,
                timeout_s=max(MAIL_WAIT_S, 10.0 * settings.mail.poll_interval_s),
            )
            mail_failed = failure_line(tally, {j.job_id: j.pattern for j in asked})
        elif mails < len(asked):
            mail_failed = f"e-mails: {len(asked) - mails} of {len(asked)} were not sent"
        else:
            mail_failed = None
        echo.out("")
        echo.out(f"done in {time.monotonic() - t0:.0f} s. Where everything is:")
        echo.out(f"  what each job's owner sees:  gpueff JOBID  (saved in {out / 'gpueff'})")
        if tally is not None:
            echo.out(
                "  e-mails after the jobs:      " + summary_line(tally, out / "mail", fallback_dir)
            )
        else:
            echo.out(
                f"  e-mails after the jobs:      sent through {settings.mail.smtp_host}:"
                f"{settings.mail.smtp_port} ({settings.mail.transport})"
            )
        echo.out(f"  weekly admin report:         {report}")
        echo.out(f"  the store:                   {mask_url(settings.store_url)}")
        echo.out(f"  sealed records (collected):  {settings.paths.state_dir}/done")
    finally:
        if sink is not None:
            sink.stop()
    if mail_failed:
        # Loud and last, so that a demo whose e-mails went astray does not look like a success.
        echo.err(mail_failed)
    status = 1 if left or set(ids) - set(stored) or mail_failed else 0
    if opts.web_port:
        serve_pages(echo, settings, owner, [j for j in ended if j.job_id in stored], opts.web_port)
    return status


def serve_pages(
    echo: Echo, settings: Settings, owner: str, jobs: list[Submitted], port: int
) -> None:
    """Print each job's web page and serve the pages on loopback until interrupted, as
    ``owner`` sees them: the page's service deployment (``docs/web.md``) with the demo as its
    authenticating front server, so Slurm's visibility rule applies as for a real viewer."""
    try:
        from werkzeug.serving import make_server

        from slurm_gpu.web.app import create_app
    except ImportError:
        echo.err("web pages: Flask is not installed (pip install 'slurm-gpu[web]')")
        return
    app = create_app(replace(settings, web=replace(settings.web, identity="remote_user")))

    def as_owner(environ: dict[str, Any], start_response: Any) -> Any:
        environ["REMOTE_USER"] = owner
        return app(environ, start_response)

    server = make_server("127.0.0.1", port, as_owner, threaded=True)
    base = f"http://127.0.0.1:{server.server_port}"
    echo.out("")
    echo.out(f"web pages, as {owner} sees them (Ctrl-C stops them):")
    echo.out(f"  {owner}'s recent jobs:  {base}/")
    for job in jobs:
        echo.out(f"  {job.pattern:<16} {base}/job/{job.job_id}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


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


def _collect(echo: Echo, settings: Settings, ids: list[str]) -> dict[str, Any]:
    """Run ``slurm-gpu collect`` until every job is stored; the stored jobs by id."""
    from slurm_gpu.store import open_store

    argv = [tool("slurm-gpu"), *_cfg_args(settings), "collect", "--once", "--no-missing"]
    with open_store(settings) as store:
        missing = collect_until_stored(
            argv, ids, lambda want: store.existing_job_ids(want), timeout_s=120.0
        )
        got = {i: store.get_job(i) for i in ids if i not in missing}
    if missing:
        echo.err(f"not in the store after 120 s: {', '.join(sorted(missing))}")
    echo.out(f"{len(got)} of {len(ids)} jobs in the store")
    return got


def _show_gpueff(
    echo: Echo, settings: Settings, job: Submitted, user: str | None, out: Path
) -> None:
    env = {"SLURM_GPU_CONFIG": settings.path} if settings.path else {}
    argv = as_user([tool("gpueff"), job.job_id], user, env)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    text = result.stdout + result.stderr
    (out / f"{job.job_id}-{job.pattern}.txt").write_text(text, encoding="utf-8")
    who = f"{user}$ " if user else "$ "
    echo.out("")
    echo.out(f"==== {job.pattern} (cause {PATTERNS[job.pattern].cause}) ====")
    echo.out(f"{who}gpueff {job.job_id}")
    echo.out(text.rstrip())


def _send_mails(
    echo: Echo, settings: Settings, jobs: list[Submitted], stored: dict[str, Any], recipient: str
) -> int:
    """Mail each job's owner as Slurm's MailProg would; returns how many were sent."""
    prog = mail_program() or ""
    if "slurm-gpu" in os.path.basename(prog):
        echo.out(f"\ne-mails: sent by slurmctld through MailProg={prog}")
        return len(jobs)
    echo.out(
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
        echo.out(f"  job {job.job_id} {job.pattern}: {status} to {recipient}")
        if result.returncode != 0 or result.stderr.strip():
            echo.err("    " + (result.stderr.strip() or result.stdout.strip()))
        sent += result.returncode == 0
    return sent


def _record(echo: Echo, settings: Settings, jobs: list[Submitted], directory: Path) -> None:
    """Save each job's sacct record and sealed node records (from the collector's done/
    directory, exactly as the epilog wrote them) as a labelled trace."""
    from datetime import UTC, datetime

    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.capture.spool import decode_record
    from slurm_gpu.evaluation.recorded import analysis_overrides, dump_trace, write_trace

    source = open_accounting(settings, batch_scripts=settings.accounting.batch_scripts)
    accounting = source.get_jobs([j.job_id for j in jobs])
    version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, check=False)
    recorded = {
        "cluster": f"local test cluster ({version.stdout.strip() or 'slurm'}, one node, "
        "virtual GPUs)",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "slurm-gpu demo run --record tests/data/traces",
    }
    for job in jobs:
        record = accounting.get(job.job_id)
        done = Path(settings.paths.state_dir) / "done"
        # done/<job>.<host>.record; done/<job>/<host>.record from collectors before 2026-11-27.
        paths = sorted(done.glob(f"{job.job_id}.*.record")) + sorted(
            (done / job.job_id).glob("*.record")
        )
        nodes = [decode_record(p.read_bytes(), where=str(p)) for p in paths]
        if record is None or not nodes:
            echo.err(f"job {job.job_id}: nothing to record")
            continue
        data = dump_trace(
            record,
            nodes,
            job.pattern,
            analysis=analysis_overrides(settings.analysis),
            recorded={**recorded, "job_id": job.job_id},
        )
        echo.out(f"recorded {write_trace(directory, data)}")


def _weekly_report(echo: Echo, settings: Settings, started_s: float, path: Path) -> None:
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
        echo.err(f"weekly report failed: {result.stderr.strip()}")
    else:
        echo.out(f"weekly report: {path}")


def _print_records(echo: Echo, settings: Settings, jobs: list[Submitted]) -> None:
    """What the hooks sealed for each job (before the collector moves it out of the spool)."""
    ids = [j.job_id for j in jobs]
    states = job_states(ids)
    found = find_records(settings.paths.spool_dir, ids, wait_s=15.0)
    for job in jobs:
        echo.out(f"job {job.job_id} {job.pattern} {states.get(job.job_id, '?')}")
        got = found.get(job.job_id, "not found")
        if isinstance(got, str):
            echo.out(f"  {got}")
            continue
        for record in got:
            echo.out(
                f"  {record.hostname}: {len(record.gpus)} GPU(s), "
                f"{'complete' if record.complete else 'recovered'}"
            )
            for gpu in record.gpus:
                echo.out(f"    {describe_gpu(gpu)}")
            if record.host is not None:
                echo.out(f"    host: {describe_host(record.host)}")
