"""XID events of a MIG GPU pile up where nobody reads them (issue 27, point 7).

NVML delivers XID events per physical GPU. A MIG job's sampler reads only its own slices,
yet every event was also queued on the parent GPU and on the other tenants' slices, which it
never reads, so never cleared: after 50 readings with 11 events each, 550 on the parent and
500 on the other slice, for as long as the job runs (a tenant that makes XIDs grows every
other tenant's sampler), and handed in one burst to whoever read them next. Driven through
the fake ``libnvidia-ml.so.1`` (``tests/nvmlfake``) with the real pynvml.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvmlfake.driver import Clock, FakeDriver

from slurm_gpu.telemetry.nvml import NvmlSource

PARENT = "GPU-a1a1a1a1-0000-0000-0000-000000000000"
SLICE_1 = "MIG-11111111-0000-0000-0000-000000000000"
SLICE_2 = "MIG-22222222-0000-0000-0000-000000000000"
READINGS = 50


@pytest.fixture
def mig(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeDriver, NvmlSource, Clock]]:
    clock = Clock(1_700_000_000.0)
    drv = FakeDriver("r535_129_h100_mig")
    drv.install(pynvml)
    monkeypatch.setattr(pynvml, "nvmlLib", drv.lib)
    clock.attach(drv)
    yield drv, NvmlSource(clock=clock, wall_clock=clock), clock
    pynvml._nvmlGetFunctionPointer_cache.clear()


def _storm(drv: FakeDriver) -> None:
    """One reading's worth: ten whole-GPU XIDs and one of the other tenant's slice."""
    for _ in range(10):
        drv.xid(PARENT, 79)
    drv.xid(PARENT, 43, gi=2, ci=0)


def _pending(src: NvmlSource, uuid: str) -> int:
    return len(src._devices[uuid].pending_xids)


def test_xids_of_other_tenants_and_the_parent_do_not_pile_up_in_a_mig_job(
    mig: tuple[FakeDriver, NvmlSource, Clock],
) -> None:
    drv, src, clock = mig
    src.sample([SLICE_1])
    for _ in range(READINGS):
        _storm(drv)
        (s,) = src.sample([SLICE_1])
        assert s.xid_events == (79,) * 10  # its own: the whole-GPU ones, each reading
        clock.advance(10)
    assert _pending(src, PARENT) == 0, "the parent GPU kept every event"
    assert _pending(src, SLICE_2) == 0, "the other tenant's slice kept every event"


def test_a_slice_read_later_gets_no_backlog_of_events_from_before(
    mig: tuple[FakeDriver, NvmlSource, Clock],
) -> None:
    """Variant: the other tenant's slice (or the parent) is read later by the same source
    (another job's sampler after a reuse): it gets the events from its first reading on,
    not the whole backlog."""
    drv, src, clock = mig
    src.sample([SLICE_1])
    for _ in range(READINGS):
        _storm(drv)
        src.sample([SLICE_1])
        clock.advance(10)
    two, parent = src.sample([SLICE_2, PARENT])
    assert two.xid_events == () and parent.xid_events == ()
    _storm(drv)
    two, parent = src.sample([SLICE_2, PARENT])
    assert two.xid_events == (79,) * 10 + (43,)
    assert parent.xid_events == (79,) * 10 + (43,)
