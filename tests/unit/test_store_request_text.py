"""The job's own request survives the store (issue 26): ``SubmitLine``, the batch script's
``#SBATCH`` lines and Slurm's ``Reason`` were read from accounting but not stored, so a
re-analysis from the store (``slurm-gpu analyze``, the weekly report, a re-rendered report)
wrote its advice in the usual forms and lost the node-failure reason. Schema version 11 keeps
them; rows stored before read as "not known"."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from store_fixtures import make_job, make_node, rolled_back_store

from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store, migrations
from slurm_gpu.store.sqlite_reader import SqliteReader


def _job(job_id: str):  # type: ignore[no-untyped-def]
    return replace(
        make_job(job_id),
        submit_line="sbatch --gpus=2 train.sh",
        batch_directives="#SBATCH --cpus-per-gpu=4\n#SBATCH --mem-per-gpu=8G",
        reason="NodeDown",
    )


def test_submit_line_directives_and_reason_survive_the_store_and_the_reader(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        store.write_batch(
            [JobBundle(job=_job("9"), nodes=(make_node("9"),), telemetry=TELEMETRY_COMPLETE)],
            collected_at_s=1.0,
        )
        got = store.get_job("9")
    assert got is not None
    assert got.job.submit_line == "sbatch --gpus=2 train.sh"
    assert got.job.batch_directives == "#SBATCH --cpus-per-gpu=4\n#SBATCH --mem-per-gpu=8G"
    assert got.job.reason == "NodeDown"
    with SqliteReader.open(str(tmp_path / "store.db")) as reader:
        again = reader.get_job("9")
    assert again is not None and again.job == got.job


def test_a_version_10_store_gains_the_columns_and_its_old_rows_read_not_known(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    columns = ("submit_line", "batch_directives", "reason")
    rolled_back_store(url, 10, [("jobs", c) for c in columns])
    with Store.open(url) as store:
        with store.engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST_VERSION == 11
        old = store.get_job("7")
        assert old is not None
        assert (old.job.submit_line, old.job.batch_directives, old.job.reason) == (None,) * 3
        store.write_batch(
            [JobBundle(job=_job("8"), nodes=(make_node("8"),), telemetry=TELEMETRY_COMPLETE)],
            collected_at_s=2.0,
        )
        new = store.get_job("8")
        assert new is not None and new.job.reason == "NodeDown"
