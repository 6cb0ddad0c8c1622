"""Who sees what with a SQLite store: the file is not readable by ordinary users, and the
owner's report reaches them through a file the kernel lets only them open.

These tests run real processes under other uids (``nobody`` as a job's owner, ``daemon`` as
another user), so they need root; they use a directory under /tmp those users can traverse.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gpueff_factory as F
import pytest
from test_gpueff_owner import NeverAsked, _gpueff, _store

from slurm_gpu.config import load_settings
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.jobreport.reportcache import render_key
from slurm_gpu.jobreport.reportfiles import REPORT_MAX_BYTES, read_reports, reports_root
from slurm_gpu.jobreport.reportwriter import ReportFile, ReportFileWriter
from slurm_gpu.store import Store, open_store
from slurm_gpu.store.urls import readonly_uri

#: The job's owner and another ordinary user (real accounts of every Debian system).
OWNER, OWNER_GID = 65534, 65534  # nobody, nogroup
OTHER, OTHER_GID = 1, 1  # daemon, daemon
WORKTREE = str(Path(__file__).resolve().parents[2])

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as other uids")


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory other accounts can traverse (pytest's own are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sg-vis-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _config(base: Path, extra: str = "") -> Path:
    cfg = base / "config.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{base / "state"}"\n[gpueff]\nmin_elapsed_s = 30\n{extra}'
    )
    cfg.chmod(0o644)
    return cfg


def _as(uid: int, gid: int, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in an isolated interpreter as ``uid``:``gid`` (no other groups), importing
    this worktree's package."""
    prelude = f"import sys; sys.path.insert(0, {WORKTREE!r})\n"
    return subprocess.run(
        [sys.executable, "-I", "-c", prelude + code],
        user=uid,
        group=gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "LANG": "C.UTF-8"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _collected(base: Path, extra: str = "") -> Path:
    """A store written as the collector writes it, holding OWNER's job 1001, with its
    reports rendered; returns the config file."""
    cfg = _config(base, extra)
    settings = load_settings(str(cfg))
    with open_store(settings):
        pass
    _store(base / "state", F.job(uid=OWNER, user="nobody", job_name="secret-project"))
    files = ReportFileWriter(
        reports_root(settings.paths.state_dir, settings.gpueff.reports_dir),
        group_of={OWNER: OWNER_GID}.get,
    )
    with Store.open(settings.store_url) as store:
        assert ReportPrerenderer(settings, store, files=files).refresh() == (1, 1)
    return cfg


def _assert_store_closed_to(uid: int, gid: int, base: Path) -> None:
    db = base / "state" / "slurm-gpu.db"
    res = _as(uid, gid, f"open({str(db)!r}, 'rb').read(1)")
    assert res.returncode != 0 and "PermissionError" in res.stderr, "the store is open to them"


def _fast_path(cfg: Path, *args: str) -> str:
    return (
        "from slurm_gpu.cli.gpueff_entry import fast_path\n"
        f"out = fast_path({['--config', str(cfg), *args]!r})\n"
        "sys.stdout.write('NONE' if out is None else out)\n"
    )


def test_another_user_cannot_read_the_sqlite_store(base: Path) -> None:
    _collected(base)
    db = base / "state" / "slurm-gpu.db"
    query = (
        "import sqlite3\n"
        f"conn = sqlite3.connect({readonly_uri(str(db))!r}, uri=True)\n"
        "print(conn.execute('SELECT job_name FROM jobs').fetchall())\n"
    )
    for uid, gid in ((OTHER, OTHER_GID), (OWNER, OWNER_GID)):
        res = _as(uid, gid, query)
        assert res.returncode != 0 and "secret-project" not in res.stdout, res.stdout
        assert "unable to open" in res.stderr
        listing = _as(uid, gid, f"import os; print(os.listdir({str(base / 'state')!r}))")
        assert listing.returncode != 0 and "PermissionError" in listing.stderr
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE((base / "state").stat().st_mode) == 0o700


def test_an_admin_group_reads_the_store_and_an_old_world_readable_one_is_narrowed(
    base: Path,
) -> None:
    state = base / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    db = state / "slurm-gpu.db"
    sqlite3.connect(db).close()
    db.chmod(0o644)  # as an earlier release left it under the usual umask
    _collected(base, '[store]\nadmin_group = "daemon"\n')
    assert (stat.S_IMODE(db.stat().st_mode), db.stat().st_gid) == (0o640, OTHER_GID)
    assert (stat.S_IMODE(state.stat().st_mode), state.stat().st_gid) == (0o750, OTHER_GID)
    query = (
        "import sqlite3\n"
        f"conn = sqlite3.connect({readonly_uri(str(db))!r}, uri=True)\n"
        "print(conn.execute('SELECT job_name FROM jobs').fetchall())\n"
    )
    assert "secret-project" in _as(OTHER, OTHER_GID, query).stdout  # a member of admin_group
    assert _as(OWNER, OWNER_GID, query).returncode != 0  # not a member


@pytest.mark.parametrize("args", [("1001",), ("--json", "1001")])
def test_the_owner_gets_their_report_while_the_store_is_closed_to_them(
    base: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    cfg = _collected(base)
    _assert_store_closed_to(OWNER, OWNER_GID, base)
    res = _as(OWNER, OWNER_GID, _fast_path(cfg, *args))
    assert res.returncode == 0, res.stderr
    full = _gpueff(base / "state", monkeypatch, NeverAsked(), OWNER, *args)
    assert full.exit_code == 0, full.output
    assert res.stdout == full.output
    if args[0] == "--json":
        assert json.loads(res.stdout)["jobs"][0]["job_name"] == "secret-project"


def test_another_user_cannot_open_the_owners_report(base: Path) -> None:
    cfg = _collected(base)
    settings = load_settings(str(cfg))
    root = Path(reports_root(settings.paths.state_dir, settings.gpueff.reports_dir))
    report = root / str(OWNER) / "1001.report"
    st = report.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o440, 0, OWNER_GID)
    assert stat.S_IMODE((root / str(OWNER)).stat().st_mode) == 0o750
    assert stat.S_IMODE(root.stat().st_mode) == 0o711
    res = _as(OTHER, OTHER_GID, f"print(open({str(report)!r}).read())")
    assert res.returncode != 0 and "PermissionError" in res.stderr
    assert "secret-project" not in res.stdout
    listing = _as(OTHER, OTHER_GID, f"import os; print(os.listdir({str(root)!r}))")
    assert listing.returncode != 0 and "PermissionError" in listing.stderr
    # gpueff as the other user finds no report of its own and leaves the id to accounting.
    assert _as(OTHER, OTHER_GID, _fast_path(cfg, "1001")).stdout == "NONE"


def _report(uid: int, typed: str = "1001", key: str = "k") -> ReportFile:
    return ReportFile(uid, typed, key, "plain\n", "colour\n", {"job_id": typed}, 1)


def test_a_user_whose_primary_group_is_shared_gets_no_report_file(tmp_path: Path) -> None:
    # nobody's primary group is nogroup, shared by name with no one but not its own: the
    # group bits would open the file to every member, so nothing is written.
    writer = ReportFileWriter(str(tmp_path / "reports"))
    assert writer.write([_report(OWNER)]) == 0
    assert not (tmp_path / "reports" / str(OWNER)).exists()


def test_an_oversized_or_linked_report_file_is_not_read(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    writer = ReportFileWriter(str(root), group_of=lambda uid: os.getgid())
    assert writer.write([_report(OWNER), _report(OWNER, "1002")]) == 2
    assert read_reports(str(root), OWNER, ["1001", "1002"], "k") is not None
    assert read_reports(str(root), OWNER, ["1001"], "other key") is None
    big = root / str(OWNER) / "1002.report"
    big.chmod(0o600)
    big.write_bytes(b" " * (REPORT_MAX_BYTES + 1))
    assert read_reports(str(root), OWNER, ["1002"], "k") is None
    big.unlink()
    big.symlink_to(root / str(OWNER) / "1001.report")
    assert read_reports(str(root), OWNER, ["1002"], "k") is None
    assert read_reports(str(root), OWNER, ["../1001"], "k") is None


def test_the_fast_path_key_is_the_renderers(base: Path) -> None:
    # A report rendered under other templates or settings is not printed (gpueff renders).
    cfg = _collected(base)
    settings = load_settings(str(cfg))
    root = reports_root(settings.paths.state_dir, settings.gpueff.reports_dir)
    assert read_reports(root, OWNER, ["1001"], render_key(settings.gpueff)) is not None
    other = load_settings(str(_config(base, "")))  # same file: same key
    assert render_key(other.gpueff) == render_key(settings.gpueff)
    changed = _config(base).read_text().replace("min_elapsed_s = 30", "min_elapsed_s = 31")
    (base / "config.toml").write_text(changed)
    assert _as(OWNER, OWNER_GID, _fast_path(base / "config.toml", "1001")).stdout == "NONE"


_FULL_COMMAND = """
sys.path.insert(0, {tests!r})
import gpueff_factory as F
from click.testing import CliRunner
from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.config import load_settings
from slurm_gpu.jobreport.readers import make_reader

job = F.job(uid={uid}, user="nobody", job_name="secret-project")

class Accounting:
    name = "fake"
    def get_jobs(self, ids):
        return {{job.job_id: job}}
    def jobs_between(self, start_s, end_s, users=None):
        return [job]

settings = load_settings({cfg!r})
res = CliRunner().invoke(
    cli,
    {args!r},
    obj={{BACKENDS_KEY: (Accounting(), make_reader(settings)), CALLER_UID_KEY: {uid}}},
)
sys.stdout.write(res.output)
sys.exit(res.exit_code)
"""


@pytest.mark.parametrize(
    "args",
    [("--user", "nobody", "--since", "3650d"), ("1001",), ("--json", "--user", "nobody")],
)
def test_the_owners_full_gpueff_reads_their_report_file_when_the_store_is_closed(
    base: Path, args: tuple[str, ...]
) -> None:
    # Listings and every id that asks accounting (arrays, the full command's options) need
    # the GPU part of each job: from the owner's report file, never from the store.
    from test_gpueff_owner import AsCaller

    from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
    from slurm_gpu.jobreport.readers import StoreAndSpoolReader

    cfg = _collected(base)
    _assert_store_closed_to(OWNER, OWNER_GID, base)
    argv = ["--config", str(cfg), "--no-color", *args]
    code = _FULL_COMMAND.format(
        tests=str(Path(__file__).parent), uid=OWNER, cfg=str(cfg), args=argv
    )
    res = _as(OWNER, OWNER_GID, code)
    assert res.returncode == 0, res.stdout + res.stderr
    from click.testing import CliRunner

    job = F.job(uid=OWNER, user="nobody", job_name="secret-project")
    reader = StoreAndSpoolReader(load_settings(str(cfg)))  # root: reads the store
    full = CliRunner().invoke(
        cli, argv, obj={BACKENDS_KEY: (AsCaller([job], OWNER), reader), CALLER_UID_KEY: OWNER}
    )
    assert full.exit_code == 0, full.output
    assert res.stdout == full.output
    assert "secret-project" in res.stdout


def test_a_store_closed_to_the_user_is_a_store_error_not_a_missing_store(base: Path) -> None:
    cfg = _collected(base)
    db = base / "state" / "slurm-gpu.db"
    code = (
        "from slurm_gpu.errors import StoreError, StoreNotCreatedError\n"
        "from slurm_gpu.store.sqlite_reader import SqliteReader\n"
        f"try:\n    SqliteReader.open({str(db)!r})\n"
        "except StoreNotCreatedError:\n    print('not created')\n"
        "except StoreError as e:\n    print('store error', e.hint)\n"
    )
    res = _as(OTHER, OTHER_GID, code)
    assert res.stdout.startswith("store error") and "report files" in res.stdout
    assert cfg.exists()


def test_after_an_upgrade_the_owner_still_gets_their_job_from_an_outdated_report_file(
    base: Path,
) -> None:
    # Seen on the test cluster after an upgrade: the report file's render key was an older
    # release's, so its text is not printed, and the owner, who cannot read the store, got a
    # store error instead of their job. The numbers in the file are still the job's.
    cfg = _collected(base)
    settings = load_settings(str(cfg))
    root = reports_root(settings.paths.state_dir, settings.gpueff.reports_dir)
    path = Path(root) / str(OWNER) / "1001.report"
    body = json.loads(path.read_text())
    body["render_key"] = "1-00000000deadbeef-0"  # rendered by another release
    path.chmod(0o640)
    path.write_text(json.dumps(body))
    path.chmod(0o440)
    _assert_store_closed_to(OWNER, OWNER_GID, base)
    assert _as(OWNER, OWNER_GID, _fast_path(cfg, "1001")).stdout == "NONE"  # text not used
    argv = ["--config", str(cfg), "--no-color", "1001"]
    code = _FULL_COMMAND.format(
        tests=str(Path(__file__).parent), uid=OWNER, cfg=str(cfg), args=argv
    )
    res = _as(OWNER, OWNER_GID, code)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'Job 1001 "secret-project"' in res.stdout and "% busy" in res.stdout
