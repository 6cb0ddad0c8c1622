"""Fixtures for the tests that run against the local Slurm test cluster.

Every test here is marked ``cluster``. The session fixture ``cluster`` (autouse) makes sure the
cluster runs, starting or updating it with ``share/testcluster/start`` as needed; when that is
impossible the tests fail, they are not skipped. Helpers live in ``slurmtools``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


# One pytest session at a time owns the test cluster: a second one (another checkout, another
# terminal) waits here instead of restarting the cluster under the first one's jobs.
OWNER_LOCK = Path(os.environ.get("SLURM_GPU_TC_LOCK", "/run/lock/slurm-gpu-testcluster.lock"))


@pytest.fixture(scope="session", autouse=True)
def cluster() -> Iterator[None]:
    """The running test cluster, owned by this session; fails its tests if it cannot start.

    ``SLURM_GPU_TC_NO_START=1`` uses the cluster as it runs (never started, updated or
    restarted here): its tests only need slurmctld to answer."""
    OWNER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with OWNER_LOCK.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"\nwaiting for {OWNER_LOCK}: another session owns the cluster", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.environ.get("SLURM_GPU_TC_NO_START") != "1":
            try:
                slurmtools.ensure_cluster()
            except (slurmtools.ClusterError, OSError) as exc:
                pytest.fail(f"the local Slurm test cluster is not usable: {exc}", pytrace=False)
        if not slurmtools.controller_up():
            pytest.fail("the local Slurm test cluster does not answer", pytrace=False)
        yield


@pytest.fixture
def job_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory owned by sgtest1 for job scripts and output (removed afterwards)."""
    path = slurmtools.user_dir("sgtest1")
    yield path
    shutil.rmtree(path, ignore_errors=True)
