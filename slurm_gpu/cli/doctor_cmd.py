"""``slurm-gpu doctor``: check config, code, spool, state, backend, sampler launcher, log,
GPUs, accounting, store, who can read stored data, who can reach live data, and the
slurm.conf lines the install asks for."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import click

from slurm_gpu import doctor
from slurm_gpu.cli.common import settings_from
from slurm_gpu.trust import untrusted_reason


def _store_info(settings: object) -> tuple[str, int, int]:
    from slurm_gpu.store import open_store

    with open_store(settings, readonly=True) as store:  # type: ignore[arg-type]
        info = store.info()
    return info.url, info.schema_version, info.latest_version


def _output(argv: list[str]) -> str | None:
    """Standard output of a Slurm client command; ``None`` when it cannot be run."""
    import subprocess

    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=30, check=True, cwd="/"
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _private_data(settings: object) -> frozenset[str] | None:
    """Slurm's PrivateData flags: slurm.conf's (``scontrol show config``) and slurmdbd's
    (``sacctmgr show configuration``: sacct follows it, so a flag set there alone hides jobs
    as well), the commands beside an absolute ``accounting.sacct_path``; ``None`` when
    scontrol cannot be asked."""
    from slurm_gpu.accounting.admincomment import sacctmgr_path_for
    from slurm_gpu.accounting.partitions import scontrol_path_for
    from slurm_gpu.store.visibility import dbd_private_data, private_data

    sacct = settings.accounting.sacct_path  # type: ignore[attr-defined]
    ctl = _output([scontrol_path_for(sacct), "show", "config"])
    if ctl is None:
        return None
    sacctmgr = sacctmgr_path_for(settings.collector.sacctmgr_path, sacct)  # type: ignore[attr-defined]
    dbd = _output([sacctmgr, "show", "configuration"]) or ""
    return private_data(ctl) | dbd_private_data(dbd)


def _slurm_conf(settings: object) -> tuple[str | None, str]:
    """Slurm's configuration as slurmctld holds it (``scontrol show config``, beside an
    absolute ``accounting.sacct_path``), else the file ``$SLURM_CONF`` or
    ``/etc/slurm/slurm.conf`` names; (text or ``None``, where it came from)."""
    from slurm_gpu.accounting.partitions import scontrol_path_for

    scontrol = scontrol_path_for(settings.accounting.sacct_path)  # type: ignore[attr-defined]
    text = _output([scontrol, "show", "config"])
    if text is not None:
        return text, "scontrol show config"
    path = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20), path
    except OSError:
        return None, f"scontrol cannot be run and {path} cannot be read"


def _rls_missing(settings: object) -> list[str]:
    from slurm_gpu.store import open_store
    from slurm_gpu.store.visibility import tables_without_rls

    with open_store(settings, readonly=True) as store:  # type: ignore[arg-type]
        return tables_without_rls(store.engine)


def _prometheus_listen(settings: object) -> str:
    from slurm_gpu.prometheus.client import PrometheusClient

    live = settings.live  # type: ignore[attr-defined]
    return PrometheusClient(
        live.prometheus_url,
        live.prometheus_timeout_s,
        password_file=live.prometheus_password_file,
    ).listen_address()


def _live_identity(settings: object) -> doctor.Check:
    """``doctor.check_live_identity`` against [live] prometheus_url (OK without one)."""
    from slurm_gpu.prometheus.client import PrometheusClient

    live = settings.live  # type: ignore[attr-defined]
    if not live.prometheus_url:
        return doctor.Check("identity", doctor.Status.OK, "no Prometheus: this node's files")
    client = PrometheusClient(
        live.prometheus_url,
        live.prometheus_timeout_s,
        password_file=live.prometheus_password_file,
    )
    return doctor.check_live_identity(
        client.status_config,
        client.query,
        live.police_scrape_job,
        live.police_target_label,
        live.police_bind_gpus,
    )


def _node_role_excess(settings: object) -> list[str]:
    from slurm_gpu.store import open_store
    from slurm_gpu.store.inbox import node_role_excess

    with open_store(settings, readonly=True) as store:  # type: ignore[arg-type]
        return node_role_excess(store.engine)


#: Asks ``GET /metrics`` of ``host:port`` and prints the HTTP status (0: nothing answers).
_PROBE = (
    "import http.client, sys\n"
    "try:\n"
    "    c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)\n"
    "    c.request('GET', '/metrics')\n"
    "    print(c.getresponse().status)\n"
    "except (OSError, http.client.HTTPException):\n"
    "    print(0)\n"
)


def _probe_as_nobody(host: str, port: int) -> int | None:
    """The HTTP status the exporter on ``host:port`` gives a local account that is not
    allowed (``nobody``, run from this host as a child process); ``None``: nothing
    answers."""
    import pwd
    import subprocess
    import sys

    try:
        uid, gid = pwd.getpwnam("nobody")[2:4]
    except KeyError:
        uid = gid = 65534
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-c", _PROBE, host, str(port)],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
            cwd="/",
            user=uid,
            group=gid,
            extra_groups=[],
        ).stdout
        status = int(out.strip() or "0")
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return status or None


def _exporter_targets(address: str) -> list[str]:
    """Where a local user reaches the exporter: its listen address, or loopback and this
    host's own addresses when it listens on every interface."""
    from slurm_gpu.live.localaddr import proc_local_addresses

    if doctor.listen_host(address) not in doctor.ALL_INTERFACES:
        return [doctor.listen_host(address)]
    try:
        own = sorted(proc_local_addresses(), key=lambda a: (a.version, str(a)))
    except OSError:
        own = []
    return ["127.0.0.1", *(str(a) for a in own if not a.is_loopback and not a.is_link_local)][:4]


