"""The EpilogSlurmctld queue: what root takes from it, the drainer's batch loop, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.capture import spool
from slurm_gpu.cli.admin import cli
from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.collector.jobqueue import JobQueue, drain
from slurm_gpu.errors import ConfigError
from slurm_gpu.store import Store

REPO = Path(__file__).resolve().parents[2]
END = 1_700_000_100.0


def _queue(tmp_path: Path, *names: str) -> Path:
    q = tmp_path / "queue"
    q.mkdir(mode=0o700)
    for name in names:
        (q / name).touch()
    return q


def test_take_removes_decimal_names_only_and_never_follows_an_entry(tmp_path: Path) -> None:
    q = _queue(tmp_path, "12", "3", "abc", "4x", ".drain.lock", "0012")
    target = tmp_path / "target"
    target.write_text("keep")
    (q / "77").symlink_to(target)  # removed as a link; its target is untouched
    (q / "88").mkdir()  # a directory is left alone

    assert JobQueue(str(q)).take() == ["3", "12", "77"]

    assert sorted(p.name for p in q.iterdir()) == [".drain.lock", "0012", "4x", "88", "abc"]
    assert target.read_text() == "keep"
    assert JobQueue(str(q)).take() == []


def test_take_is_bounded_per_look(tmp_path: Path) -> None:
    q = _queue(tmp_path, *(str(i) for i in range(1, 51)))
    first = JobQueue(str(q), max_take=20).take()
    assert len(first) == 20
    rest = JobQueue(str(q), max_take=100).take()
    assert sorted(first + rest, key=int) == [str(i) for i in range(1, 51)]


def test_missing_queue_is_empty_and_a_symlinked_or_exposed_one_is_refused(tmp_path: Path) -> None:
    assert JobQueue(str(tmp_path / "none")).take() == []
    real = _queue(tmp_path, "5")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError, match="symlink is never followed"):
        JobQueue(str(tmp_path / "link")).take()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "queue").mkdir()
    (shared / "queue" / "6").touch()
    with pytest.raises(ConfigError, match="writable by group or others"):
        JobQueue(str(shared / "queue")).take()
    assert (shared / "queue" / "6").exists()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_drain_collects_the_queue_as_one_batch_and_drops_jobs_without_a_record(
    tmp_path: Path,
) -> None:
    q = _queue(tmp_path, "10", "11", "12")
    spool_dir = tmp_path / "spool"
    acc = FakeAccounting()
    for jid in ("10", "12"):
        acc.jobs[jid] = make_job(jid)
        js = spool.JobSpool(str(spool_dir), jid, "node1")
        js.create_dir()
        spool.write_record(js.record, make_node(jid, "node1"))
    acc.jobs["11"] = make_job("11", gpus=0)  # CPU-only: never a record
    clock = _Clock()
    calls: list[frozenset[str]] = []
    with Store.open(f"sqlite:///{tmp_path}/state/store.db") as store:
        collector = Collector(
            store=store,
            accounting=acc,
            spool_dir=str(spool_dir),
            state_dir=str(tmp_path / "state"),
            options=CollectorOptions(),
            clock=lambda: END + 30,
        )

        def collect(ids: frozenset[str]) -> tuple[str, ...]:
            calls.append(ids)
            return collector.run_once(only=ids, missing_pass=False).ingested

        report = drain(JobQueue(str(q)), collect, wait_s=12, clock=clock, sleep=clock.sleep)
        assert store.get_job("10") is not None and store.get_job("12") is not None

    assert report.stored == ("10", "12")
    assert report.dropped == ("11",)
    assert calls[0] == frozenset({"10", "11", "12"})  # one batch, not one pass per job
    assert all(c == frozenset({"11"}) for c in calls[1:])
    assert len(calls) == 4  # passes at 0, 5 and 10 s; 11 dropped after the one at 15 s
    assert list(q.iterdir()) == []


def test_drain_waits_while_another_collector_holds_the_lock(tmp_path: Path) -> None:
    q = _queue(tmp_path, "20")
    clock = _Clock()
    answers = iter([None, None, ("20",)])
    report = drain(
        JobQueue(str(q)), lambda ids: next(answers), wait_s=60, clock=clock, sleep=clock.sleep
    )
    assert report.stored == ("20",) and report.passes == 3


def _config(tmp_path: Path, queue: Path, extra: str = "") -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'queue_dir = "{queue}"\n[store]\nurl = "sqlite:///{tmp_path}/db/store.db"\n'
        f"[collector]\nqueue_wait_s = 0\n{extra}"
    )
    return cfg


def test_collect_queue_cli_drains_and_exits(tmp_path: Path) -> None:
    q = _queue(tmp_path, "30", "31")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path, q)), "collect", "--queue"])
    assert result.exit_code == 0, result.output
    assert "queue drained: 0 stored, 2 left to the timer (1 passes)" in result.output
    assert list(q.iterdir()) == []


def test_collect_queue_and_job_exclude_each_other(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    cfg = _config(tmp_path, q)
    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--queue", "--job", "5"])
    assert result.exit_code == 2 and "exclude each other" in result.output


def test_a_full_pass_empties_the_queue(tmp_path: Path) -> None:
    q = _queue(tmp_path, "40", "41")
    cfg = _config(tmp_path, q)
    result = CliRunner().invoke(cli, ["--config", str(cfg), "collect", "--once", "--no-missing"])
    assert result.exit_code == 0, result.output
    assert list(q.iterdir()) == []


@pytest.mark.parametrize(
    "bad", ["../../etc/x", "12 3", "1" * 21, "", "\u0661\u0662", "7\n8", "007", "-1"]
)
def test_epilog_slurmctld_queues_only_raw_job_ids(tmp_path: Path, bad: str) -> None:
    q = _queue(tmp_path)
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_GPU_BIN": "/bin/true",
        "SLURM_GPU_QUEUE_DIR": str(q),
        "SLURM_GPU_COLLECT_LOG": "/dev/null",
        "SLURM_JOB_ID": bad,
    }
    script = REPO / "share" / "slurm" / "epilog-slurmctld.sh"
    proc = subprocess.run(["/bin/sh", str(script)], env=env, check=False)
    assert proc.returncode == 0
    assert [p.name for p in q.iterdir()] == []
