"""Accounting that user strings cannot forge (security review, class 3).

sacct ``--parsable2`` has no quoting: a job's owner can put the delimiter and a newline into
the working directory (``sbatch -D``), the job name or the comment, and sacct prints it raw.
The attacks below are built exactly as sacct prints them, through the injected command-runner
seam: the runner answers each call in the fields and with the delimiter that call asks for,
and the attacker's strings are written against that very call (an attacker who knows the
field list and, in the worst case, the delimiter).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import FakeAccounting, make_job, make_node

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import SacctSource
from slurm_gpu.capture import spool
from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.store import Store

#: What an attacker's string is: fixed text, or text built for one sacct call from the
#: delimiter and the field list that call asks for.
Value = str | Callable[[str, Sequence[str]], str]

#: A finished job as sacct 22.05 prints it; every field either query may ask for.
BASE: dict[str, str] = {
    "JobIDRaw": "100",
    "JobID": "100",
    "State": "COMPLETED",
    "ExitCode": "0:0",
    "DerivedExitCode": "0:0",
    "User": "sgtest2",
    "UID": "1002",
    "Account": "physics",
    "Partition": "gpu",
    "QOS": "normal",
    "AllocCPUS": "2",
    "NNodes": "1",
    "ReqMem": "1000M",
    "AllocTRES": "billing=2,cpu=2,gres/gpu=2,mem=1000M,node=1",
    "ReqTRES": "billing=2,cpu=2,gres/gpu=2,mem=1000M,node=1",
    "MaxRSS": "",
    "TotalCPU": "00:01.500",
    "ElapsedRaw": "12",
    "Elapsed": "00:00:12",
    "TimelimitRaw": "10",
    "Timelimit": "00:10:00",
    "Submit": "1795000000",
    "Start": "1795000001",
    "End": "1795000013",
    "NodeList": "vm",
    "JobName": "victim-training",
    "Comment": "",
    "AdminComment": "",
    "NTasks": "",
    "Reason": "None",
    "SubmitLine": "",
    "WorkDir": "/home/sgtest2/run",
}


def job(**fields: Value) -> dict[str, Value]:
    out: dict[str, Value] = dict(BASE)
    out.update(fields)
    return out


def attacker(job_id: str, **fields: Value) -> dict[str, Value]:
    return job(JobIDRaw=job_id, JobID=job_id, User="sgtest1", UID="1001", **fields)


def forged_line(victim: str, delim: str, fields: Sequence[str], **values: str) -> str:
    """A whole record for ``victim`` in the asked fields, owned by the attacker."""
    forged = {**BASE, "JobIDRaw": victim, "JobID": victim, "User": "sgtest1", "UID": "1001"}
    forged.update(values)
    return delim.join(forged[f] for f in fields)


class SacctLike:
    """Prints ``rows`` as sacct does for each call: the ``--format`` fields joined by the
    ``--delimiter``, one line per record, steps left out with ``--allocations``, no quoting."""

    def __init__(self, rows: Sequence[Mapping[str, Value]]) -> None:
        self.rows = rows
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        fields = next(a for a in argv if a.startswith("--format=")).split("=", 1)[1].split(",")
        delim = next(a for a in argv if a.startswith("--delimiter=")).split("=", 1)[1]
        lines = []
        for r in self.rows:
            if "--allocations" in argv and "." in str(r["JobIDRaw"]):
                continue
            values = [v(delim, fields) if callable(v) else v for v in (r[f] for f in fields)]
            lines.append(delim.join(values) + "\n")
        return CommandResult(0, "".join(lines).encode(), "")


def test_workdir_with_delimiter_and_newline_cannot_replace_another_jobs_record() -> None:
    """The issue's attack: the attacker's working directory ends its own record early and
    the rest parses as a later run of the victim's job, which "the last run wins" took."""

    def workdir(delim: str, fields: Sequence[str]) -> str:
        forged = forged_line(
            "100", delim, fields, State="FAILED", NodeList="n[0-9]", AllocTRES="gres/gpu=8"
        )
        return f"/tmp/x{delim}200\n{forged}\n200"

    rows = [job(), attacker("200", WorkDir=workdir)]
    jobs = SacctSource(runner=SacctLike(rows)).get_jobs(["100", "200"])
    victim = jobs["100"]
    assert (victim.user, victim.uid) == ("sgtest2", 1002)
    assert (victim.state, victim.nodelist, victim.alloc_tres.gpus) == ("COMPLETED", ("vm",), 2)
    assert victim.restarts == 0
    assert (jobs["200"].user, jobs["200"].uid) == ("sgtest1", 1001)


def test_strings_that_swallow_the_victims_record_cannot_forge_its_name_or_owner() -> None:
    """Two attacker jobs around the victim's: the first ends early and prints a forged victim
    record, then opens a record whose end the second job's name supplies, swallowing the real
    victim record in between. The attacker is even assumed to know the delimiter of the call
    (it is random for the text query, so this needs a race with /proc)."""

    def workdir(delim: str, fields: Sequence[str]) -> str:
        forged = forged_line("250", delim, fields, JobName="FORGED", WorkDir="/forged")
        return f"/tmp/x{delim}200\n{forged}\n999{delim}swallow"

    def name(delim: str, fields: Sequence[str]) -> str:
        return f"n{delim}999\n300{delim}n2"

    rows = [
        attacker("200", WorkDir=workdir),
        job(JobIDRaw="250", JobID="250"),
        attacker("300", JobName=name),
    ]
    source = SacctSource(runner=SacctLike(rows))
    victim = source.get_jobs(["200", "250", "300"])["250"]
    assert (victim.user, victim.uid, victim.state) == ("sgtest2", 1002, "COMPLETED")
    assert victim.job_name != "FORGED" and victim.work_dir != "/forged"


