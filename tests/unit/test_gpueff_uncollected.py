"""A job that ended but is not collected yet, asked about by its owner while the store is closed
to them (``PrivateData=jobs`` sites: the store is root's): "not collected yet", never the
store's permission error, and a listing shows every other job."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner, Result

from slurm_gpu.cli.gpueff import BACKENDS_KEY, CALLER_UID_KEY, cli
from slurm_gpu.config import parse_settings
from slurm_gpu.errors import StoreError
from slurm_gpu.jobreport.readers import StoreAndSpoolReader
from slurm_gpu.records import JobRecord

SGTEST1 = 1001


class Accounting:
    name = "fake"

    def __init__(self, jobs: Sequence[JobRecord]) -> None:
        self.jobs = list(jobs)

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        return {j.job_id: j for j in self.jobs if j.job_id in job_ids}

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return list(self.jobs)


class ClosedStore:
    """The store as its owner meets it on such a site: opening it is refused."""

    def __getattr__(self, name: str) -> Any:
        raise StoreError(
            "store /var/lib/slurm-gpu/slurm-gpu.db: unable to open database file "
            "(Permission denied)"
        )


def _gpueff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpueff]\nmin_elapsed_s = 30\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    settings = parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")}}, path=None
    )
    reader = StoreAndSpoolReader(settings, store=ClosedStore(), answer_uncollected=True)
    jobs = [
        F.job(job_id="1001", job_id_display="1001", submit_s=1.0),
        F.job(job_id="1002", job_id_display="1002", submit_s=2.0, state="RUNNING"),
    ]
    return CliRunner().invoke(
        cli,
        ["--no-color", *args],
        obj={BACKENDS_KEY: (Accounting(jobs), reader), CALLER_UID_KEY: SGTEST1},
        catch_exceptions=False,
    )


def test_one_uncollected_job_reads_not_collected_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _gpueff(tmp_path, monkeypatch, "1001")
    assert res.exit_code == 0, res.output
    assert "not been collected yet" in res.output
    assert "Permission denied" not in res.output


@pytest.mark.parametrize("args", [(), ("--since", "1h")])
def test_a_listing_goes_on_past_an_uncollected_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    res = _gpueff(tmp_path, monkeypatch, *args)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert any(ln.startswith("1001 ") and "not collected yet" in ln for ln in lines), res.output
    assert any(ln.startswith("1002 ") for ln in lines), res.output


def _last_summary(tmp_path: Path, *, updated_s: float) -> None:
    """Job 1001's live summary on node1, one busy GPU, last written at ``updated_s``."""
    from slurm_gpu.capture import spool

    path = Path(spool.JobSpool(str(tmp_path / "spool"), "1001", "node1").live)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '{"schema": "slurm-gpu/live", "version": 1, "hostname": "node1", '
        f'"updated_s": {updated_s}, "gpus": [{{"uuid": "GPU-1", '
        '"name": "NVIDIA A100-SXM4-40GB", "minor_number": 0, "samples": 100, '
        '"idle_samples": 10, "utilization_mean_pct": 91.0, "energy_j": 13932.0}]}'
    )


@pytest.mark.parametrize(
    "updated_s",
    [
        1700003690.0,  # 10 s before the job's end
        # 2 min after it: the sampler writes until the epilog stops it, minutes after the end
        # on a slow node; later than the job's end is not "ahead of the clock" (only now is).
        1700003820.0,
    ],
)
def test_the_nodes_last_live_summary_is_shown_while_not_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, updated_s: float
) -> None:
    _last_summary(tmp_path, updated_s=updated_s)
    res = _gpueff(tmp_path, monkeypatch, "1001")
    assert res.exit_code == 0, res.output
    assert "not been collected yet" in res.output and "ahead" not in res.output
    assert "node1:0" in res.output and "91 %" in res.output and "3.87 Wh" in res.output
    assert "x NVIDIA A100-SXM4-40GB" in res.output


def test_a_summary_that_stopped_long_before_the_jobs_end_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sampler died an hour before the job ended: its last numbers are not the job's.
    _last_summary(tmp_path, updated_s=1700000100.0)
    res = _gpueff(tmp_path, monkeypatch, "1001")
    assert res.exit_code == 0, res.output
    assert "node1:0" in res.output and "91 %" not in res.output and "3.87 Wh" not in res.output
    assert "its live summary is 01:00:00 old" in res.output, res.output


def test_the_mail_programs_reader_still_waits_for_the_record(tmp_path: Path) -> None:
    """Without ``answer_uncollected`` (the mail program) an ended job not in the store is
    ``None`` (wait for the record), even with the node's live summary on this host."""
    from slurm_gpu.capture import spool

    settings = parse_settings(
        {"paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")}}, path=None
    )
    path = Path(spool.JobSpool(str(tmp_path / "spool"), "1001", "node1").live)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema": "slurm-gpu/live", "version": 1, "hostname": "node1", "gpus": []}')

    class Empty:
        def get_job(self, job_id: str, timelines: str = "") -> None:
            return None

    assert StoreAndSpoolReader(settings, store=Empty()).final(F.job()) is None
    with pytest.raises(StoreError):
        StoreAndSpoolReader(settings, store=ClosedStore()).final(F.job())
