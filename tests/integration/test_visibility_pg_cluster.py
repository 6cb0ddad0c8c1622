"""Who sees what with a PostgreSQL store on the real test cluster: users connect as themselves
(peer authentication on the server's socket, as on a site's login nodes), row-level security
shows each role only the rows Slurm would show it, and only the collector's role writes.

sgtest1 runs a demo GPU job; the collector (root, role ``root``) stores it in a database of
the local PostgreSQL (``share/testpg``) and ``slurm-gpu store sync-roles`` copies Slurm's
``PrivateData``, admins and coordinators into it. sgtest2 then tries the ``psql`` client and
Python against sgtest1's job; the owner gets it through ``gpueff``; an account coordinator and
root see it; with ``PrivateData`` off (slurm.conf changed and restored) everybody does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import postgres_url

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "share" / "demo"
JOB_NAME = "pgvis-secret-name"
PG_RUN = "/var/lib/slurm-gpu-testpg/run"
PG_PORT = "15432"


def _psql_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))
    if not found:
        pytest.fail("PostgreSQL's psql is not installed (make deps)", pytrace=False)
    return found[-1]


def _superuser(sql: str, db: str = "postgres") -> str:
    """Run ``sql`` as the ``postgres`` superuser over the socket (peer authentication)."""
    argv = [_psql_bin(), "-h", PG_RUN, "-p", PG_PORT, "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1"]
    return slurmtools.run_as("postgres", [*argv, "-c", sql], cwd="/").stdout


def _psql(user: str, db: str, sql: str) -> subprocess.CompletedProcess[str]:
    """``sql`` through the ``psql`` client as the OS user ``user`` (their own role)."""
    argv = [_psql_bin(), "-h", PG_RUN, "-p", PG_PORT, "-d", db, "-XAtq", "-c", sql]
    return slurmtools.run_as(user, argv, check=False)


class PgCluster:
    """The database, the configuration that names it, and how to run our commands with it."""

    def __init__(self, db: str, config: Path) -> None:
        self.db = db
        self.config = config

    def cli(
        self, user: str, tool: str, *args: str, timeout_s: float = 90.0
    ) -> subprocess.CompletedProcess[str]:
        exe = slurmtools.venv_python().parent / tool
        return slurmtools.run_as(
            user, [str(exe), "--config", str(self.config), *args], check=False, timeout_s=timeout_s
        )

    def sync_roles(self) -> None:
        res = self.cli("root", "slurm-gpu", "store", "sync-roles")
        assert res.returncode == 0, res.stderr


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    postgres_url()  # starts the server if needed
    db = f"sgvis_{secrets.token_hex(4)}"
    for role in ("root", "sgtest1", "sgtest2"):
        if _superuser(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").strip() != "1":
            _superuser(f"CREATE ROLE {role} LOGIN")
    _superuser(f"CREATE DATABASE {db} OWNER root")
    base = slurmtools.slurm_gpu_config_path().read_text()
    url = f"postgresql+psycopg:///{db}?host={PG_RUN}&port={PG_PORT}"
    # The cluster's configuration with the store moved to PostgreSQL: same spool, state and
    # analysis settings (its [store] table names no url: SQLite under state_dir).
    text, n = re.subn(r"(?m)^\[store\]\n(url = .*\n)?", f'[store]\nurl = "{url}"\n', base, count=1)
    assert n == 1, "the cluster's slurm-gpu.toml has no [store] table"
    out = slurmtools.tc_root() / "test-output" / f"pgvis-{os.getpid()}"
    out.mkdir(mode=0o755, parents=True, exist_ok=True)
    config = out / "slurm-gpu.toml"
    config.write_text(text)
    config.chmod(0o644)
    try:
        yield PgCluster(db, config)
    finally:
        _superuser(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        config.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def stored_job(pg: PgCluster) -> str:
    export = (
        f"--export=ALL,SLURM_GPU_PYTHON={slurmtools.venv_python()},"
        f"SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}"
    )
    out = slurmtools.user_dir("sgtest1")
    job_id = slurmtools.submit(
        str(DEMO / "idle-gpu.sbatch"),
        "sgtest1",
        (export, f"--chdir={out}", f"--job-name={JOB_NAME}"),
    )
    slurmtools.wait_done(job_id, timeout_s=180)
    res = pg.cli("root", "slurm-gpu", "collect", "--job", job_id, "--wait", "60")
    assert res.returncode == 0, res.stdout + res.stderr
    pg.sync_roles()
    return job_id


def _rows(pg: PgCluster, user: str, job_id: str) -> subprocess.CompletedProcess[str]:
    return _psql(user, pg.db, f"SELECT job_id, job_name FROM jobs WHERE job_id = '{job_id}'")


def test_another_user_reads_no_row_of_the_job_with_psql(pg: PgCluster, stored_job: str) -> None:
    res = _rows(pg, "sgtest2", stored_job)
    assert res.returncode == 0, res.stderr  # the query runs: the rows are not there for them
    assert res.stdout.strip() == "" and JOB_NAME not in res.stdout
    for table in ("job_hosts", "job_gpus", "timelines", "findings", "job_reports"):
        other = _psql(
            "sgtest2", pg.db, f"SELECT count(*) FROM {table} WHERE job_id = '{stored_job}'"
        )
        assert other.stdout.strip() == "0", (table, other.stdout, other.stderr)


def test_another_user_reads_no_row_with_python(pg: PgCluster, stored_job: str) -> None:
    code = (
        "import psycopg\n"
        f"c = psycopg.connect(host='{PG_RUN}', port={PG_PORT}, dbname='{pg.db}')\n"
        "print(c.execute('SELECT job_name FROM jobs').fetchall())\n"
    )
    res = slurmtools.run_as(
        "sgtest2", [str(slurmtools.venv_python()), "-I", "-c", code], check=False
    )
    assert res.returncode == 0, res.stderr
    assert JOB_NAME not in res.stdout and res.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE jobs SET job_name = 'x'",
        "DELETE FROM findings",
        "INSERT INTO visibility (role_name, admin) VALUES (current_user, true)",
        "ALTER TABLE jobs DISABLE ROW LEVEL SECURITY",
    ],
)
def test_no_user_can_write_or_widen_what_they_see(pg: PgCluster, stored_job: str, sql: str) -> None:
    res = _psql("sgtest2", pg.db, sql)
    assert res.returncode != 0 and re.search(r"permission denied|must be owner", res.stderr), res
    assert _rows(pg, "sgtest1", stored_job).stdout.count(JOB_NAME) == 1


def test_the_owner_gets_the_job_from_gpueff_and_psql(pg: PgCluster, stored_job: str) -> None:
    assert JOB_NAME in _rows(pg, "sgtest1", stored_job).stdout
    res = pg.cli("sgtest1", "gpueff", stored_job)
    assert res.returncode == 0, res.stderr
    assert f"Job {stored_job}" in res.stdout and JOB_NAME in res.stdout
    as_json = pg.cli("sgtest1", "gpueff", "--json", stored_job)
    assert as_json.returncode == 0, as_json.stderr
    (job,) = json.loads(as_json.stdout)["jobs"]
    assert job["job_id"] == stored_job and job["telemetry"] == "final"


def test_another_user_gets_not_found_from_gpueff(pg: PgCluster, stored_job: str) -> None:
    res = pg.cli("sgtest2", "gpueff", stored_job)
    assert res.returncode == 4, res.stdout + res.stderr
    assert JOB_NAME not in res.stdout


def test_root_sees_everything(pg: PgCluster, stored_job: str) -> None:
    assert JOB_NAME in _rows(pg, "root", stored_job).stdout
    assert pg.cli("root", "gpueff", stored_job).returncode == 0


def test_an_account_coordinator_sees_the_accounts_jobs(pg: PgCluster, stored_job: str) -> None:
    # sgtest2 is a member of physics (sgtest1's account); made its coordinator, Slurm shows
    # them the account's jobs, and so does the store after the next sync.
    add = ["sacctmgr", "-i", "add", "coordinator", "account=physics", "names=sgtest2"]
    remove = ["sacctmgr", "-i", "remove", "coordinator", "account=physics", "names=sgtest2"]
    slurmtools.run_as(None, add)
    try:
        pg.sync_roles()
        assert JOB_NAME in _rows(pg, "sgtest2", stored_job).stdout
        res = pg.cli("sgtest2", "gpueff", stored_job)
        assert res.returncode == 0 and JOB_NAME in res.stdout, res.stdout + res.stderr
    finally:
        slurmtools.run_as(None, remove, check=False)
        pg.sync_roles()
    assert _rows(pg, "sgtest2", stored_job).stdout.strip() == ""


def _set_private_data(confs: dict[Path, str], on: bool) -> None:
    """Write slurm.conf and slurmdbd.conf with or without their ``PrivateData`` line (as
    they were when ``on``), and make slurmctld and slurmdbd read them again."""
    for path, text in confs.items():
        path.write_text(text if on else re.sub(r"(?m)^PrivateData=.*\n", "", text))
    slurmtools.run_as(None, ["scontrol", "reconfigure"])
    slurmtools.run_as(None, ["sacctmgr", "-i", "reconfigure"])


def test_with_private_data_off_every_user_sees_the_job(pg: PgCluster, stored_job: str) -> None:
    # sacct asks slurmdbd: its PrivateData decides what users see of finished jobs, so both
    # files lose the line (and get it back).
    shown = slurmtools.run_as(None, ["scontrol", "show", "config"]).stdout
    conf = Path(re.search(r"(?m)^SLURM_CONF\s*=\s*(\S+)", shown).group(1))  # type: ignore[union-attr]
    confs = {p: p.read_text() for p in (conf, conf.parent / "slurmdbd.conf")}
    assert all(re.search(r"(?m)^PrivateData=jobs", t) for t in confs.values())
    try:
        _set_private_data(confs, on=False)
        pg.sync_roles()
        assert JOB_NAME in _rows(pg, "sgtest2", stored_job).stdout
        res = pg.cli("sgtest2", "gpueff", stored_job)
        assert res.returncode == 0 and JOB_NAME in res.stdout, res.stdout + res.stderr
    finally:
        _set_private_data(confs, on=True)
        pg.sync_roles()
    assert _rows(pg, "sgtest2", stored_job).stdout.strip() == ""
