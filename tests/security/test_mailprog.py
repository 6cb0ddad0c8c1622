"""Attacks on the MailProg, run against the real rendered wrapper.

slurmctld runs ``MailProg -s SUBJECT USER`` as SlurmUser with USER taken verbatim from the
job owner's ``--mail-user``. Each test renders ``share/mailprog/slurm-gpu-mailprog`` with
``share/mailprog/render`` (as ``share/testcluster/start`` does), runs it as a subprocess with
the argv and environment slurmctld would give it, and looks at what happened on disk.

The interpreter the wrapper runs is a throwaway virtual environment whose only addition is a
``.pth`` file naming this checkout and the test interpreter's site-packages: the wrapper runs
it with ``-I``, so neither PYTHONPATH nor the working directory could point it at the code
under test. Accounting is a stand-in ``sacct`` script ([accounting] sacct_path) that records
its calls and fails (or waits for a gate file first); the site's mail program is a stand-in
that records each call in a directory.
"""

from __future__ import annotations

import os
import site
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import slurm_gpu

REPO = Path(slurm_gpu.__file__).resolve().parents[1]
RENDER = REPO / "share" / "mailprog" / "render"
SUBJECT = "Slurm Job_id=4242 Name=train Ended, Run time 00:01:00, COMPLETED, ExitCode 0"
#: Longest wait for something a detached process does (generous: the machine may be loaded).
WAIT_S = 120.0


@pytest.fixture(scope="session")
def isolated_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter on which this checkout's ``slurm_gpu`` is installed, as in production."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    purelib = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    lines = [str(REPO), *site.getsitepackages()]
    Path(purelib, "00-slurm-gpu-under-test.pth").write_text("\n".join(lines) + "\n")
    return venv / "bin" / "python"


@dataclass
class Site:
    """A root-owned installation: configuration, wrapper, state, and the stand-ins."""

    root: Path
    wrapper: Path
    config: Path
    state: Path
    log: Path
    records: Path
    sacct_log: Path
    gate: Path
    hold: Path

    def call(
        self,
        recipient: str,
        *,
        mail_type: str = "Began",
        job_id: str = "4242",
        extra_env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the wrapper as slurmctld does: ``-s SUBJECT USER``, the job's variables."""
        env = {
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_JOB_USER": "sgtest1",
            "SLURM_JOB_MAIL_TYPE": mail_type,
            "SLURM_JOB_STATE": "COMPLETED",
            "SLURM_JOB_NAME": "train",
            **(extra_env or {}),
        }
        return subprocess.run(
            [str(self.wrapper), "-s", SUBJECT.replace("4242", job_id), recipient],
            env=env,
            cwd=str(cwd or self.root),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )

    def fallback_calls(self) -> list[tuple[list[str], list[str]]]:
        """(arguments, environment lines) of each call of the site's mail program."""
        out = []
        for f in sorted(self.records.iterdir()):
            lines = f.read_text().splitlines()
            cut = lines.index("env:")
            out.append(([ln.removeprefix("arg=") for ln in lines[:cut]], lines[cut + 1 :]))
        return out

    def assert_only_slurm_calls(self) -> None:
        """The site's mail program only ever got Slurm's three arguments and a plain user."""
        for args, _env in self.fallback_calls():
            assert len(args) == 3 and args[0] == "-s", args
            assert args[2][:1].isalnum(), args

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def mail_site(tmp_path: Path, isolated_python: Path) -> Iterator[Site]:
    root = tmp_path / "site"
    for d in ("etc", "hooks", "state", "records", "log"):
        (root / d).mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    records = root / "records"
    fallback = _script(
        root / "hooks" / "fallback-mail",
        "#!/bin/sh\n"
        "env_given=$(/usr/bin/env | /usr/bin/sort)\n"
        # Written aside, then renamed: a reader never sees a half-written record.
        f'part="{root}/part.$$"; f="{records}/${{SLURM_JOB_ID:-none}}.$$"\n'
        '{ for a in "$@"; do printf \'arg=%s\\n\' "$a"; done; echo "env:";'
        ' printf \'%s\\n\' "$env_given"; } >"$part" && mv "$part" "$f"\n'
        "cat >/dev/null\nexit 0\n",
    )
    sacct_log = root / "sacct.log"
    gate = root / "gate"
    hold = root / "hold"
    sacct = _script(
        root / "hooks" / "sacct",
        "#!/bin/sh\n"
        f'echo "$@" >>{sacct_log}\n'
        f"if [ -e {hold} ]; then while [ ! -e {gate} ]; do sleep 0.05; done; fi\n"
        'echo "sacct: error: the test has no slurmdbd" >&2\nexit 1\n',
    )
    config = root / "etc" / "slurm-gpu.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{root / "state"}"\n'
        f'[accounting]\nsacct_path = "{sacct}"\ntimeout_s = {WAIT_S:g}\n'
        f'[mail]\nstate_dir = "{root / "state"}"\n'
        f'fallback_mailprog = "{fallback}"\nsmtp_host = "127.0.0.1"\nsmtp_port = 1\n'
        "wait_for_record_s = 5\npoll_interval_s = 0.1\nwaste_policy = true\n"
    )
    config.chmod(0o644)
    wrapper = root / "hooks" / "slurm-gpu-mailprog"
    log = root / "log" / "mailprog.log"
    subprocess.run(
        [str(RENDER), str(isolated_python), str(config), str(wrapper), str(log)],
        check=True,
        timeout=60,
    )
    s = Site(root, wrapper, config, root / "state", log, records, sacct_log, gate, hold)
    try:
        yield s
    finally:
        gate.touch()  # never leave a process waiting on the stand-in sacct
        _wait_until(lambda: not _mail_programs(config), what="mail programs to exit")