#: The checks, in the order they run; each can be skipped with --skip.
CHECKS = (
    "config",
    "code",
    "spool",
    "state",
    "backend",
    "launcher",
    "log",
    "telemetry",
    "accounting",
    "store",
    "visibility",
    "live",
    "exporter",
    "identity",
    "transport",
    "slurmconf",
)

#: Checks that act on the settings (open GPUs, run sacct or scontrol, open the store, connect
#: to the exporter's address or ask Prometheus): not run on a configuration file that is not
#: trusted, whose sacct_path, store URL or addresses another account chose.
ACTING = (
    "telemetry",
    "accounting",
    "store",
    "visibility",
    "live",
    "exporter",
    "identity",
    "transport",
    "slurmconf",
)


@click.command("doctor")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(list(CHECKS)),
    help="Skip a check (repeatable), e.g. telemetry on a host without GPUs.",
)
@click.pass_context
def cli(ctx: click.Context, skip: tuple[str, ...]) -> None:
    """Check this installation. Exit 0 when nothing failed, 1 when a check failed.

    Also flags unsafe choices: a configuration file another account can write, code root
    runs that another account can change, a state directory shared with another account, the
    virtual GPU backend, a sampler without limits, a spool that is not 0700, and any place a
    user could read another user's stored jobs (visibility), and an exporter or Prometheus
    that serves every running job to anyone who can connect (live), an exporter or its
    textfile that a user of this node can read (exporter), and a node credential of the
    PostgreSQL inbox that may do more than insert records (transport).
    """
    from slurm_gpu.accounting import open_accounting
    from slurm_gpu.telemetry import open_source

    # Read even a file that is not trusted, to report it; the checks that would act on it
    # (run its sacct_path, open its store) are then skipped.
    settings = settings_from(ctx, trusted=False)
    trusted = settings.path is None or untrusted_reason(settings.path) is None
    checks: dict[str, Callable[[], doctor.Check]] = {
        "config": lambda: doctor.check_config(
            settings.path, settings.store.url, settings.live.prometheus_url
        ),
        "code": doctor.check_code,
        "spool": lambda: doctor.check_spool(settings),
        "state": lambda: doctor.check_state_dir(settings),
        "backend": lambda: doctor.check_backend(settings),
        "launcher": lambda: doctor.check_launcher(settings),
        "log": lambda: doctor.check_log(settings),
        "telemetry": lambda: doctor.check_telemetry(functools.partial(open_source, settings)),
        "accounting": lambda: doctor.check_accounting(functools.partial(open_accounting, settings)),
        "store": lambda: doctor.check_store(functools.partial(_store_info, settings)),
        "visibility": lambda: doctor.check_visibility(
            settings,
            functools.partial(_private_data, settings),
            functools.partial(_rls_missing, settings),
        ),
        "live": lambda: doctor.check_live_exposure(
            settings,
            functools.partial(_private_data, settings),
            (
                functools.partial(_prometheus_listen, settings)
                if settings.live.prometheus_url
                else None
            ),
        ),
        "exporter": lambda: doctor.check_exporter_local_users(
            settings,
            functools.partial(_private_data, settings),
            _probe_as_nobody if os.geteuid() == 0 else None,
            _exporter_targets(settings.live.exporter_address),
            doctor.exporter_textfiles(),
        ),
        "identity": lambda: _live_identity(settings),
        "transport": lambda: doctor.check_transport(
            settings, functools.partial(_node_role_excess, settings)
        ),
        "slurmconf": lambda: doctor.check_slurm_conf(*_slurm_conf(settings)),
    }
    # Partitions read from the site's Prometheus: which of each source's series it holds,
    # per node (docs/install-prometheus.md).
    from slurm_gpu.sources.prometheus import RECORD_NAMES

    used = {settings.source.default, *settings.source.partitions.values()}
    pulled = [RECORD_NAMES[n] for n in sorted(used) if n in RECORD_NAMES]
    if pulled and settings.live.prometheus_url and trusted:
        checks.update(
            doctor.prometheus_checks(
                settings.live.prometheus_url,
                settings.live.prometheus_timeout_s,
                pulled,
                password_file=settings.live.prometheus_password_file,
            )
        )
    if not trusted:
        for name in ACTING:
            checks[name] = functools.partial(_skipped, name)
    click.echo(f"config: {settings.path or 'defaults only (no file)'}")
    results = doctor.run_checks([fn for name, fn in checks.items() if name not in skip])
    colours = {doctor.Status.OK: "green", doctor.Status.WARN: "yellow", doctor.Status.FAIL: "red"}
    for r in results:
        click.echo(
            f"{click.style(f'{r.status.value:>4}', fg=colours[r.status])}  {r.name:<11} {r.detail}"
        )
        if r.hint:
            click.echo(f"{'':17}hint: {r.hint}")
    if any(r.status is doctor.Status.FAIL for r in results):
        ctx.exit(1)


def _skipped(name: str) -> doctor.Check:
    return doctor.Check(
        name,
        doctor.Status.WARN,
        "not run: the configuration file is not trusted",
        "fix the config check above, then run doctor again",
    )
