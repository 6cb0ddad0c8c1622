"""``slurm-gpu admincomment`` and the ``collect`` setting, through click's runner, with sacct and
sacctmgr replaced by small scripts (named in the configuration, as a site would)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from reportseff import job as reportseff_job
from sacct_fixtures import render, row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_job, make_node

from slurm_gpu.accounting.admincomment import build_summary, decode
from slurm_gpu.capture import spool
from slurm_gpu.cli.admin import cli
from slurm_gpu.store import TELEMETRY_COMPLETE, TELEMETRY_MISSING, JobBundle, Store

SACCT = """#!/bin/sh
# AdminComment read-back: what sacctmgr stored; anything else: the recorded job.
case "$*" in
  *--format=AdminComment*) cat "{d}/stored" 2>/dev/null; echo ;;
  *) cat "{d}/jobs.txt" ;;
esac
"""
SACCTMGR = """#!/bin/sh
echo "$@" >> "{d}/sacctmgr.log"
for a in "$@"; do case "$a" in AdminComment=*) v="${{a#AdminComment=}}" ;; esac; done
if [ "$(cat "{d}/mode")" = lowers ]; then
  printf %s "$v" | tr 'A-Z' 'a-z' > "{d}/stored"
else
  printf %s "$v" > "{d}/stored"
fi
echo " Modified job(s)..."
"""


class Site:
    """A configuration with its own store, spool and fake Slurm commands."""

    def __init__(self, tmp_path: Path, mode: str = "keeps", **collector: object) -> None:
        self.dir = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True)
        for name, text in (("sacct", SACCT), ("sacctmgr", SACCTMGR)):
            path = self.bin / name
            path.write_text(text.format(d=self.bin))
            path.chmod(0o755)
        (self.bin / "mode").write_text(mode)
        (self.bin / "jobs.txt").write_text("")
        self.url = f"sqlite:///{tmp_path}/state/store.db"
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in collector.items())
        self.config = tmp_path / "config.toml"
        self.config.write_text(
            f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
            f'[store]\nurl = "{self.url}"\n'
            f'[accounting]\nsacct_path = "{self.bin}/sacct"\n'
            f"[collector]\n{extra}"
        )

    def invoke(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        result = CliRunner().invoke(cli, ["--config", str(self.config), *args], input=stdin)
        return result.exit_code, result.stdout, result.stderr

    def sacctmgr_calls(self) -> list[str]:
        log = self.bin / "sacctmgr.log"
        return log.read_text().splitlines() if log.exists() else []

    def store_job(self, job_id: str, *, gpus: int = 2, telemetry: str = TELEMETRY_COMPLETE) -> None:
        nodes = (make_node(job_id, "node1", gpus=gpus),) if telemetry != TELEMETRY_MISSING else ()
        bundle = JobBundle(job=make_job(job_id, gpus=gpus), nodes=nodes, telemetry=telemetry)
        with Store.open(self.url) as store:
            store.write_batch([bundle], collected_at_s=1_700_000_200.0)

    def spool_job(self) -> None:
        """Job 101 on host vm: its sealed record, and sacct's answer about it."""
        (self.bin / "jobs.txt").write_text(render([row()]))
        record = make_node("101", "vm", gpus=1)
        js = spool.JobSpool(str(self.dir / "spool"), "101", "vm")
        js.create_dir()
        spool.write_record(js.record, record)


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def test_print_gives_the_summary_reportseff_reads(site: Site) -> None:
    site.store_job("7")
    site.store_job("8", gpus=1)
    code, out, err = site.invoke("admincomment", "--print", "7", "8")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["7", "8"]
    _, size, comment = lines[0].split()
    assert int(size) == len(comment.encode())
    with Store.open(site.url, migrate=False) as store:
        stored = store.get_job("7")
    assert stored is not None
    assert decode(comment) == build_summary(stored.job, stored.nodes)
    parsed = reportseff_job._parse_admin_comment_to_dict(comment)
    assert parsed == build_summary(stored.job, stored.nodes)
    assert site.sacctmgr_calls() == []  # --print writes nothing


def test_decode_prints_the_json(site: Site) -> None:
    site.store_job("7")
    comment = site.invoke("admincomment", "--print", "7")[1].split()[2]
    code, out, _ = site.invoke("admincomment", "--decode", comment)
    assert code == 0
    assert json.loads(out) == decode(comment)
    mean = round(sum((0, 50, 90, 95)) / 4, 1)  # make_gpu's readings
    assert json.loads(out)["nodes"]["node1"]["gpu_utilization"] == {"0": mean, "1": mean}
    code, out_stdin, _ = site.invoke("admincomment", "--decode", "-", stdin=comment + "\n")
    assert code == 0 and out_stdin == out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--decode", "JS1:notbase64!"), 5, "corrupt"),
        (("--decode", "JS2:abc"), 5, "unknown job summary version"),
        (("--decode", "JS1:x", "7"), 2, "takes no JOBID"),
        ((), 2, "no job given"),
        (("12_3",), 2, "raw job id"),
        (("99",), 4, "not in the store"),
        (("--print", "9"), 4, "no GPU telemetry"),
    ],
)
def test_errors_are_typed(site: Site, args: tuple[str, ...], code: int, message: str) -> None:
    site.store_job("9", telemetry=TELEMETRY_MISSING)
    got, _, err = site.invoke("admincomment", *args)
    assert got == code and message in err, err


def test_write_uses_sacctmgr_beside_sacct(site: Site) -> None:
    site.store_job("7")
    code, out, err = site.invoke("admincomment", "7")
    assert code == 0, err
    assert "job 7: AdminComment written" in out
    (call,) = site.sacctmgr_calls()
    assert call.startswith("-i modify job where jobid=7 set AdminComment=JS1:")
    assert (site.bin / "stored").read_text() == call.split("AdminComment=", 1)[1]


def test_write_on_a_lower_casing_sacctmgr_fails_with_the_reason(tmp_path: Path) -> None:
    site = Site(tmp_path, mode="lowers")
    site.store_job("7")
    code, _, err = site.invoke("admincomment", "7")
    assert code == 5
    assert "lower-cased" in err and "hint:" in err


def test_collect_writes_only_when_the_setting_is_on(tmp_path: Path) -> None:
    off = Site(tmp_path / "off")
    off.spool_job()
    code, out, err = off.invoke("collect", "--once", "--no-missing", "--json")
    assert code == 0, err
    assert json.loads(out)["ingested"] == ["101"]
    assert off.sacctmgr_calls() == []

    on = Site(tmp_path / "on", admin_comment=True)
    on.spool_job()
    code, out, err = on.invoke("collect", "--once", "--no-missing", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ingested"] == ["101"] and report["admin_comment_written"] == ["101"]
    assert len(on.sacctmgr_calls()) == 1


def test_collect_reports_the_lower_casing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    site = Site(tmp_path, mode="lowers", admin_comment=True)
    site.spool_job()
    code, out, err = site.invoke("collect", "--once", "--no-missing")
    assert code == 0, err  # the job is stored; the comment is not fatal
    assert "1 stored" in out and "1 AdminComment not written" in out
    # (a real run logs to stderr; under pytest the log goes to caplog)
    assert any("lower-cases AdminComment" in r.getMessage() for r in caplog.records)
    with Store.open(site.url, migrate=False) as store:
        assert store.get_job("101") is not None