def _wait_until(done: object, *, what: str) -> None:
    assert callable(done)
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def _mail_programs(config: Path) -> list[int]:
    """Pids of mail programs running with this site's configuration (from /proc)."""
    pids = []
    needle = str(config).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"slurm_gpu.cli.mail_cmd" in cmdline and needle in cmdline:
            pids.append(int(entry))
    return pids


def _evil_config(tmp_path: Path) -> tuple[Path, Path]:
    """What a user writes in their home: a configuration naming their own 'mail program'."""
    home = tmp_path / "home-eve"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    marker = home / "pwned"
    evil = _script(home / "x.sh", f"#!/bin/sh\nid > {marker}\n")
    cfg = home / "x.toml"
    cfg.write_text(f'[mail]\nfallback_mailprog = "{evil}"\n[paths]\nstate_dir = "{home}"\n')
    return cfg, marker


# ------------------------------------------------------------------ class 1: argv injection


def test_mail_user_cannot_inject_config_option(mail_site: Site, tmp_path: Path) -> None:
    cfg, marker = _evil_config(tmp_path)
    for mail_type in ("Began", "Ended"):
        proc = mail_site.call(f"--config={cfg}", mail_type=mail_type)
        assert not marker.exists(), proc
    mail_site.assert_only_slurm_calls()
    assert "refusing recipient" in mail_site.log_text()


def test_mail_user_cannot_inject_dry_run_option(mail_site: Site, tmp_path: Path) -> None:
    out = tmp_path / "eve-mails"
    for mail_type in ("Began", "Ended"):
        mail_site.call(f"--dry-run={out}", mail_type=mail_type)
    assert not out.exists() or not list(out.iterdir())
    # The option was not swallowed either: the mail program never ran without its recipient.
    mail_site.assert_only_slurm_calls()
    assert not mail_site.sacct_log.exists()


def test_mail_user_cannot_inject_flush_option(mail_site: Site) -> None:
    proc = mail_site.call("--flush", mail_type="Ended")
    assert "digest" not in proc.stdout + proc.stderr + mail_site.log_text()
    assert not (mail_site.state / "mail-state.db").exists()
    mail_site.assert_only_slurm_calls()


def test_mail_user_cannot_inject_policy_option(mail_site: Site) -> None:
    proc = mail_site.call("--policy=1000", mail_type="Ended")
    assert "policy" not in proc.stdout + proc.stderr
    assert not mail_site.sacct_log.exists(), "accounting was asked for every user's jobs"
    mail_site.assert_only_slurm_calls()


@pytest.mark.parametrize(
    "recipient", ["-Ssendmail=/home/eve/x", "|/home/eve/x", "/home/eve/mbox", "a b", "a,-b"]
)
def test_mail_user_that_is_no_address_never_reaches_the_mail_program(
    mail_site: Site, recipient: str
) -> None:
    proc = mail_site.call(recipient)
    assert proc.returncode == 9
    assert mail_site.fallback_calls() == []


@pytest.mark.parametrize("recipient", ["user1\n,user2", "user1\n", "user1,user2\n", "user1\r"])
def test_mail_user_with_a_trailing_newline_never_reaches_the_mail_program(
    mail_site: Site, recipient: str
) -> None:
    """``$`` matches before a final newline: ``--mail-user=$'user1\\n,user2'`` once passed
    the recipient check and reached the fallback mail program verbatim."""
    proc = mail_site.call(recipient)
    assert proc.returncode == 9, mail_site.log_text()
    assert mail_site.fallback_calls() == []


