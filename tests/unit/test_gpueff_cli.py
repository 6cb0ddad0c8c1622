"""``gpueff`` through click's CliRunner, with accounting and telemetry faked at their seams."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import gpueff_factory as F
import jsonschema
import pytest
from click.testing import CliRunner, Result

from slurm_gpu.cli.gpueff import BACKENDS_KEY, cli
from slurm_gpu.errors import EXIT_CODES, AccountingError
from slurm_gpu.jobreport import adapter, output
from slurm_gpu.jobreport.jsonout import SCHEMA
from slurm_gpu.jobreport.model import FindingView, RecommendationView
from slurm_gpu.jobreport.service import Telemetry
from slurm_gpu.records import JobRecord, Tres

ANSI = re.compile(r"\x1b\[")


class FakeAccounting:
    """Answers like sacct for one calling user: other users' jobs are invisible."""

    name = "fake"

    def __init__(self, jobs: Sequence[JobRecord], caller: str = "sgtest1") -> None:
        self.jobs = list(jobs)
        self.caller = caller
        self.asked: list[list[str]] = []
        self.between: list[tuple[float, float, list[str] | None]] = []

    def _visible(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.user == self.caller]

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self.asked.append(list(job_ids))
        out = {}
        for j in self._visible():
            for q in job_ids:
                if q in (j.job_id, j.array_job_id, j.job_id_display):
                    out[j.job_id] = j
        return out

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        self.between.append((start_s, end_s, list(users) if users else None))
        return [j for j in self._visible() if users is None or j.user in users]


class BrokenAccounting(FakeAccounting):
    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        raise AccountingError("sacct failed: slurmdbd unreachable", hint="is slurmdbd running?")


class FakeReader:
    def __init__(
        self,
        final: dict[str, Telemetry] | None = None,
        live: dict[str, Telemetry] | None = None,
    ) -> None:
        self._final = final or {}
        self._live = live or {}
        self.read: list[str] = []

    def final(self, job: JobRecord) -> Telemetry | None:
        self.read.append(job.job_id)
        return self._final.get(job.job_id)

    def live(self, job: JobRecord) -> Telemetry | None:
        self.read.append(job.job_id)
        return self._live.get(job.job_id)


FINDING = FindingView(
    code="gpu_unused",
    severity="critical",
    cause=6,
    title="An allocated GPU was never used",
    text="GPU node1:1 ran no process during the whole job.",
    evidence=(("GPU", "node1:1"), ("mean duty cycle", "0 %")),
)
REC = RecommendationView(
    text="Ask for the GPUs the job uses.", sbatch_lines=("#SBATCH --gpus=1",), gpu_hours_saved=1.0
)


def telemetry(live: bool = False) -> Telemetry:
    return Telemetry(
        gpus=adapter.gpu_lines_from_records([F.node_record()]),
        live=live,
        updated_s=1_700_001_000.0 if live else None,
        findings=(FINDING,),
        recommendations=(REC,),
    )


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[gpueff]\nmin_elapsed_s = 30\n")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return cfg


