"""Generate a synthetic week of GPU jobs straight into a store, with bulk inserts.

Used by ``benchmarks/bench_report.py`` and by the report tests. Every column is drawn
column-wise with numpy from a fixed seed, so the same arguments give the same store. The
shape imitates a busy site: a few heavy users, 1–8 GPUs per job, heavy-tailed run times,
some GPUs never used, idle heads and tails, a little hardware trouble, and 0–2 findings per
job with causes 1–7.

    python benchmarks/gen_week.py --url sqlite:////tmp/week.db --jobs 100000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Boolean, Engine, Float, Integer, LargeBinary, String, Table, Text

from slurm_gpu.records import Distribution
from slurm_gpu.store import codec, schema
from slurm_gpu.store.store import Store

WEEK_S = 7 * 86400.0
#: 2026-11-16 00:00 UTC, a Monday: the default week generated.
DEFAULT_SINCE_S = 1_794_787_200.0
MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB")
PARTITIONS = ("gpu", "gpu-long", "debug")
CODES = {
    1: "SMALL_BATCH",
    2: "DATA_LOADER_BOUND",
    3: "NO_MIXED_PRECISION",
    4: "MEMORY_UNDERUSED",
    5: "COMM_BOUND",
    6: "GPU_NEVER_USED",
    7: "NO_PROFILING",
}
CHUNK = 20_000
_EMPTY_HIST = codec.encode_distribution(Distribution(counts=(0,) * 101, total=0.0))


def _defaults(table: Table, rows: dict[str, Any], n: int) -> dict[str, Any]:
    """Fill every NOT NULL column the generator does not set (the schema may grow)."""
    for col in table.columns:
        if col.name in rows or col.nullable or col.primary_key:
            continue
        if isinstance(col.type, Boolean):
            value: Any = False
        elif isinstance(col.type, Integer | Float):
            value = 0
        elif isinstance(col.type, LargeBinary):
            value = _EMPTY_HIST
        elif isinstance(col.type, String | Text):
            value = "{}" if col.name.endswith("_json") else ""
        else:  # pragma: no cover - a column type the generator does not know yet
            raise TypeError(f"{table.name}.{col.name}: no default for {col.type!r}")
        rows[col.name] = [value] * n
    return rows


def frames(
    n_jobs: int, since_s: float = DEFAULT_SINCE_S, seed: int = 1, id_offset: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The (jobs, job_gpus, findings) rows of a synthetic week, as DataFrames."""
    rng = np.random.default_rng(seed)
    n = n_jobs
    ids = np.arange(id_offset + 1, id_offset + n + 1)
    users = rng.zipf(1.6, n) % 300
    gpus = rng.choice([1, 1, 1, 2, 2, 4, 8], n)
    elapsed = np.minimum(rng.exponential(3 * 3600, n), 2 * 86400).astype(np.int64) + 60
    end = since_s + rng.uniform(0, WEEK_S, n)
    start = end - elapsed
    measured = rng.random(n) > 0.03
    partition = rng.choice(len(PARTITIONS), n, p=[0.6, 0.3, 0.1])
    job_ids = ids.astype(str)
    jobs = pd.DataFrame(
        {
            "job_id": job_ids,
            "job_id_display": job_ids,
            "user": np.char.add("user", users.astype(str)),
            "uid": 10000 + users,
            "account": np.char.add("acct", (users % 40).astype(str)),
            "partition": np.array(PARTITIONS)[partition],
            "job_name": "train",
            "nodelist": np.char.add("gpu", (ids % 100).astype(str)),
            "node_count": 1,
            "state": "COMPLETED",
            "alloc_tres": np.char.add("cpu=8,gres/gpu=", gpus.astype(str)),
            "req_tres": np.char.add("cpu=8,gres/gpu=", gpus.astype(str)),
            "alloc_gpus": gpus,
            "elapsed_s": elapsed,
            "start_s": start,
            "end_s": end,
            "restarts": 0,
            "telemetry": np.where(measured, schema.TELEMETRY_COMPLETE, schema.TELEMETRY_MISSING),
            "missing_hosts": "",
            "gpu_hours": gpus * elapsed / 3600.0,
            "collected_at_s": end + 60,
        }
    )

    # One row per GPU of each measured job.
    m_idx = np.flatnonzero(measured)
    per = gpus[m_idx]
    job_of = np.repeat(m_idx, per)
    pos = np.arange(len(job_of)) - np.repeat(np.cumsum(per) - per, per)
    k = len(job_of)
    job_level = rng.beta(2.0, 2.0, n) * 100  # jobs differ more than their GPUs
    util = np.clip(job_level[job_of] + rng.normal(0, 8, k), 0, 100)
    never = rng.random(k) < 0.05
    util = np.where(never, 0.0, util)
    span = elapsed[job_of].astype(float)
    head = np.where(rng.random(k) < 0.1, rng.uniform(0, 0.5, k) * span, rng.uniform(0, 30, k))
    tail = np.where(rng.random(k) < 0.1, rng.uniform(0, 0.3, k) * span, rng.uniform(0, 30, k))
    first = start[job_of]
    last = end[job_of]
    trouble = rng.random(k)
    gpus_df = pd.DataFrame(
        {
            "job_id": job_ids[job_of],
            "host": jobs["nodelist"].to_numpy()[job_of],
            "uuid": np.char.add(
                "GPU-", np.char.add(job_ids[job_of], np.char.add("-", pos.astype(str)))
            ),
            "position": pos,
            "model": np.array(MODELS)[rng.choice(3, n)][job_of],
            "samples": (span / 10).astype(np.int64),
            "samples_available": (span / 10).astype(np.int64),
            "first_time_s": first,
            "last_time_s": last,
            "util_mean_pct": util,
            "util_hist": _EMPTY_HIST,
            "sub_util_hist": _EMPTY_HIST,
            "idle_samples": 0,
            # Idle readings grow as the duty cycle falls; an unused GPU is idle throughout.
            "idle_fraction": np.where(never, 1.0, np.clip((100 - util) / 100 * 0.6, 0, 1)),
            "idle_head_s": np.where(never, span, head),
            "idle_tail_s": np.where(never, 0.0, tail),
            "active_first_time_s": np.where(never, np.nan, first + head),
            "active_last_time_s": np.where(never, np.nan, last - tail),
            "energy_j": (60 + 3.0 * util) * span,
            "throttle_power_s": np.where(trouble < 0.01, rng.uniform(0, 0.2, k) * span, 0.0),
            "throttle_thermal_s": np.where(trouble > 0.995, rng.uniform(0, 0.2, k) * span, 0.0),
            "ecc_corrected": np.where(trouble > 0.998, rng.integers(1, 50, k), 0),
            "ecc_uncorrected": np.where(trouble > 0.9995, 1, 0),
            "xid_events": np.where(trouble > 0.999, "79", np.where(trouble > 0.9985, "48,63", "")),
            "process_seen": ~never,
            "max_processes": np.where(never, 0, 1),
            "pids": "",
        }
    )
    gpus_df["active_first_time_s"] = (
        gpus_df["active_first_time_s"].astype(object).where(~never, None)
    )
    gpus_df["active_last_time_s"] = gpus_df["active_last_time_s"].astype(object).where(~never, None)

    # 0–2 findings per measured job, most important first.
    nf = rng.choice([0, 1, 1, 2], len(m_idx))
    f_job = np.repeat(m_idx, nf)
    f_seq = np.arange(len(f_job)) - np.repeat(np.cumsum(nf) - nf, nf)
    cause = rng.integers(1, 8, len(f_job))
    findings = pd.DataFrame(
        {
            "job_id": job_ids[f_job],
            "seq": f_seq,
            "code": np.array([CODES[c] for c in range(1, 8)])[cause - 1],
            "severity": np.where(f_seq == 0, "warning", "info"),
            "cause": cause,
            "evidence": "{}",
            "analysis_version": "synthetic",
        }
    )
    return jobs, gpus_df, findings