def test_node_list_that_expands_to_a_hundred_million_hosts_fails_only_that_job(
    tmp_path: Path,
) -> None:
    """``n[0-9999][0-9999]`` is 10^8 names. It must be refused for that job alone, quickly
    and in little memory: the parse runs in a child limited to 1 GiB of address space."""
    rows = [
        {**BASE, "JobIDRaw": "300", "JobID": "300", "NodeList": "n[0-9999][0-9999]"},
        {**BASE, "JobIDRaw": "301", "JobID": "301"},
    ]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    child = (
        "import json, sys\n"
        "from slurm_gpu.accounting.sacct import DELIM, FIELDS, parse_sacct_output\n"
        f"rows = json.load(open({str(tmp_path / 'rows.json')!r}))\n"
        "out = ''.join(DELIM.join(r[f] for f in FIELDS) + '\\n' for r in rows)\n"
        "jobs = parse_sacct_output(out).jobs\n"
        "print(json.dumps({k: list(v.nodelist) for k, v in jobs.items()}))\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (60, 60))

    proc = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"301": ["vm"]}


@pytest.fixture
def collector_env(tmp_path: Path) -> tuple[Path, Path, str]:
    return tmp_path / "spool", tmp_path / "state", f"sqlite:///{tmp_path}/state/store.db"


def _collect(
    env: tuple[Path, Path, str], accounting: FakeAccounting, job_id: str
) -> tuple[object, bool, list[Path]]:
    spool_dir, state_dir, url = env
    with Store.open(url) as store:
        report = Collector(
            store=store,
            accounting=accounting,
            spool_dir=str(spool_dir),
            state_dir=str(state_dir),
            options=CollectorOptions(),
            clock=lambda: 1_700_000_130.0,
        ).run_once(job_id, missing_pass=False)
        stored = store.get_job(job_id) is not None
    quarantine = state_dir / "quarantine"
    return report, stored, sorted(quarantine.iterdir()) if quarantine.exists() else []


def _seal(spool_dir: Path, job_id: str, host: str, uid: int) -> None:
    record = dataclasses.replace(make_node(job_id, host), uid=uid)
    js = spool.JobSpool(str(spool_dir), job_id, host)
    js.create_dir()
    spool.write_record(js.record, record)


def test_accounting_with_another_owner_than_the_sealed_record_is_quarantined(
    collector_env: tuple[Path, Path, str],
) -> None:
    """The record was sealed for uid 1001 (SLURM_JOB_UID); accounting says 1002 owns the
    job. Stored, the telemetry would be shown to the wrong user."""
    accounting = FakeAccounting({"500": make_job("500")})  # uid 1001 in accounting ...
    _seal(collector_env[0], "500", "node1", uid=2002)  # ... 2002 in the sealed record
    report, stored, quarantined = _collect(collector_env, accounting, "500")
    assert not stored
    assert "500" in getattr(report, "accounting_mismatch", ())
    reasons = [p.read_text() for p in quarantined if p.name.endswith(".reason")]
    assert len(reasons) == 1 and "uid 2002" in reasons[0] and "uid 1001" in reasons[0]


def test_accounting_whose_node_list_lacks_the_records_host_is_quarantined(
    collector_env: tuple[Path, Path, str],
) -> None:
    accounting = FakeAccounting({"501": make_job("501", nodes=("node7",))})
    _seal(collector_env[0], "501", "node1", uid=1001)
    report, stored, quarantined = _collect(collector_env, accounting, "501")
    assert not stored
    assert "501" in getattr(report, "accounting_mismatch", ())
    assert any("not in accounting's node list" in p.read_text() for p in quarantined)


def test_record_of_an_earlier_run_on_another_node_does_not_block_the_job(
    collector_env: tuple[Path, Path, str],
) -> None:
    """Not an attack: the cross-check must not keep a requeued job out of the store because
    its first run sealed a record on a node its last run did not use. That record (it ended
    before the last run started) is quarantined alone; the job is stored."""
    job = dataclasses.replace(make_job("502", nodes=("node2",)), start_s=1_700_000_050.0)
    accounting = FakeAccounting({"502": job})
    spool_dir = collector_env[0]
    _seal(spool_dir, "502", "node2", uid=1001)  # this run: ends at 1_700_000_100
    early = dataclasses.replace(make_node("502", "node1"), ended_s=1_700_000_020.0)
    js = spool.JobSpool(str(spool_dir), "502", "node1")
    spool.write_record(js.record, early)
    report, stored, quarantined = _collect(collector_env, accounting, "502")
    assert stored and getattr(report, "accounting_mismatch", None) == ()
    assert [p.name for p in quarantined if not p.name.endswith(".reason")] == ["502.node1.record"]