def run(
    args: list[str],
    accounting: FakeAccounting,
    reader: FakeReader | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    return CliRunner().invoke(
        cli,
        args,
        obj={BACKENDS_KEY: (accounting, reader or FakeReader())},
        env=env,
        catch_exceptions=False,
    )


def test_completed_job_shows_header_gpus_findings_and_sbatch_lines() -> None:
    acc = FakeAccounting([F.job()])
    res = run(["1001"], acc, FakeReader(final={"1001": telemetry()}))
    assert res.exit_code == 0, res.output
    out = res.output
    assert 'Job 1001 "train-resnet"  COMPLETED (exit 0)' in out
    assert "account research" in out and "partition gpu" in out
    assert "elapsed 01:00:00 of 04:00:00 (25 % of the limit)" in out
    assert "node1:0" in out and "node1:1" in out
    assert "80 % busy" in out
    assert "no process ever ran on this GPU" in out
    assert "12 GiB / 40 GiB" in out
    assert "An allocated GPU was never used (cause 6)" in out
    assert "evidence: GPU node1:1, mean duty cycle 0 %" in out
    assert "#SBATCH --gpus=1" in out
    assert "final" in out and "LIVE" not in out
    # 2 GPUs x 1 h: GPU 0 never idle (80 %), GPU 1 never used: 1 GPU-hour idle.
    assert "2.00 allocated, 1.00 idle" in out
    assert "25 % efficiency" in out  # 2 h CPU over 8 cores x 1 h
    assert "4 GiB peak of 32 GiB requested (12 %)" in out
    assert not ANSI.search(out), "no colour when not on a terminal"
    assert acc.asked == [["1001"]]


def test_running_job_reads_live_spool_and_says_so() -> None:
    job = F.job(state="RUNNING", exit_code=None, end_s=None, elapsed_s=600)
    reader = FakeReader(live={"1001": telemetry(live=True)})
    res = run(["1001"], FakeAccounting([job]), reader)
    assert res.exit_code == 0, res.output
    assert "LIVE: the job is still running, numbers so far" in res.output
    assert "80 % busy" in res.output


def test_running_job_without_live_summary_shows_no_numbers() -> None:
    job = F.job(state="RUNNING", exit_code=None, end_s=None, elapsed_s=600)
    res = run(["1001"], FakeAccounting([job]), FakeReader())
    assert res.exit_code == 0
    assert "no live GPU summary is readable" in res.output
    assert "busy" not in res.output and "0 %" not in res.output.split("CPU")[0]


def test_job_without_gpu_says_so_and_never_reads_telemetry() -> None:
    job = F.job(alloc_tres=Tres(cpus=8, mem_bytes=F.GIB, nodes=1, gpus=0, raw="cpu=8"))
    reader = FakeReader(final={"1001": telemetry()})
    res = run(["1001"], FakeAccounting([job]), reader)
    assert res.exit_code == 0
    assert "GPUs: No GPU was allocated to this job." in res.output
    assert "busy" not in res.output
    assert "CPU  25 % efficiency" in res.output  # the accounting part is still there
    assert reader.read == []


def test_ended_gpu_job_without_stored_telemetry() -> None:
    res = run(["1001"], FakeAccounting([F.job()]), FakeReader())
    assert res.exit_code == 0
    assert "has not been collected yet" in res.output
    assert "% busy" not in res.output


def test_stored_record_without_gpus_is_no_telemetry() -> None:
    empty = Telemetry(gpus=(), live=False)
    res = run(["1001"], FakeAccounting([F.job()]), FakeReader(final={"1001": empty}))
    assert res.exit_code == 0
    assert "No GPU telemetry was recorded for this job." in res.output


def test_too_short_job_gets_one_line_not_zero_percent() -> None:
    job = F.job(elapsed_s=4, total_cpu_s=1.0)
    reader = FakeReader(final={"1001": telemetry()})
    res = run(["1001"], FakeAccounting([job]), reader)
    assert res.exit_code == 0
    assert "The job ran 4 s, too short for a GPU reading (at least 30 s needed)." in res.output
    assert "busy" not in res.output
    assert reader.read == []


def _array(n: int) -> list[JobRecord]:
    return [
        F.job(
            job_id=str(2000 + i),
            job_id_display=f"1999_{i}",
            array_job_id="1999",
            array_task_id=str(i),
            job_name="sweep",
        )
        for i in range(n)
    ]


def test_whole_array_is_a_table_of_tasks_in_task_order() -> None:
    tasks = _array(3)
    reader = FakeReader(final={"2001": telemetry()})
    res = run(["1999"], FakeAccounting(list(reversed(tasks))), reader)
    assert res.exit_code == 0, res.output
    assert "Array 1999: 3 tasks" in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("1999_")]
    assert [ln.split()[0] for ln in lines] == ["1999_0", "1999_1", "1999_2"]
    assert "40 %" in lines[1] and "not collected yet" in lines[0]


def test_one_array_task_gets_the_full_report() -> None:
    res = run(["1999_1"], FakeAccounting(_array(3)), FakeReader(final={"2001": telemetry()}))
    assert res.exit_code == 0, res.output
    assert 'Job 1999_1 "sweep"' in res.output
    assert "Array" not in res.output


