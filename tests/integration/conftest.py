"""Fixtures for the tests that run against the local Slurm test cluster.

Every test here is marked ``cluster``. The session fixture ``cluster`` (autouse) makes sure the
cluster runs, starting or updating it with ``share/testcluster/start`` as needed; when that is
impossible the tests fail, they are not skipped. Helpers live in ``slurmtools``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmtools


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session", autouse=True)
def cluster() -> None:
    """The running test cluster; fails the session's cluster tests if it cannot be started."""
    try:
        slurmtools.ensure_cluster()
    except (slurmtools.ClusterError, OSError) as exc:
        pytest.fail(f"the local Slurm test cluster is not usable: {exc}", pytrace=False)


@pytest.fixture
def job_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory owned by sgtest1 for job scripts and output (removed afterwards)."""
    path = slurmtools.user_dir("sgtest1")
    yield path
    shutil.rmtree(path, ignore_errors=True)