def _records(df: pd.DataFrame, table: Table) -> Iterator[list[dict[str, Any]]]:
    for lo in range(0, len(df), CHUNK):
        part = df.iloc[lo : lo + CHUNK]
        cols = {c: part[c].tolist() for c in part.columns}
        cols = _defaults(table, cols, len(part))
        names = list(cols)
        yield [dict(zip(names, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def insert(engine: Engine, jobs: pd.DataFrame, gpus: pd.DataFrame, found: pd.DataFrame) -> None:
    """Bulk-insert the three frames (executemany in chunks, one transaction)."""
    with engine.connect().execution_options(sqlite_write=True) as conn, conn.begin():
        for table, df in ((schema.jobs, jobs), (schema.job_gpus, gpus), (schema.findings, found)):
            for rows in _records(df, table):
                conn.execute(table.insert(), rows)


def insert_dicts(
    engine: Engine,
    jobs: list[dict[str, Any]],
    gpus: list[dict[str, Any]],
    found: list[dict[str, Any]],
) -> None:
    """Insert hand-written rows (one dict per row; NOT NULL columns left out get defaults)."""
    with engine.connect().execution_options(sqlite_write=True) as conn, conn.begin():
        for table, rows in ((schema.jobs, jobs), (schema.job_gpus, gpus), (schema.findings, found)):
            if not rows:
                continue
            names = sorted({k for r in rows for k in r})
            cols = {c: [r.get(c) for r in rows] for c in names}
            cols = _defaults(table, cols, len(rows))
            keys = list(cols)
            full = [dict(zip(keys, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
            conn.execute(table.insert(), full)


def generate(
    url: str, n_jobs: int, since_s: float = DEFAULT_SINCE_S, seed: int = 1, id_offset: int = 0
) -> None:
    """Create (migrate) the store at ``url`` and add a synthetic week of ``n_jobs`` jobs."""
    with Store.open(url) as store:
        insert(store.engine, *frames(n_jobs, since_s, seed, id_offset))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="store URL (sqlite:///… or postgresql+psycopg://…)")
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--since", type=float, default=DEFAULT_SINCE_S, help="week start, epoch s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--id-offset", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    generate(args.url, args.jobs, args.since, args.seed, args.id_offset)
    print(f"{args.jobs} jobs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