def test_several_ids_give_several_reports() -> None:
    jobs = [F.job(), F.job(job_id="1002", job_id_display="1002", job_name="second")]
    res = run(["1001", "1002"], FakeAccounting(jobs), FakeReader())
    assert res.exit_code == 0
    assert 'Job 1001 "train-resnet"' in res.output and 'Job 1002 "second"' in res.output


def test_user_since_lists_recent_jobs_newest_first() -> None:
    jobs = [
        F.job(job_id="1001", job_id_display="1001", submit_s=1.0),
        F.job(job_id="1002", job_id_display="1002", submit_s=2.0, state="FAILED"),
    ]
    acc = FakeAccounting(jobs)
    res = run(["--user", "sgtest1", "--since", "2026-11-01"], acc, FakeReader())
    assert res.exit_code == 0, res.output
    rows = [ln.split()[0] for ln in res.output.splitlines()[1:]]
    assert rows == ["1002", "1001"]
    start, _end, users = acc.between[0]
    assert users == ["sgtest1"]
    assert start == pytest.approx(__import__("datetime").datetime(2026, 11, 1).timestamp())


def test_relative_since_and_limit() -> None:
    jobs = [F.job(job_id=str(i), job_id_display=str(i), submit_s=float(i)) for i in range(5)]
    acc = FakeAccounting(jobs)
    res = run(["--since", "3d", "--limit", "2"], acc, FakeReader(), env={"USER": "sgtest1"})
    assert res.exit_code == 0, res.output
    assert len(res.output.splitlines()) == 3
    start, end, _ = acc.between[0]
    assert end - start == pytest.approx(3 * 86400, abs=5)


def test_json_follows_the_published_schema() -> None:
    jobs = [F.job(), F.job(job_id="1003", job_id_display="1003", elapsed_s=3)]
    res = run(
        ["--json", "1001", "1003", "77"],
        FakeAccounting(jobs),
        FakeReader(final={"1001": telemetry()}),
    )
    assert res.exit_code == EXIT_CODES["job not found"]
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["version"] == 1 and doc["not_found"] == ["77"]
    first, short = doc["jobs"]
    assert first["gpus"][0]["duty_mean_pct"] == pytest.approx(80.0)
    assert first["findings"][0]["cause"] == 6
    assert first["recommendations"][0]["sbatch_lines"] == ["#SBATCH --gpus=1"]
    # Unknown is null, never a misleading zero.
    assert short["telemetry"] == "too_short"
    assert short["gpu_hours_idle"] is None and short["gpus"] == []


def test_json_schema_is_strict() -> None:
    res = run(["--json", "1001"], FakeAccounting([F.job()]), FakeReader())
    doc = json.loads(res.stdout)
    doc["jobs"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_other_users_job_is_not_found_and_nothing_is_read() -> None:
    other = F.job(user="sgtest2")
    reader = FakeReader(final={"1001": telemetry()})
    res = run(["1001"], FakeAccounting([other]), reader)
    assert res.exit_code == EXIT_CODES["job not found"] == 4
    assert res.stderr.splitlines()[0] == "gpueff: job 1001 not found"
    assert res.stderr.splitlines()[1].startswith("hint: ")
    assert "Traceback" not in res.output
    assert reader.read == []


def test_accounting_unavailable_is_exit_5_with_hint() -> None:
    res = run(["1001"], BrokenAccounting([]))
    assert res.exit_code == 5
    assert res.stderr == "gpueff: sacct failed: slurmdbd unreachable\nhint: is slurmdbd running?\n"


def test_debug_shows_the_traceback() -> None:
    res = run(["--debug", "1001"], BrokenAccounting([]))
    assert res.exit_code == 5
    assert "Traceback" in res.stderr


def test_bad_config_is_exit_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpueff]\nmin_elapsed_s = 'soon'\n")
    res = run(["--config", str(bad), "1001"], FakeAccounting([F.job()]))
    assert res.exit_code == 3
    assert "gpueff.min_elapsed_s" in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["12ab"],
        ["1001", "--user", "x"],
        ["--since", "yesterday-ish"],
        ["--limit", "0"],
        ["--since", "2999-01-01"],
    ],
)
def test_usage_errors_are_exit_2(args: list[str]) -> None:
    res = run(args, FakeAccounting([F.job()]))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output


