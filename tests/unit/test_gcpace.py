"""``gcpace.fewer_collections``: the collector's pass raises the young GC threshold and puts
the thresholds back."""

from __future__ import annotations

import gc
import pathlib
from collections.abc import Iterator

import pytest

from slurm_gpu.gcpace import PASS_THRESHOLD, fewer_collections


@pytest.fixture(autouse=True)
def _thresholds() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()
        else:
            gc.disable()


def test_raises_the_young_threshold_and_restores_all_three() -> None:
    with fewer_collections():
        assert gc.get_threshold() == (PASS_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), fewer_collections(5000):
        assert gc.get_threshold()[0] == 5000
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_already_set_is_kept() -> None:
    gc.set_threshold(50_000, 3, 4)
    with fewer_collections(10_000):
        assert gc.get_threshold() == (50_000, 3, 4)
    assert gc.get_threshold() == (50_000, 3, 4)


@pytest.mark.parametrize("off", ["disabled", "zero threshold"])
def test_nothing_changes_where_automatic_collection_is_off(off: str) -> None:
    if off == "disabled":
        gc.disable()
    else:
        gc.set_threshold(0, 10, 10)
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before
    assert gc.isenabled() is (off != "disabled")


def test_the_collectors_pass_runs_under_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    from slurm_gpu.collector import collector as collector_mod

    seen: list[tuple[int, int, int]] = []

    def fake_run(self: object, wanted: object, *, missing_pass: bool) -> object:
        seen.append(gc.get_threshold())
        return collector_mod.CollectReport()

    monkeypatch.setattr(collector_mod.Collector, "_run", fake_run)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    c = collector_mod.Collector(
        store=None,  # type: ignore[arg-type]
        accounting=None,  # type: ignore[arg-type]
        spool_dir=str(tmp_path / "spool"),
        state_dir=str(state),
    )
    c.run_once(missing_pass=False)
    assert seen == [(PASS_THRESHOLD, 10, 10)]
    assert gc.get_threshold() == (700, 10, 10)


def test_the_live_policys_pass_runs_under_it(tmp_path: pathlib.Path) -> None:
    """A pass over 10,000 running jobs holds 71,500 Prometheus samples while it builds the
    jobs' windows: at the default thresholds a third or more of its CPU went to collections
    (``docs/performance.md``)."""
    from slurm_gpu.accounting.runner import CommandResult
    from slurm_gpu.live.police import PoliceOptions, run_pass
    from slurm_gpu.live.policy import PolicyConfig
    from slurm_gpu.store import Store

    seen: list[tuple[int, int, int]] = []

    def load_windows() -> list[object]:
        seen.append(gc.get_threshold())
        return []

    def runner(argv: object, *, env: object, timeout_s: float) -> CommandResult:
        seen.append(gc.get_threshold())
        return CommandResult(0, b"", "")

    store = Store.open(f"sqlite:///{tmp_path}/store.db")
    opts = PoliceOptions("/usr/bin", 10.0, "example.org", "slurm-gpu@example.org", ())
    result = run_pass(load_windows, runner, store.engine, None, PolicyConfig(), opts, 1e9)
    assert result.done == ()
    assert seen and set(seen) == {(PASS_THRESHOLD, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_the_live_views_jobs_are_built_under_it() -> None:
    """The view over every running job (``slurm-gpu live``) holds all of Prometheus' answers
    while it builds the jobs: at 10,000 jobs about a quarter of its CPU went to collections."""
    from slurm_gpu.prometheus.livejobs import live_jobs

    seen: list[tuple[int, int, int]] = []

    class Client:
        def query(self, expr: str, at_s: float | None = None) -> list[object]:
            seen.append(gc.get_threshold())
            return []

    assert live_jobs(Client()) == []  # type: ignore[arg-type]
    assert seen and set(seen) == {(PASS_THRESHOLD, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_the_weekly_reports_scans_run_under_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """The weekly report folds a week's rows in chunks while two other readers run: at the
    default thresholds 0.52 s of a 100,000-job week's aggregation went to collections."""
    from slurm_gpu.store import Store
    from slurm_gpu.weekly import aggregate
    from slurm_gpu.weekly.model import Period

    seen: list[tuple[int, int, int]] = []
    scan = aggregate.scan

    def watched(*args: object, **kwargs: object) -> None:
        seen.append(gc.get_threshold())
        scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aggregate, "scan", watched)
    store = Store.open(f"sqlite:///{tmp_path}/store.db")
    report = aggregate.build_report(store.engine, Period(0.0, 7 * 86400.0))
    assert report.headline.jobs == 0
    assert len(seen) == 2 and set(seen) == {(PASS_THRESHOLD, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)
