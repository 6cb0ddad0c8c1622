"""The one drainer: waiting END/FAIL mails sent by one process, nothing lost when it dies."""

from __future__ import annotations

import os
from pathlib import Path

import gpueff_factory as F
import pytest
from click.testing import CliRunner
from test_mail import Clock, Inbox, Reader, notifier, smtp  # noqa: F401 - smtp is a fixture

from slurm_gpu.cli.mail_cmd import NOTIFIER_KEY, cli
from slurm_gpu.notify.drain import DrainLock, drain
from slurm_gpu.notify.service import NotifyOptions
from slurm_gpu.notify.state import Enqueued, MailState, PendingMail


def _pending(job_id: str, *, t: float = 1000.0) -> PendingMail:
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED"}
    return PendingMail(job_id, f"Slurm Job_id={job_id} Ended", "sgtest1@example.org", env, t)


def _jobs(n: int) -> list:  # type: ignore[type-arg]
    return [F.job(job_id=str(7000 + i), job_id_display=str(7000 + i)) for i in range(n)]


def test_one_drainer_sends_every_waiting_mail(smtp: tuple[Inbox, int], tmp_path: Path) -> None:  # noqa: F811
    inbox, port = smtp
    clock = Clock()
    opts = NotifyOptions(wait_for_record_s=30, poll_interval_s=3, max_per_user_per_window=100)
    n = notifier(port, _jobs(5), tmp_path, reader=Reader(after=2), clock=clock, opts=opts)
    for i in range(5):
        assert n.state.enqueue(_pending(str(7000 + i))) is Enqueued.ADDED
    assert n.state.enqueue(_pending("7000")) is Enqueued.DUPLICATE  # Slurm called again
    lock = DrainLock(str(tmp_path / "state"))
    handed_back: list[str] = []
    done = drain(
        n, lock, fallback=lambda p: handed_back.append(p.key), log=print, sleep=clock.sleep
    )
    assert done == 5 and handed_back == []
    assert sorted(r.message["X-Slurm-Job-Id"] for r in inbox.received) == [
        str(7000 + i) for i in range(5)
    ]
    assert n.state.pending() == [] and not lock.held


def test_waiting_mails_are_bounded(tmp_path: Path) -> None:
    state = MailState(str(tmp_path / "s.db"))
    assert state.enqueue(_pending("1"), max_pending=2) is Enqueued.ADDED
    assert state.enqueue(_pending("2"), max_pending=2) is Enqueued.ADDED
    assert state.enqueue(_pending("3"), max_pending=2) is Enqueued.FULL


def test_a_running_drainer_is_left_alone(tmp_path: Path) -> None:
    held = DrainLock(str(tmp_path))
    assert held.try_acquire()
    other = DrainLock(str(tmp_path))
    assert not other.try_acquire()
    held.release()
    assert other.try_acquire()
    assert os.stat(other.path).st_mode & 0o077 == 0


def test_mail_admitted_by_a_dead_drainer_is_still_sent(
    smtp: tuple[Inbox, int],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drainer died after burst control let the mail through: --flush sends it, once."""
    inbox, port = smtp
    n = notifier(port, [F.job()], tmp_path)
    n.state.enqueue(_pending("1001"))
    assert n.state.admit(
        "sgtest1",
        "sgtest1@example.org",
        "1001",
        now_s=1000.0,
        window_s=3600,
        max_per_window=3,
        pending_key="1001",
    )
    (row,) = n.state.pending()
    assert row.admitted_s == 1000.0

    def factory(settings: object, dry_run_dir: str | None) -> object:
        return n

    cfg = tmp_path / "config.toml"
    state = tmp_path / "state"
    cfg.write_text(f'[paths]\nstate_dir = "{state}"\n[mail]\nstate_dir = "{state}"\n')
    res = CliRunner().invoke(
        cli, ["--config", str(cfg), "--flush"], obj={NOTIFIER_KEY: factory}, catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    assert "1 waiting mail(s) handled" in res.output
    assert len(inbox.received) == 1 and n.state.pending() == []