def test_a_since_after_now_is_said_before_accounting_is_asked() -> None:
    # Seen on the test cluster: `gpueff -S 2027-01-01` passed the date to sacct, which
    # refused it ("Start time (…) requested is after end time (…)"): exit 5 and the hint
    # "run the sacct command by hand", for a typing slip.
    acc = FakeAccounting([F.job()])
    res = run(["--since", "2999-01-01"], acc)
    assert res.stderr.startswith("gpueff: --since '2999-01-01' is after now\nhint: "), res.stderr
    assert acc.between == [] and acc.asked == []


def test_colour_forced_on_and_no_color_respected() -> None:
    acc = FakeAccounting([F.job()])
    reader = FakeReader(final={"1001": telemetry()})
    assert ANSI.search(run(["--color", "1001"], acc, reader).output)
    assert not ANSI.search(run(["1001"], acc, reader, env={"NO_COLOR": "1"}).output)
    assert not ANSI.search(run(["--no-color", "1001"], acc, reader).output)


def test_no_color_env_wins_even_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert output.use_colour(None) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert output.use_colour(None) is False


def test_job_name_cannot_inject_terminal_escapes() -> None:
    job = F.job(job_name="x\x1b]0;owned\x07\x1b[2J")
    res = run(["1001"], FakeAccounting([job]), FakeReader())
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert '"x?]0;owned??[2J"' in res.output


def test_site_template_override(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.txt.j2").write_text("SITE {{ r.job_id_display }} {{ r.telemetry.value }}\n")
    cfg = tmp_path / "site.toml"
    cfg.write_text(f"[gpueff]\ntemplate_dir = '{site}'\n")
    res = run(["--config", str(cfg), "1001"], FakeAccounting([F.job()]))
    assert res.exit_code == 0
    assert res.output == "SITE 1001 pending\n"


def test_missing_override_dir_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "site.toml"
    cfg.write_text(f"[gpueff]\ntemplate_dir = '{tmp_path / 'nope'}'\n")
    res = run(["--config", str(cfg), "1001"], FakeAccounting([F.job()]))
    assert res.exit_code == 3


def test_live_report_keeps_unknown_as_na() -> None:
    tel = telemetry(live=True)
    gpus = tuple(replace(g, memory_total_bytes=None, power_mean_w=None) for g in tel.gpus)
    job = F.job(state="RUNNING", exit_code=None, end_s=None)
    res = run(["1001"], FakeAccounting([job]), FakeReader(live={"1001": replace(tel, gpus=gpus)}))
    assert "12 GiB / n/a   power n/a" in res.output


def test_exit_code_table_in_docs_matches_errors() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    for meaning, code in EXIT_CODES.items():
        assert re.search(rf"^\|\s*{code}\s*\|\s*{re.escape(meaning)}\s*\|", doc, re.M), meaning


def test_a_range_of_tasks_asks_for_the_array_and_keeps_the_range() -> None:
    accounting = FakeAccounting(_array(5))
    res = run(["1999_[1-3]"], accounting, FakeReader(final={"2001": telemetry()}))
    assert res.exit_code == 0, res.output
    assert accounting.asked == [["1999"]]  # sacct refuses 1999_[1-3]: "Bad job array element"
    lines = [ln for ln in res.output.splitlines() if ln.startswith("1999_")]
    assert [ln.split()[0] for ln in lines] == ["1999_1", "1999_2", "1999_3"]
    assert "Array 1999_[1-3]: 3 tasks" in res.output


@pytest.mark.parametrize("typed", ["1999_[3-1]", "1999_[1-x]", "1999_[0-10:0]"])
def test_a_malformed_range_is_a_usage_error(typed: str) -> None:
    res = run([typed], FakeAccounting(_array(3)), FakeReader())
    assert res.exit_code == 2, res.output


def test_an_array_has_a_summary_of_its_tasks() -> None:
    reader = FakeReader(final={"2001": telemetry(), "2002": telemetry()})
    res = run(["1999"], FakeAccounting(_array(3)), reader)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "All 3 tasks:" in out
    assert "elapsed  min 01:00:00, mean 01:00:00, max 01:00:00" in out
    assert "GPU busy min 40 %, mean 40 %, max 40 % (of the 2 tasks with GPU numbers)" in out
    assert "GPU-hours 6.00 allocated in all" in out
