"""The spool's emptied job directories are removed on a thread of their own (``tidy``): the
collector's thread does not wait for the disk, and the spool is the same when the pass ends."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_job
from test_collector import Env, env  # noqa: F401 (the fixture)

from slurm_gpu.collector import tidy
from slurm_gpu.collector.tidy import DirRemover


def test_removes_empty_directories_and_leaves_the_others(tmp_path: Path) -> None:
    for name in ("1", "2", "3"):
        (tmp_path / name).mkdir()
    (tmp_path / "2" / "node2.record").write_text("arriving")
    (tmp_path / "target").mkdir()
    (tmp_path / "4").symlink_to(tmp_path / "target")
    remover = DirRemover(str(tmp_path))
    for name in ("1", "2", "4", "missing", "..", "a/b"):
        remover.remove(name)
    remover.close()  # returns once every queued name was handled
    assert remover.removed == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "3", "4", "target"]
    assert (tmp_path / "target").is_dir()  # a symlink is never followed
    remover.remove("3")  # usable again after close: a new thread
    remover.close()
    assert not (tmp_path / "3").exists()
    remover.close()  # nothing queued: returns at once


def test_an_unusable_parent_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    remover = DirRemover(str(tmp_path / "gone"))
    remover.remove("1")
    remover.close()
    assert remover.removed == 0
    assert "spool job directories not removed" in caplog.text


def test_the_pass_removes_job_directories_off_its_own_thread(
    env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(3):
        env.add_job(make_job(str(500 + i)), "node1")
    threads: list[str] = []
    real_rmdir = os.rmdir

    def rmdir(path: str, *, dir_fd: int | None = None) -> None:
        threads.append(threading.current_thread().name)
        real_rmdir(path, dir_fd=dir_fd)

    monkeypatch.setattr(tidy.os, "rmdir", rmdir)
    report = env.run()
    assert sorted(report.ingested) == ["500", "501", "502"]  # type: ignore[attr-defined]
    # When run_once returns, the directories are gone, removed by the remover's thread.
    assert not any((env.spool_dir / str(500 + i)).exists() for i in range(3))
    assert threads == ["spool-tidy"] * 3


def test_a_batch_s_records_are_let_go_once_it_is_stored(
    env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass keeps each batch's records only while it stores that batch: the heap that the
    pass's full garbage collections scan stays one batch large, not the whole pass."""
    import gc

    from slurm_gpu.records import NodeRecord

    ours = {str(600 + i) for i in range(6)}
    for i in range(6):
        env.add_job(make_job(str(600 + i)), "node1")
    alive: list[int] = []
    real = env.accounting.get_jobs

    def get_jobs(ids: list[str]) -> object:
        gc.collect()
        alive.append(sum(1 for o in gc.get_objects() if type(o) is NodeRecord and o.job_id in ours))
        return real(ids)

    monkeypatch.setattr(env.accounting, "get_jobs", get_jobs)
    report = env.run(batch_size=2)
    assert len(report.ingested) == 6  # type: ignore[attr-defined]
    # At each query: the batch just read (two records), none of the batches stored before.
    assert alive == [2, 2, 2]
