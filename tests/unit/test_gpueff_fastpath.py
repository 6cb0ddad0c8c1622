"""gpueff's fast path: accounting and the store read overlap, nothing is shown before
accounting answered, no heavy module is imported, and ordinary users read a SQLite store that
the collector is writing."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner
from sacct_fixtures import parse_rows, recorded_rows, write_fake_sacct

from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import JobNotFoundError
from slurm_gpu.jobreport import service
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.records import JobRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "sacct" / "contract_jobs.txt"
HEAVY = ("sqlalchemy", "pandas", "matplotlib", "pynvml", "slurm_gpu.analysis.engine")


@dataclasses.dataclass(frozen=True)
class _Finding:
    code: str
    severity: str
    cause: int | None
    evidence: dict[str, Any]
    subject: str | None = None


class CallerAccounting:
    """Answers like sacct for one calling user: other users' jobs are invisible. With
    ``wait_for``, ``get_jobs`` waits for that event first (and notes whether it came)."""

    name = "fake"

    def __init__(
        self, jobs: Sequence[JobRecord], caller: str, wait_for: threading.Event | None = None
    ) -> None:
        self.jobs = list(jobs)
        self.caller = caller
        self.wait_for = wait_for
        self.event_came: bool | None = None

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        if self.wait_for is not None:
            self.event_came = self.wait_for.wait(timeout=30)
        return {j.job_id: j for j in self.jobs if j.user == self.caller and j.job_id in job_ids}

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        if self.wait_for is not None:
            self.event_came = self.wait_for.wait(timeout=30)
        return [j for j in self.jobs if j.user == self.caller and (not users or j.user in users)]


class WatchedReader(StoreAndSpoolReader):
    """The real reader, noting what it read ahead and signalling when it did."""

    def __init__(self, settings: Any, done: threading.Event | None = None) -> None:
        super().__init__(settings)
        self.done = done
        self.read_ahead: list[str] = []

    def _keep(self, stored: Sequence[Any]) -> None:
        self.read_ahead += [s.job.job_id for s in stored]
        super()._keep(stored)
        if self.done is not None:
            self.done.set()


def _settings(state_dir: Path, **extra: Any) -> Any:
    return parse_settings(
        {"paths": {"state_dir": str(state_dir), "spool_dir": str(state_dir / "spool")}, **extra},
        path=None,
    )


def _store(state_dir: Path, *jobs: JobRecord) -> None:
    bundles = [
        JobBundle(
            job,
            (dataclasses.replace(F.node_record(), job_id=job.job_id),),
            TELEMETRY_COMPLETE,
            findings=(_Finding("GPU_UNUSED", "critical", 6, {}, "GPU-node1-0001"),),
            analysis_version="1",
        )
        for job in jobs
    ]
    with Store.open(_settings(state_dir).store_url) as store:
        store.write_batch(bundles, collected_at_s=1.0)


def test_the_store_is_read_while_accounting_answers(tmp_path: Path) -> None:
    job = F.job()
    _store(tmp_path, job)
    read = threading.Event()
    accounting = CallerAccounting([job], "sgtest1", wait_for=read)
    reader = WatchedReader(_settings(tmp_path), done=read)
    found = service.lookup(["1001"], accounting, reader, min_elapsed_s=30)
    # Accounting was still waiting when the store had been read: the two overlapped.
    assert accounting.event_came is True
    assert reader.read_ahead == ["1001"]
    ((typed, (report,)),) = found.groups
    assert typed == "1001" and report.telemetry.value == "final" and len(report.gpus) == 2


def test_recent_jobs_are_read_ahead_too(tmp_path: Path) -> None:
    jobs = [F.job(job_id=str(1001 + i), submit_s=1_700_000_000.0 + i) for i in range(3)]
    _store(tmp_path, *jobs)
    read = threading.Event()
    accounting = CallerAccounting(jobs, "sgtest1", wait_for=read)
    reader = WatchedReader(_settings(tmp_path), done=read)
    reports = service.recent(
        accounting,
        reader,
        user="sgtest1",
        since_s=1_600_000_000.0,
        until_s=1_800_000_000.0,
        min_elapsed_s=30,
        limit=2,
    )
    assert accounting.event_came is True
    assert sorted(reader.read_ahead) == ["1002", "1003"]
    assert [r.job_id for r in reports] == ["1003", "1002"]
    assert all(r.telemetry.value == "final" for r in reports)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_job_accounting_hides_is_read_ahead_but_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    theirs = F.job(user="sgtest2", uid=1002, job_name="secret-project-x")
    _store(tmp_path, theirs)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpueff]\nmin_elapsed_s = 30\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    reader = WatchedReader(_settings(tmp_path))
    accounting = CallerAccounting([theirs], caller="sgtest1")
    res = CliRunner().invoke(
        cli,
        ["--json", "1001"] if as_json else ["1001"],
        # As sgtest1 (uid 1001): root, whom Slurm shows every job, would see it.
        obj={BACKENDS_KEY: (accounting, reader), CALLER_UID_KEY: 1001},
        catch_exceptions=False,
    )
    assert reader.read_ahead == ["1001"]  # the store did hold it
    assert res.exit_code == JobNotFoundError.exit_code, res.output
    for secret in ("secret-project-x", "sgtest2", "GPU-node1", "never used", "80"):
        assert secret not in res.output
    assert "not found" in res.output


def _fake_sacct(directory: Path, *, marker: Path | None = None) -> Path:
    """A sacct that prints the recorded jobs in the fields each call asks for."""
    return write_fake_sacct(directory, recorded_rows(RECORDED), marker=marker)


def test_a_gpueff_run_over_a_sqlite_store_imports_nothing_heavy(tmp_path: Path) -> None:
    recorded = parse_rows(recorded_rows(RECORDED)).jobs["2"]
    _store(tmp_path, recorded)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path}"\nspool_dir = "{tmp_path / "spool"}"\n'
        f'[accounting]\nsacct_path = "{_fake_sacct(tmp_path)}"\n'
        "[gpueff]\nmin_elapsed_s = 0\n"
    )
    probe = (
        "import json, sys\n"
        "from slurm_gpu.cli.gpueff import main\n"
        f"sys.argv = ['gpueff', '--no-color', '--config', {str(cfg)!r}, '2']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('PROBE ' + json.dumps({'code': code, 'heavy': heavy}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    out = proc.stdout
    result = json.loads(out.rsplit("PROBE ", 1)[1])
    assert result["code"] == 0, out + proc.stderr
    assert 'Job 2 "gpu1"' in out and "node1:1" in out  # the stored GPUs were read and shown
    assert result["heavy"] == []


def test_the_owner_path_runs_no_sacct_and_imports_no_accounting_adapter(tmp_path: Path) -> None:
    """The caller's own settled job: no sacct process, no accounting adapter imported. The
    probe stands in for sgtest1 by replacing ``os.getuid`` (it runs as root here)."""
    recorded = parse_rows(recorded_rows(RECORDED)).jobs["2"]
    assert recorded.uid is not None and recorded.uid != 0
    _store(tmp_path, recorded)
    marker = tmp_path / "sacct-ran"
    sacct = _fake_sacct(tmp_path, marker=marker)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path}"\nspool_dir = "{tmp_path / "spool"}"\n'
        f'[accounting]\nsacct_path = "{sacct}"\n'
        "[gpueff]\nmin_elapsed_s = 0\n"
    )
    probe = (
        "import json, os, sys\n"
        f"os.getuid = lambda: {recorded.uid}\n"
        "from slurm_gpu.cli.gpueff import main\n"
        f"sys.argv = ['gpueff', '--no-color', '--config', {str(cfg)!r}, '2']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "mods = [m for m in sys.modules if m.startswith('slurm_gpu.accounting.')]\n"
        "print('PROBE ' + json.dumps({'code': code, 'accounting': sorted(mods)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    out = proc.stdout
    result = json.loads(out.rsplit("PROBE ", 1)[1])
    assert result["code"] == 0, out + proc.stderr
    assert 'Job 2 "gpu1"' in out and "node1:1" in out
    assert not marker.exists()
    # The id parser and the settled-state rule only; no sacct adapter, no subprocess runner.
    assert result["accounting"] == ["slurm_gpu.accounting.base", "slurm_gpu.accounting.jobids"]
    # The sacct path, for comparison: the same run as another uid does run sacct.
    other = probe.replace(f"lambda: {recorded.uid}", f"lambda: {recorded.uid + 1}")
    subprocess.run([sys.executable, "-c", other], capture_output=True, timeout=120, check=False)
    assert marker.exists()


# ----------------------------------------------------------------- ordinary users, live writer


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A world-traversable directory (pytest's own are private to their owner)."""
    path = Path(tempfile.mkdtemp(prefix="gpueff-shared-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


READER_LOOP = """
import sys
from slurm_gpu.jobreport.readers import open_store_reader
url, reads = sys.argv[1], int(sys.argv[2])
shapes = set()
for _ in range(reads):
    reader = open_store_reader(url)
    stored = reader.get_job("1001", timelines=True)
    reader.close()
    gpus = sum(len(n.gpus) for n in stored.nodes)
    # One consistent state: the job row and its GPU rows come from the same commit.
    assert gpus == stored.job.alloc_tres.gpus, (gpus, stored.job.alloc_tres.gpus)
    assert all(len(n.timeline[0].gpu_utilization_pct) == len(n.gpus) for n in stored.nodes)
    shapes.add(gpus)
print("SHAPES", sorted(shapes))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not _user_exists("sgtest1") or shutil.which("runuser") is None,
    reason="needs root, runuser and the test user sgtest1 (share/testcluster/start)",
)
def test_an_ordinary_user_reads_while_the_collector_commits(shared_dir: Path) -> None:
    """The store file is root's (0644, directory 0755): sgtest1 reads it through gpueff's
    reader while root rewrites the job in a loop, alternating 2 and 4 GPUs; every read
    succeeds and sees one whole commit."""
    from slurm_gpu.records import Tres

    two = F.job()
    four = dataclasses.replace(
        two, alloc_tres=Tres(cpus=8, nodes=1, gpus=4, gpu_types=(("a100", 4),), raw="x")
    )
    node2 = F.node_record()
    node4 = F.node_record(utils=([80.0] * 60, [0.0] * 60, [50.0] * 60, [10.0] * 60))
    url = _settings(shared_dir).store_url
    versions = [
        JobBundle(two, (node2,), TELEMETRY_COMPLETE),
        JobBundle(four, (node4,), TELEMETRY_COMPLETE),
    ]
    store = Store.open(url)
    store.write_batch(versions[:1], collected_at_s=0.0)
    db = shared_dir / "slurm-gpu.db"
    assert db.stat().st_mode & 0o777 == 0o644
    stop = threading.Event()
    commits = [0]
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            while not stop.is_set():
                store.write_batch([versions[commits[0] % 2]], collected_at_s=float(commits[0]))
                commits[0] += 1
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        proc = subprocess.run(
            ["runuser", "-u", "sgtest1", "--", sys.executable, "-c", READER_LOOP, url, "300"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd="/",
        )
    finally:
        stop.set()
        thread.join()
        store.close()
    assert not errors, errors
    assert proc.returncode == 0, proc.stderr
    # Both versions were seen, so reads really raced the commits.
    assert "SHAPES [2, 4]" in proc.stdout, proc.stdout
    assert commits[0] > 10
