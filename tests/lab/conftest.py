"""Fixtures for the tests that run on the version lab (Slurm 24.11 and 26.05, three compute
hosts each; share/testlab/start, docs/testcluster.md "The version lab").

Every test here is marked ``lab`` and runs after all other tests of the session. The session
fixture ``labs`` takes the lab's lock, builds what changed and starts both labs; when that is
impossible the tests fail, they are not skipped. ``lab`` gives each test one version's
``labtools.Lab``, parametrized over every version.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import labtools
import pytest

HERE = Path(__file__).parent


def _in_lab(item: pytest.Item) -> bool:
    return HERE in Path(str(item.fspath)).parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_lab(item):
            item.add_marker(pytest.mark.lab)
    # The lab takes minutes to build from nothing: run its tests after everything else.
    items.sort(key=_in_lab)


# One pytest session at a time owns the lab: a second one waits here instead of restarting the
# lab under the first one's jobs.
OWNER_LOCK = Path(os.environ.get("SLURM_GPU_LAB_LOCK", "/run/lock/slurm-gpu-lab.lock"))


@pytest.fixture(scope="session")
def labs() -> Iterator[dict[str, labtools.Lab]]:
    """Both labs, built and running, owned by this session."""
    OWNER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with OWNER_LOCK.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"\nwaiting for {OWNER_LOCK}: another session owns the lab", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.geteuid() != 0:
            pytest.fail("the version lab needs root (chroot, namespaces, daemons)", pytrace=False)
        try:
            labtools.ensure_labs()
        except (labtools.LabError, OSError) as exc:
            pytest.fail(f"the version lab is not usable: {exc}", pytrace=False)
        yield {v: labtools.Lab(v) for v in labtools.VERSIONS}


@pytest.fixture(params=sorted(labtools.VERSIONS))
def lab(request: pytest.FixtureRequest, labs: dict[str, labtools.Lab]) -> labtools.Lab:
    """One version's lab (the test runs once per version)."""
    return labs[request.param]
