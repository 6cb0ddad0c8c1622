"""``gpueff`` asks accounting before it imports its report code (``jobreport.early``): for an
ordinary user's id that no rendered report answers (a running job, the newest job before its
collection, another user's job), the console script starts ``sacct`` as soon as the report
file is found missing, and the full command uses that answer instead of asking again."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from sacct_fixtures import parse_rows, recorded_rows, write_fake_sacct

from slurm_gpu.errors import AccountingError
from slurm_gpu.jobreport.early import EarlyAccounting, queries_for
from slurm_gpu.records import JobRecord
from slurm_gpu.store import Store

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "sacct" / "contract_jobs.txt"
JOBS = parse_rows(recorded_rows(RECORDED)).jobs


class CountingSource:
    """An accounting source that answers from the recorded jobs and counts its questions;
    ``gate``: the first question waits for it (so a test can ask while it is pending)."""

    name = "counting"

    def __init__(self, gate: threading.Event | None = None, error: Exception | None = None):
        self.asked: list[list[str]] = []
        self.gate = gate
        self.error = error

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.asked.append(list(job_ids))
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return {j: JOBS[j] for j in job_ids if j in JOBS}

    def jobs_between(self, *args: object) -> list[JobRecord]:
        raise AssertionError("not asked early")


def test_the_early_answer_is_the_answer_and_asked_once() -> None:
    gate = threading.Event()
    source = CountingSource(gate)
    early = EarlyAccounting(source, queries_for(["2", "2"]))
    gate.set()
    assert early.get_jobs(["2"]) == {"2": JOBS["2"]}
    assert source.asked == [["2"]]


def test_other_ids_are_asked_afresh() -> None:
    source = CountingSource()
    early = EarlyAccounting(source, ["2"])
    assert early.get_jobs(["2", "3"]) == {j: JOBS[j] for j in ("2", "3") if j in JOBS}
    assert source.asked == [["2"], ["2", "3"]]


def test_an_early_error_is_raised_where_the_answer_is_taken() -> None:
    early = EarlyAccounting(CountingSource(error=AccountingError("sacct failed (exit 1)")), ["2"])
    with pytest.raises(AccountingError, match="sacct failed"):
        early.get_jobs(["2"])


def test_queries_are_what_start_lookup_asks() -> None:
    assert queries_for(["7", "1234_3", "7", "1234+0"]) == ["7", "1234_3", "1234+0"]


#: A squeue (beside the fake sacct, where gpueff looks for it) that shows job 2 running, each
#: field ended by the delimiter its ``--Format`` asked for.
RUNNING_SQUEUE = f"""#!{sys.executable}
import sys
fmt = next(a for a in sys.argv if a.startswith("--Format="))
d = fmt.removeprefix("--Format=JobID:0").split(",")[0]
values = ["2", "2", "2", "N/A", "N/A", "N/A", "RUNNING", "node1", "1700000000", "1700000000",
          "alice", "1000", "physics", "gpu", "8", "cpu=8,mem=64G,node=1,gres/gpu=1", "1:00:00",
          "5:00", "live-job"]
print("".join(v + d for v in values))
"""


def _probe(
    tmp_path: Path, uid: int, squeue: str | None = None, job: str = "2"
) -> dict[str, object]:
    """Run the console script for job 2 as ``uid`` in a fresh interpreter, with a sacct that
    logs each call (and, given, the ``squeue`` script beside it); report the exit code, the
    sacct calls, whether the report code was imported when accounting was first asked, and
    whether click was imported at all."""
    if squeue is not None:
        (tmp_path / "squeue").write_text(squeue)
        (tmp_path / "squeue").chmod(0o755)
    log = tmp_path / "sacct.log"
    real = write_fake_sacct(tmp_path, recorded_rows(RECORDED))
    sacct = tmp_path / "logging-sacct"
    sacct.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    sacct.chmod(0o755)
    # An empty store: the collector has not stored job 2 yet.
    Store.open(f"sqlite:///{tmp_path / 'slurm-gpu.db'}").close()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nstate_dir = "{tmp_path}"\nspool_dir = "{tmp_path / "spool"}"\n'
        f'[accounting]\nsacct_path = "{sacct}"\n[gpueff]\nmin_elapsed_s = 0\n'
    )
    probe = (
        "import json, os, sys\n"
        f"os.getuid = lambda: {uid}\n"
        "from slurm_gpu.jobreport import early\n"
        "seen = []\n"
        "real_start = early.start\n"
        "def start(settings, ids):\n"
        "    seen.append('slurm_gpu.jobreport.output' in sys.modules)\n"
        "    return real_start(settings, ids)\n"
        "early.start = start\n"
        "from slurm_gpu.cli import gpueff_entry\n"
        "from slurm_gpu.cli.gpueff_entry import main\n"
        # The entry leaves with os._exit; the probe needs the code and to go on.
        "gpueff_entry._leave = sys.exit\n"
        f"sys.argv = ['gpueff', '--config', {str(cfg)!r}, {job!r}]\n"
        "code = 0\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('PROBE ' + json.dumps({'code': code, 'report_code_imported': seen,"
        " 'click': 'click' in sys.modules}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
    )
    result: dict[str, object] = json.loads(proc.stdout.rsplit("PROBE ", 1)[1])
    result["stdout"] = proc.stdout + proc.stderr
    result["stderr"] = proc.stderr
    result["calls"] = log.read_text().splitlines() if log.exists() else []
    return result


def test_an_ordinary_user_asks_once_before_the_report_code_is_imported(tmp_path: Path) -> None:
    result = _probe(tmp_path, uid=54321)
    assert result["code"] == 0, result["stdout"]
    assert 'Job 2 "gpu1"' in str(result["stdout"])
    assert result["report_code_imported"] == [False]
    calls = result["calls"]
    assert isinstance(calls, list)
    # One accounting query and one text query: the full command did not ask again.
    assert len(calls) == 2, calls
    assert sum("--allocations" in c for c in calls) == 1


def test_root_does_not_ask_early(tmp_path: Path) -> None:
    """Root's own cached or stored answers come from the store: no speculative sacct."""
    result = _probe(tmp_path, uid=0)
    assert result["code"] == 0, result["stdout"]
    assert result["report_code_imported"] == []
    assert len(result["calls"]) == 2  # type: ignore[arg-type]


def test_a_running_job_is_answered_by_the_controller_without_sacct_or_click(
    tmp_path: Path,
) -> None:
    result = _probe(tmp_path, uid=54321, squeue=RUNNING_SQUEUE)
    assert result["code"] == 0, result["stdout"]
    assert 'Job 2 "live-job"  RUNNING' in str(result["stdout"])
    assert result["calls"] == [] and result["click"] is False


def test_an_id_accounting_does_not_return_is_refused_as_the_full_command_refuses_it(
    tmp_path: Path,
) -> None:
    """Another user's job under PrivateData (or no such job): exit 4 and the full command's
    two lines, without importing click (the answer came early; nothing else is needed)."""
    result = _probe(tmp_path, uid=54321, job="999999")
    assert result["code"] == 4, result["stdout"]
    assert result["stderr"] == (
        "gpueff: job 999999 not found\nhint: check the id; accounting shows you only your own "
        "jobs (and those of accounts you coordinate), and forgets jobs after the site's "
        "retention period\n"
    )
    assert len(result["calls"]) == 2 and result["click"] is False  # type: ignore[arg-type]