def test_plain_mail_reaches_the_fallback_with_slurms_arguments_only(mail_site: Site) -> None:
    proc = mail_site.call("sgtest1", extra_env={"LD_PRELOAD": "/x.so", "HOME": "/home/eve"})
    assert proc.returncode == 0, mail_site.log_text()
    ((args, env),) = mail_site.fallback_calls()
    assert args == ["-s", SUBJECT, "sgtest1"]
    names = {ln.split("=", 1)[0] for ln in env}
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in env
    assert names - {"PATH", "PWD", "SHLVL", "_"} <= {n for n in names if n.startswith("SLURM_")}
    assert "SLURM_JOB_MAIL_TYPE=Began" in env


def test_group_writable_config_is_refused(mail_site: Site, tmp_path: Path) -> None:
    """The wrapper's configuration must be one no other account can write."""
    marker = tmp_path / "pwned"
    evil = _script(tmp_path / "evil.sh", f"#!/bin/sh\nid > {marker}\n")
    text = mail_site.config.read_text().replace(
        str(mail_site.root / "hooks" / "fallback-mail"), str(evil)
    )
    mail_site.config.write_text(text)
    mail_site.config.chmod(0o664)
    mail_site.call("sgtest1")
    assert not marker.exists()
    assert "configuration refused" in mail_site.log_text()


# ------------------------------------------------------- class 5: cwd and environment


@pytest.mark.parametrize("via", ["cwd", "PYTHONPATH"])
def test_planted_package_is_not_imported(mail_site: Site, tmp_path: Path, via: str) -> None:
    planted = tmp_path / "var-tmp"
    pkg = planted / "slurm_gpu"
    (pkg / "cli").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "mail_cmd.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (planted / "matplotlibrc").write_text("backend: nonexistent_backend\n")
    extra = {"PYTHONPATH": str(planted), "MPLCONFIGDIR": str(planted), "HOME": str(planted)}
    proc = mail_site.call(
        "sgtest1",
        extra_env=extra if via == "PYTHONPATH" else {},
        cwd=planted if via == "cwd" else None,
    )
    assert not marker.exists()
    assert proc.returncode == 0, mail_site.log_text()
    assert len(mail_site.fallback_calls()) == 1  # the real mail program ran


# ----------------------------------------------------------- class 7: one waiting process


def test_burst_of_end_mails_leaves_one_waiting_process(mail_site: Site) -> None:
    """50 END mails while accounting hangs: one process waits, and every mail is handled."""
    mail_site.hold.touch()  # the stand-in sacct waits for the gate
    jobs = [str(5000 + i) for i in range(50)]
    for job_id in jobs:
        proc = mail_site.call("sgtest1", mail_type="Ended", job_id=job_id)
        assert proc.returncode == 0, mail_site.log_text()
    waiting = _mail_programs(mail_site.config)
    mail_site.gate.touch()
    assert len(waiting) <= 1, f"{len(waiting)} mail programs wait at once"
    # Accounting fails for all of them, so each goes to the site's mail program, once.
    _wait_until(lambda: len(mail_site.fallback_calls()) >= 50, what="50 fallback mails")
    _wait_until(lambda: not _mail_programs(mail_site.config), what="the drainer to exit")
    got = sorted(
        args[1].split()[1].removeprefix("Job_id=") for args, _ in mail_site.fallback_calls()
    )
    assert got == jobs
    mail_site.assert_only_slurm_calls()


# ----------------------------------------------------------- class 10: private mail state


def test_mail_state_is_private(mail_site: Site) -> None:
    mail_site.call("sgtest1", mail_type="Ended", job_id="6001")
    _wait_until(lambda: len(mail_site.fallback_calls()) == 1, what="the fallback mail")
    _wait_until(lambda: not _mail_programs(mail_site.config), what="the drainer to exit")
    db = mail_site.state / "mail-state.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for f in mail_site.state.iterdir():
        assert not f.stat().st_mode & 0o077, f


def test_mail_state_is_narrowed_and_never_a_link(tmp_path: Path) -> None:
    from slurm_gpu.errors import StoreError
    from slurm_gpu.notify.state import MailState

    old = tmp_path / "old.db"
    old.touch()
    old.chmod(0o644)
    MailState(str(old)).close()
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    target = tmp_path / "elsewhere"
    link = tmp_path / "link.db"
    link.symlink_to(target)
    with pytest.raises(StoreError):
        MailState(str(link))
    assert not target.exists()
