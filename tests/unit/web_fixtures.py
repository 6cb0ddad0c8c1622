"""Stored jobs and fake backends for the web page's tests (unit and browser)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import gpueff_factory as F

from slurm_gpu.analysis.engine import analyze
from slurm_gpu.config import Settings, parse_settings
from slurm_gpu.jobreport.readers import StoreAndSpoolReader, open_store_reader
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import TELEMETRY_COMPLETE, JobBundle, Store
from slurm_gpu.store.visibility import Visibility
from slurm_gpu.web.app import Backends

#: The job of ``test_energy_channels``: GPU 0 idle for its first quarter, GPU 1 never used.
UTILS = ([0.0] * 15 + [90.0] * 45, [0.0] * 60)
ENERGY = {"price_per_kwh": 0.30, "co2_g_per_kwh": 400.0}


def jobs() -> list[tuple[JobRecord, NodeRecord]]:
    """sgtest1's job 1001, array 2000 (tasks 0 and 1) and sgtest2's job 3001."""
    one = F.job()
    out = [(one, F.node_record(utils=UTILS))]
    for task, utils in (("0", ([80.0] * 60,)), ("1", ([0.0] * 20 + [60.0] * 40,))):
        job_id = str(2001 + int(task))
        j = F.job(
            job_id=job_id,
            job_id_display=f"2000_{task}",
            array_job_id="2000",
            array_task_id=task,
            job_name="sweep",
            alloc_tres=replace(one.alloc_tres, gpus=1, gpu_types=(("a100", 1),)),
        )
        out.append((j, replace(F.node_record(utils=utils), job_id=job_id)))
    other = F.job(
        job_id="3001",
        job_id_display="3001",
        user="sgtest2",
        uid=1002,
        account="physics",
        job_name="secret-project",
    )
    out.append((other, replace(F.node_record(utils=UTILS), job_id="3001")))
    return out


def settings_for(tmp_path: Path, **web: Any) -> Settings:
    return parse_settings(
        {
            "paths": {"state_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool")},
            "energy": ENERGY,
            "gpueff": {"min_elapsed_s": 30, "cache_reports": False},
            "web": {"identity": "remote_user", **web},
        },
        path=None,
    )


def store_jobs(settings: Settings) -> list[JobRecord]:
    pairs = jobs()
    with Store.open(settings.store_url) as store:
        store.write_batch(
            [
                JobBundle(
                    j,
                    (rec,),
                    TELEMETRY_COMPLETE,
                    findings=analyze(j, [rec], settings.analysis).findings,
                )
                for j, rec in pairs
            ],
            collected_at_s=1.0,
        )
    return [j for j, _ in pairs]


class ServiceAccounting:
    """sacct as a service account that sees every job (root, SlurmUser)."""

    name = "fake"

    def __init__(self, stored: Sequence[JobRecord]) -> None:
        self.stored = list(stored)

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        wanted = set(job_ids)
        return {
            j.job_id: j
            for j in self.stored
            if j.job_id in wanted or j.array_job_id in wanted or j.job_id_display in wanted
        }

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        return [j for j in self.stored if users is None or j.user in users]


def backends(settings: Settings, stored: Sequence[JobRecord], vis: Visibility) -> Backends:
    def timelines(job_id: str) -> Sequence[NodeRecord]:
        store = open_store_reader(settings.store_url)
        try:
            found = store.get_job(job_id, timelines=True)
        finally:
            store.close()
        return tuple(found.nodes) if found is not None else ()

    return Backends(
        accounting=lambda: ServiceAccounting(stored),
        reader=lambda: StoreAndSpoolReader(settings),
        timelines=timelines,
        visibility=lambda: vis,
        now=lambda: 1_700_010_000.0,
    )


PRIVATE = Visibility(
    private_jobs=True,
    admins=frozenset({"root", "slurm"}),
    coordinated={"prof": frozenset({"physics"})},
)
