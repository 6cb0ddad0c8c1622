"""Run one demo job per store back end on the local test cluster, for ``bench_gpueff.py``.

Usage (as root, holding the cluster: ``flock /run/lock/slurm-gpu-testcluster.lock ...``)::

    python benchmarks/prepare_gpueff_stores.py [--user sgtest1]

Submits ``share/demo/idle-gpu.sbatch`` twice as ``--user`` and collects one job into the
cluster's SQLite store (its own configuration) and the other into a PostgreSQL database of the
local test server (``share/testpg``), which users reach as themselves (peer authentication on
its socket, roles named after them) under row-level security, after ``store sync-roles``. It
writes that database's configuration next to the cluster's and prints, per back end, the
``bench_gpueff.py`` command to run.
"""

from __future__ import annotations

import argparse
import glob
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TC_ROOT = Path("/var/lib/slurm-gpu-testcluster")
PG_RUN = "/var/lib/slurm-gpu-testpg/run"
PG_PORT = "15432"
DB = "sgbench"
VENV_BIN = Path(sys.executable).parent


def _run(argv: list[str], user: str | None = None) -> str:
    full = ["runuser", "-u", user, "--", *argv] if user else argv
    return subprocess.run(full, capture_output=True, text=True, check=True, cwd="/").stdout


def _superuser(sql: str, db: str = "postgres") -> str:
    psql = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))[-1]
    return _run([psql, "-h", PG_RUN, "-p", PG_PORT, "-d", db, "-XAtq", "-c", sql], "postgres")


def _job(user: str, config: Path) -> str:
    out = TC_ROOT / "test-output" / f"bench-{user}-{time.monotonic_ns()}"
    out.mkdir(mode=0o755, parents=True)
    _run(["chown", user, str(out)])
    job = _run(
        [
            "sbatch",
            "--parsable",
            f"--chdir={out}",
            f"--export=ALL,SLURM_GPU_PYTHON={VENV_BIN / 'python'},"
            f"SLURM_GPU_CONFIG={TC_ROOT / 'slurm-gpu.toml'}",
            str(REPO / "share" / "demo" / "idle-gpu.sbatch"),
        ],
        user,
    ).strip()
    while _run(["squeue", "-h", "-j", job]).strip():
        time.sleep(2)
    time.sleep(3)
    slurm_gpu = str(VENV_BIN / "slurm-gpu")
    _run([slurm_gpu, "--config", str(config), "collect", "--job", job, "--wait", "60"])
    return job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--user", default="sgtest1")
    args = ap.parse_args()
    _run([str(REPO / "share" / "testpg" / "start")])
    for role in ("root", args.user, "sgtest2"):
        if _superuser(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").strip() != "1":
            _superuser(f"CREATE ROLE {role} LOGIN")
    _superuser(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    _superuser(f"CREATE DATABASE {DB} OWNER root")
    base = (TC_ROOT / "slurm-gpu.toml").read_text()
    url = f"postgresql+psycopg:///{DB}?host={PG_RUN}&port={PG_PORT}"
    pg_config = TC_ROOT / "bench-pg.toml"
    pg_config.write_text(re.sub(r"(?m)^\[store\]\n", f'[store]\nurl = "{url}"\n', base, count=1))
    pg_config.chmod(0o644)
    sqlite_job = _job(args.user, TC_ROOT / "slurm-gpu.toml")
    pg_job = _job(args.user, pg_config)
    _run([str(VENV_BIN / "slurm-gpu"), "--config", str(pg_config), "store", "sync-roles"])
    bench = f"{VENV_BIN / 'python'} {REPO / 'benchmarks' / 'bench_gpueff.py'}"
    sqlite_config = TC_ROOT / "slurm-gpu.toml"
    print(f"sqlite: {bench} --job {sqlite_job} --user {args.user} --config {sqlite_config}")
    print(f"postgresql: {bench} --job {pg_job} --user {args.user} --config {pg_config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
