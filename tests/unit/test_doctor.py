"""slurm-gpu doctor: each check reports, with a hint, and never raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from click.testing import CliRunner

from slurm_gpu import doctor
from slurm_gpu.cli.admin import cli
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.errors import AccountingError, StoreError, TelemetryUnavailableError
from slurm_gpu.records import GpuInfo, GpuSample, JobRecord


class FakeSource:
    name = "fake"

    def __init__(self, gpus: Sequence[GpuInfo], lost: set[str] = frozenset()) -> None:
        self.gpus, self.lost, self.closed = list(gpus), lost, False

    def list_gpus(self) -> Sequence[GpuInfo]:
        return self.gpus

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        return [GpuSample(uuid=u, time_s=0.0, available=u not in self.lost) for u in uuids]

    def close(self) -> None:
        self.closed = True


def test_telemetry_ok_lists_models_and_closes_the_source() -> None:
    src = FakeSource([GpuInfo("GPU-a", name="H100"), GpuInfo("GPU-b", name="H100")])
    result = doctor.check_telemetry(lambda: src)
    assert result.status is doctor.Status.OK and "2 GPU(s): H100" in result.detail
    assert src.closed


def test_telemetry_lost_gpu_fails_and_names_it() -> None:
    src = FakeSource([GpuInfo("GPU-a"), GpuInfo("GPU-b")], lost={"GPU-b"})
    result = doctor.check_telemetry(lambda: src)
    assert result.status is doctor.Status.FAIL and "GPU-b" in result.detail and result.hint


def test_telemetry_library_missing_fails_with_its_hint() -> None:
    def broken() -> FakeSource:
        raise TelemetryUnavailableError("NVML missing", hint="install the driver")

    result = doctor.check_telemetry(broken)
    assert (result.status, result.hint) == (doctor.Status.FAIL, "install the driver")


def test_spool_world_writable_fails(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chmod(spool, 0o777)
    settings = parse_settings({"paths": {"spool_dir": str(spool)}}, path=None)
    result = doctor.check_spool(settings)
    assert result.status is doctor.Status.FAIL and "0777" in result.detail


def test_spool_low_space_warns(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o711)
    settings = parse_settings({"paths": {"spool_dir": str(tmp_path)}}, path=None)
    result = doctor.check_spool(settings, disk_free=lambda _p: 10 * 2**20)
    expected = doctor.Status.WARN if os.getuid() == 0 else doctor.Status.FAIL
    assert result.status is expected


def test_accounting_error_is_reported_not_raised() -> None:
    class Down:
        def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
            raise AssertionError

        def jobs_between(self, *_a: object, **_k: object) -> list[JobRecord]:
            raise AccountingError("slurmdbd down", hint="start slurmdbd")

    result = doctor.check_accounting(lambda: Down())
    assert (result.status, result.detail) == (doctor.Status.FAIL, "slurmdbd down")


def test_store_behind_warns_and_unopenable_fails() -> None:
    assert doctor.check_store(lambda: ("sqlite://", 1, 2)).status is doctor.Status.WARN

    def broken() -> tuple[str, int, int]:
        raise StoreError("cannot open", hint="check the URL")

    assert doctor.check_store(broken).status is doctor.Status.FAIL


def test_unexpected_exception_in_a_check_is_a_fail_not_a_crash() -> None:
    def boom() -> doctor.Check:
        raise RuntimeError("surprise")

    (result,) = doctor.run_checks([boom])
    assert result.status is doctor.Status.FAIL and "surprise" in result.detail


def test_cli_exit_code_follows_failures(tmp_path: Path) -> None:
    """With virtual GPUs and only local checks, doctor passes; a missing GPU dir fails it."""
    from slurm_gpu.telemetry.virtual_device import create_gpus

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o711)
    vdir = tmp_path / "vgpu"
    create_gpus(vdir, count=2)
    config = tmp_path / "c.toml"
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config.write_text(
        f'[paths]\nspool_dir = "{spool}"\nstate_dir = "{state}"\nlog_file = ""\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\n'
    )
    runner = CliRunner()
    args = ["--config", str(config), "doctor", "--skip", "accounting", "--skip", "store"]
    args += ["--skip", "slurmconf"]
    ok = runner.invoke(cli, args)
    assert ok.exit_code == (0 if os.getuid() == 0 else 1), ok.output
    assert "2 GPU(s)" in ok.output
    # Only the test's own paths are read, never the host's defaults.
    assert "/var/lib/slurm-gpu" not in ok.output and "/var/spool" not in ok.output
    config.write_text(config.read_text().replace(str(vdir), str(tmp_path / "missing")))
    bad = runner.invoke(cli, args)
    assert bad.exit_code == 1 and "fail  telemetry" in bad.output and "hint:" in bad.output


CHECK_NAMES = [
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
    "slurmconf",
]


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_every_check_can_be_skipped(name: str) -> None:
    result = CliRunner().invoke(cli, ["doctor", "--help"])
    assert name in result.output


# --------------------------------------------------------------------------- unsafe settings


def _settings(**sections: dict[str, object]) -> Settings:
    return parse_settings(sections, path=None)


def test_doctor_flags_a_config_file_another_account_can_write(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    cfg.chmod(0o644)
    assert doctor.check_config(str(cfg)).status is doctor.Status.OK
    assert doctor.check_config(None).status is doctor.Status.OK
    cfg.chmod(0o664)
    result = doctor.check_config(str(cfg))
    assert result.status is doctor.Status.FAIL and "writable" in result.detail and result.hint
    if os.geteuid() == 0:
        cfg.chmod(0o644)
        os.chown(cfg, 65534, 65534)
        assert doctor.check_config(str(cfg)).status is doctor.Status.FAIL


def test_doctor_never_acts_on_an_untrusted_config(tmp_path: Path) -> None:
    """An untrusted file is reported, and its sacct_path is not run (root would run it)."""
    marker = tmp_path / "ran"
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\ntouch {marker}\n")
    sacct.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[accounting]\nsacct_path = "{sacct}"\n[paths]\nlog_file = ""\n')
    cfg.chmod(0o666)
    res = CliRunner().invoke(cli, ["--config", str(cfg), "doctor", "--skip", "telemetry"])
    assert res.exit_code == 1, res.output
    assert "fail  config" in res.output and "not trusted" in res.output
    assert "accounting  not run" in res.output
    assert not marker.exists()


def test_doctor_flags_a_state_dir_another_account_can_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    assert doctor.check_state_dir(_settings(paths={"state_dir": str(state)})).status is (
        doctor.Status.OK
    )
    state.chmod(0o775)  # docs once told sites to let the slurm group write it
    result = doctor.check_state_dir(_settings(paths={"state_dir": str(state)}))
    assert result.status is doctor.Status.FAIL and "writable" in result.detail
    state.chmod(0o700)
    tmp_path.chmod(0o777)  # a parent others can write can swap the directory itself
    try:
        result = doctor.check_state_dir(_settings(paths={"state_dir": str(state)}))
        assert result.status is doctor.Status.FAIL and str(tmp_path) in result.detail
    finally:
        tmp_path.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(state)
    result = doctor.check_state_dir(_settings(paths={"state_dir": str(link)}))
    assert result.status is doctor.Status.FAIL and "symbolic link" in result.detail


def test_doctor_flags_mail_state_shared_with_the_collector(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    base = _settings(paths={"state_dir": str(state)})
    # [mail] state_dir may not be declared in every release: the check reads it if it is.
    shared = cast(
        Settings,
        SimpleNamespace(paths=base.paths, mail=SimpleNamespace(state_dir=f"{state}/")),
    )
    result = doctor.check_state_dir(shared)
    assert result.status is doctor.Status.FAIL and "mail.state_dir" in result.detail
    apart = cast(
        Settings,
        SimpleNamespace(paths=base.paths, mail=SimpleNamespace(state_dir=f"{tmp_path}/mail")),
    )
    assert doctor.check_state_dir(apart).status is doctor.Status.OK
    assert doctor.check_state_dir(base).status is doctor.Status.OK  # no such key: no crash


def test_doctor_flags_the_virtual_backend_outside_a_test_setup(tmp_path: Path) -> None:
    virtual = _settings(telemetry={"backend": "virtual", "virtual_dir": str(tmp_path)})
    on_gpu_node = doctor.check_backend(virtual, has_nvidia=lambda: True)
    assert on_gpu_node.status is doctor.Status.FAIL and on_gpu_node.hint
    elsewhere = doctor.check_backend(virtual, has_nvidia=lambda: False)
    assert elsewhere.status is doctor.Status.WARN and "simulated" in elsewhere.detail
    real = doctor.check_backend(_settings(), has_nvidia=lambda: True)
    assert real.status is doctor.Status.OK


def test_doctor_flags_a_sampler_launched_without_limits() -> None:
    unlimited = {"sampler_launcher": "detach", "sampler_memory_max_bytes": 0}
    result = doctor.check_launcher(_settings(hooks=unlimited))
    assert result.status is doctor.Status.WARN and "limit" in result.detail
    unit = doctor.check_launcher(_settings(hooks={**unlimited, "sampler_launcher": "systemd"}))
    assert unit.status is doctor.Status.OK


def test_doctor_counts_configured_sampler_limits() -> None:
    limited = _settings(hooks={"sampler_launcher": "detach"})
    assert doctor.sampler_limits(limited) == {
        "hooks.sampler_memory_max_bytes": 268435456,
        "hooks.sampler_open_files_max": 4096,
    }
    assert doctor.check_launcher(limited).status is doctor.Status.OK
    no_files = _settings(hooks={"sampler_open_files_max": 0})
    assert doctor.sampler_limits(no_files) == {"hooks.sampler_memory_max_bytes": 268435456}


def test_doctor_flags_a_spool_root_that_is_not_0700(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o711)
    settings = _settings(paths={"spool_dir": str(spool)})
    result = doctor.check_spool(settings, disk_free=lambda _p: 2**40)
    expected = doctor.Status.WARN if os.geteuid() == 0 else doctor.Status.FAIL
    assert result.status is expected
    if os.geteuid() == 0:
        assert "0711" in result.detail and "chmod 0700" in (result.hint or "")
        spool.chmod(0o700)
        assert doctor.check_spool(settings, disk_free=lambda _p: 2**40).status is (doctor.Status.OK)


def test_doctor_flags_code_another_account_can_change(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    package = tmp_path / "__init__.py"
    package.write_text("")
    assert doctor.check_code(str(python), str(package)).status is doctor.Status.OK
    package.chmod(0o666)
    result = doctor.check_code(str(python), str(package))
    assert result.status is doctor.Status.FAIL and "package" in result.detail


# --------------------------------------------------------------------------- slurm.conf

#: ``scontrol show config`` of the local test cluster (the lines the check reads, and others).
SCONTROL = """Configuration data as of 2026-11-29T00:00:00
Epilog                  = /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-epilog
EpilogSlurmctld         = (null)
MailProg                = /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-mailprog
Prolog                  = /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-prolog
PrologFlags             = Alloc
SLURM_CONF              = /etc/slurm/slurm.conf
"""


def test_slurm_conf_with_the_hooks_passes_and_names_each_line() -> None:
    result = doctor.check_slurm_conf(SCONTROL, "scontrol show config")
    assert result.status is doctor.Status.OK, result
    assert "Prolog /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-prolog" in result.detail
    assert "MailProg /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-mailprog" in result.detail
    assert "EpilogSlurmctld not set (optional" in result.detail


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            ("Prolog                  = /var/lib/slurm-gpu-testcluster/hooks/slurm-gpu-prolog", ""),
            "Prolog is not set",
        ),
        (
            ("slurm-gpu-epilog", "site-epilog"),
            "Epilog is /var/lib/slurm-gpu-testcluster/hooks/site-epilog",
        ),
        (("= Alloc", "= Contain"), "PrologFlags is Contain"),
    ],
)
def test_slurm_conf_without_a_required_line_fails(edit: tuple[str, str], said: str) -> None:
    result = doctor.check_slurm_conf(SCONTROL.replace(*edit), "scontrol show config")
    assert result.status is doctor.Status.FAIL and said in result.detail, result
    assert result.hint and "hooks install" in result.hint


def test_slurm_conf_file_lines_and_prolog_directories(tmp_path: Path) -> None:
    pdir = tmp_path / "prolog.d"
    pdir.mkdir()
    (pdir / "50-slurm-gpu-prolog").write_text("")
    text = (
        f"# slurm.conf\nProlog={pdir}/*\nEpilog=/etc/slurm/slurm-gpu/slurm-gpu-epilog\n"
        "PrologFlags=Alloc,Contain  # whole job\n"
    )
    result = doctor.check_slurm_conf(text, "/etc/slurm/slurm.conf")
    assert result.status is doctor.Status.OK, result
    assert doctor.check_slurm_conf(None, "scontrol cannot be run").status is doctor.Status.WARN


def _checks_as_nobody(state: Path, store: Path) -> dict[str, tuple[str, str]]:
    """``check_state_dir``, ``check_store`` and ``check_code`` run as uid 65534: name ->
    (status, detail + hint)."""
    code = (
        "import json, sys\n"
        "from slurm_gpu import doctor\n"
        "from slurm_gpu.config import parse_settings\n"
        "from slurm_gpu.store.store import Store\n"
        "state, store = sys.argv[1:3]\n"
        "s = parse_settings({'paths': {'state_dir': state}}, path=None)\n"
        "def info():\n"
        "    with Store.open('sqlite:///' + store, migrate=False) as st:\n"
        "        return ('x', 1, 1)\n"
        "out = {}\n"
        "for c in (doctor.check_state_dir(s), doctor.check_store(info), doctor.check_code()):\n"
        "    out[c.name] = (c.status.value, f'{c.detail} {c.hint}')\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(state), str(store)],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
        cwd="/",
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {k: tuple(v) for k, v in json.loads(proc.stdout).items()}  # type: ignore[misc]


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another uid")
def test_as_an_ordinary_user_what_it_may_not_open_is_not_a_fault() -> None:
    # Seen as sgtest1 on the test cluster: "fail state … cannot open … (Permission denied);
    # another account could redirect what the collector writes" for root's 0700 state
    # directory, and "fail code" and "fail store" alike: the directory was safe, the user
    # may not look. Such checks say they need root, as the log and visibility checks did.
    top = Path(tempfile.mkdtemp(prefix="doctor-", dir="/tmp"))
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir(mode=0o700)
        got = _checks_as_nobody(state, state / "slurm-gpu.db")
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)
    for name in ("state", "store"):
        status, text = got[name]
        assert status == "warn", (name, got[name])
        assert "run doctor as root" in text and "redirect" not in text, (name, text)
    assert got["code"][0] in ("ok", "warn"), got["code"]


def test_doctor_fails_a_store_password_in_a_file_every_user_reads(tmp_path: Path) -> None:
    """Users' tools read the configuration file, so a password in ``store.url`` there is the
    collector's credential handed to every user."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    cfg.chmod(0o644)
    secret = "postgresql+psycopg://collector:s3cret@db/slurmgpu"
    result = doctor.check_config(str(cfg), store_url=secret)
    assert result.status is doctor.Status.FAIL, result
    assert "password" in result.detail and "s3cret" not in result.detail and result.hint
    assert doctor.check_config(str(cfg), store_url="postgresql+psycopg:///slurmgpu").status is (
        doctor.Status.OK
    )
    cfg.chmod(0o600)
    assert doctor.check_config(str(cfg), store_url=secret).status is doctor.Status.OK


def test_doctor_fails_a_prometheus_password_in_a_file_every_user_reads(tmp_path: Path) -> None:
    """The same for the password of a Prometheus that asks for one: in ``live.prometheus_url``
    of a file every user reads, it is handed to them; ``prometheus_password_file`` is not."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    cfg.chmod(0o644)
    secret = "http://slurmgpu:s3cret@prometheus:9090"
    result = doctor.check_config(str(cfg), prometheus_url=secret)
    assert result.status is doctor.Status.FAIL, result
    assert "live.prometheus_url" in result.detail and "s3cret" not in result.detail
    assert result.hint is not None and "prometheus_password_file" in result.hint
    user_only = "http://slurmgpu@prometheus:9090"
    assert doctor.check_config(str(cfg), prometheus_url=user_only).status is doctor.Status.OK
    cfg.chmod(0o600)
    assert doctor.check_config(str(cfg), prometheus_url=secret).status is doctor.Status.OK
