"""Collector ingest throughput (jobs/s, batched sacct calls included) and store size per GPU-hour.

Accounting: a *recorded-output* runner behind the real ``SacctSource``. The output of one real
finished GPU job (``--template-job``, default: the newest finished GPU job that the local
slurmdbd knows) is recorded once; every batch then

1. runs the real ``sacct`` against the local slurmdbd for that job (so each batch pays a real
   process start and a real slurmdbd round trip), and
2. answers with the recorded lines rewritten for the batch's job ids, which ``SacctSource``
   parses like any other output.

Filling slurmdbd with 10,000 real jobs is not done: the one-node test cluster runs about one
GPU job per second through its prolog and epilog, so 10,000 jobs would take hours.

Spool: one sealed record per job, one node, ``--gpus`` GPUs, one hour at the default 10 s
interval (360 readings, 360 timeline points), utilization and power with noise so the
compressed timelines are realistic rather than flat.

Each configuration runs ``--repeat`` times (fresh spool and store each time), in rounds that
run every configuration once (reports off and on alternate); the table gives
the median rate with its range, the collector's own CPU time per job (``time.process_time``
and its report worker's, a child process,
which a loaded machine disturbs less than the wall clock; the sacct processes are not in it)
and the 1-minute load average when the runs started.

Run as root on the test cluster host::

    .venv/bin/python benchmarks/bench_collect.py --jobs 1000 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_gpu.accounting.runner import CommandResult, SubprocessRunner
from slurm_gpu.accounting.sacct import DELIM, SACCT_ENV, SacctSource, build_argv
from slurm_gpu.capture import spool
from slurm_gpu.capture.aggregate import distribution_of as dist
from slurm_gpu.collector import Collector, CollectorOptions
from slurm_gpu.config import parse_settings
from slurm_gpu.jobreport.prerender import ReportPrerenderer
from slurm_gpu.records import (
    GpuInfo,
    GpuSummary,
    HostSummary,
    NodeRecord,
    TimelinePoint,
)
from slurm_gpu.store import Store

T0 = 1_790_000_000.0
HOUR = 3600.0
INTERVAL_S = 10.0


def newest_gpu_job() -> str:
    """The newest finished plain GPU job (not an array task or het component: the benchmark
    gives every copy its own id, which only a plain job's records allow)."""
    out = subprocess.run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-a",
            "-S",
            "now-7days",
            "-o",
            "JobIDRaw,JobID,State,AllocTRES",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = [
        f[0]
        for f in (line.split("|") for line in out.splitlines())
        if len(f) == 4 and f[0] == f[1] and f[2] == "COMPLETED" and "gres/gpu" in f[3]
    ]
    if not ids:
        raise SystemExit("no finished GPU job in accounting; run one on the test cluster first")
    return ids[-1]


class RecordedRunner:
    """Real sacct call per batch, recorded lines rewritten for the asked ids."""

    def __init__(self, template_job: str) -> None:
        self.template_job = template_job
        self.real = SubprocessRunner()
        done = self.real(build_argv("sacct", job_ids=[template_job]), env=SACCT_ENV, timeout_s=60)
        if done.returncode != 0 or not done.stdout.strip():
            raise SystemExit(f"sacct gave nothing for job {template_job}: {done.stderr}")
        self.template = done.stdout
        self.calls = 0

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        max_stdout: int | None = None,
    ) -> CommandResult:
        self.calls += 1
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        if "--batch-script" in argv:
            # The collector's script query (accounting.batch_scripts, on by default): one real
            # round trip for the template job, its script given to every asked id.
            done = self.real(
                ["sacct", "--batch-script", f"--jobs={self.template_job}"],
                env=env,
                timeout_s=timeout_s,
                max_stdout=max_stdout,
            )
            return CommandResult(done.returncode, _scripts_for(ids, done.stdout), done.stderr)
        real = list(argv)
        real[real.index(f"--jobs={','.join(ids)}")] = f"--jobs={self.template_job}"
        done = self.real(real, env=env, timeout_s=timeout_s)
        if done.returncode != 0:
            return done
        tid = self.template_job.encode()
        sep = DELIM.encode()
        lines = [line.split(sep) for line in self.template.splitlines()]
        chunks = []
        for jid in ids:
            b = jid.encode()
            for fields in lines:
                # JobIDRaw and JobID open every record ("<id>" or "<id>.batch") and JobIDRaw
                # closes it: rewrite the id there only.
                out = list(fields)
                for k in (0, 1, len(out) - 1):
                    if out[k] == tid or out[k].startswith(tid + b"."):
                        out[k] = b + out[k][len(tid) :]
                chunks.append(sep.join(out) + b"\n")
        return CommandResult(0, b"".join(chunks), "")


#: One completed one-node GPU job as sacct prints it (values from the local test cluster);
#: ``OfflineRunner`` answers with it for every asked id.
OFFLINE_ROW: dict[str, str] = {
    "JobIDRaw": "101",
    "JobID": "101",
    "State": "COMPLETED",
    "ExitCode": "0:0",
    "DerivedExitCode": "0:0",
    "User": "sgtest1",
    "UID": "1001",
    "Account": "default",
    "Partition": "gpu",
    "QOS": "normal",
    "AllocCPUS": "8",
    "NNodes": "1",
    "ReqMem": "16000M",
    "AllocTRES": "cpu=8,mem=16000M,node=1,billing=8,gres/gpu={gpus}",
    "ReqTRES": "cpu=8,mem=16000M,node=1,billing=8,gres/gpu={gpus}",
    "MaxRSS": "",
    "TotalCPU": "05:00:00",
    "ElapsedRaw": "3600",
    "Elapsed": "01:00:00",
    "TimelimitRaw": "120",
    "Timelimit": "02:00:00",
    "Submit": "1789999990",
    "Start": "1790000000",
    "End": "1790003600",
    "NodeList": "{host}",
    "JobName": "train",
    "Comment": "",
    "AdminComment": "",
    "WorkDir": "/home/sgtest1",
}


#: The batch script the offline runner gives every job (as ``sacct --batch-script`` prints it).
OFFLINE_SCRIPT = (
    b"Batch Script for 1\n" + b"-" * 80 + b"\n#!/bin/bash\n#SBATCH --gres=gpu:1\n"
    b"#SBATCH --cpus-per-task=4\n#SBATCH --mem=8G\nsrun python train.py\n"
)


def _scripts_for(ids: Sequence[str], template: bytes) -> bytes:
    """``template`` (one job's ``sacct --batch-script`` answer) once for each of ``ids``,
    its header naming that id; nothing when the template job kept no script."""
    if b"\n" not in template:
        return b""
    body = template.split(b"\n", 1)[1]
    return b"".join(b"Batch Script for " + i.encode() + b"\n" + body for i in ids)


class OfflineRunner:
    """No sacct process: every asked id answered with ``OFFLINE_ROW`` (and a batch step),
    rendered for the asked ``--format`` and ``--delimiter``. Measures the collector alone,
    without a test cluster."""

    def __init__(self, n_gpus: int, host: str) -> None:
        self.n_gpus, self.host = n_gpus, host
        self.calls = 0

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        max_stdout: int | None = None,
    ) -> CommandResult:
        self.calls += 1
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        if "--batch-script" in argv:
            return CommandResult(0, _scripts_for(ids, OFFLINE_SCRIPT), "")
        fmt = next(a for a in argv if a.startswith("--format=")).split("=", 1)[1].split(",")
        delim = next(a for a in argv if a.startswith("--delimiter=")).split("=", 1)[1]
        allocations = "--allocations" in argv
        lines = []
        for jid in ids:
            job = {k: v.format(gpus=self.n_gpus, host=self.host) for k, v in OFFLINE_ROW.items()}
            job.update(JobIDRaw=jid, JobID=jid)
            rows = [job]
            if not allocations:
                rows.append(
                    dict(
                        job,
                        JobIDRaw=f"{jid}.batch",
                        JobID=f"{jid}.batch",
                        JobName="batch",
                        MaxRSS="4000M",
                        ReqTRES="",
                    )
                )
            lines += [delim.join(r.get(f, "") for f in fmt) + "\n" for r in rows]
        return CommandResult(0, "".join(lines).encode(), "")


def make_record(job_id: str, host: str, n_gpus: int, rng: random.Random) -> NodeRecord:
    n = int(HOUR / INTERVAL_S)
    gpus = []
    utils = []
    for g in range(n_gpus):
        base = rng.uniform(20, 90)
        util = [max(0.0, min(100.0, rng.gauss(base, 15))) for _ in range(n)]
        utils.append(util)
        gpus.append(
            GpuSummary(
                info=GpuInfo(
                    uuid=f"GPU-{rng.getrandbits(128):032x}",
                    index=g,
                    minor_number=g,
                    name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * 2**30,
                    power_limit_w=400.0,
                    compute_capability=(8, 0),
                ),
                samples=n,
                samples_available=n,
                first_time_s=T0,
                last_time_s=T0 + HOUR - INTERVAL_S,
                utilization=dist(util),
                sub_samples=dist([]),
                idle_samples=sum(1 for u in util if u <= 1),
                active_first_time_s=T0,
                active_last_time_s=T0 + HOUR - INTERVAL_S,
                memory_used_max_bytes=rng.randint(10, 79) * 2**30,
                memory_used_mean_bytes=3e10,
                power_mean_w=250.0,
                power_max_w=390.0,
                energy_j=250.0 * HOUR,
                sm_clock_mean_mhz=1400.0,
                temperature_max_c=70.0,
                throttle_power_s=0.0,
                throttle_thermal_s=0.0,
                pcie_tx_mean_bytes_per_s=1e9,
                pcie_rx_mean_bytes_per_s=1e9,
                nvlink_bytes=None,
                nvlink_bytes_while_idle=None,
                ecc_corrected=0,
                ecc_uncorrected=0,
                xid_events=(),
                process_seen=True,
                max_processes=1,
                pids=(1000 + g,),
                sm_active_mean_pct=None,
                tensor_active_mean_pct=None,
            )
        )
    timeline = tuple(
        TimelinePoint(
            t_s=T0 + i * INTERVAL_S,
            width_s=INTERVAL_S,
            samples=1,
            gpu_utilization_pct=tuple(round(u[i], 1) for u in utils),
            gpu_memory_used_max_bytes=tuple(
                rng.randint(20 * 2**10, 21 * 2**10) * 2**20 for _ in range(n_gpus)
            ),
            gpu_power_w=tuple(round(rng.uniform(150, 390), 1) for _ in range(n_gpus)),
            host_cpu_cores=round(rng.uniform(1, 8), 2),
            host_rss_max_bytes=rng.randint(4000, 5000) * 2**20,
        )
        for i in range(n)
    )
    return NodeRecord(
        job_id=job_id,
        hostname=host,
        uid=1001,
        interval_s=INTERVAL_S,
        source="nvml",
        started_s=T0,
        ended_s=T0 + HOUR,
        gpus=tuple(gpus),
        host=HostSummary(
            method="cgroup2",
            samples=n,
            cpu_time_s=5 * HOUR,
            cpu_cores_busy=dist([rng.uniform(10, 90) for _ in range(n)]),
            allocated_cores=8,
            rss_max_bytes=5 * 2**30,
            rss_mean_bytes=4.5e9,
            io_read_bytes=10**10,
            io_write_bytes=10**9,
        ),
        timeline=timeline,
        complete=True,
    )


def fill_spool(spool_dir: Path, n_jobs: int, n_gpus: int, host: str, first_id: int) -> None:
    rng = random.Random(n_jobs * 31 + n_gpus)
    templates = [spool.encode_record(make_record("0", host, n_gpus, rng)) for _ in range(20)]
    for i in range(n_jobs):
        jid = str(first_id + i)
        d = spool_dir / jid
        d.mkdir(parents=True)
        data = templates[i % len(templates)].replace(b'"job_id":"0"', f'"job_id":"{jid}"'.encode())
        (d / f"{host}.record").write_bytes(data)


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's ended and waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(
    n_jobs: int, n_gpus: int, template_job: str, host: str, workdir: Path, reports: bool
) -> dict[str, float]:
    """One collector pass over ``n_jobs`` sealed records; ``reports``: with the step that
    renders each stored job's gpueff report (``[gpueff] cache_reports``, on by default)."""
    root = workdir / f"run-{n_jobs}-{n_gpus}"
    shutil.rmtree(root, ignore_errors=True)
    spool_dir, state_dir = root / "spool", root / "state"
    fill_spool(spool_dir, n_jobs, n_gpus, host, first_id=10_000_000)
    runner: RecordedRunner | OfflineRunner = (
        OfflineRunner(n_gpus, host) if template_job == "offline" else RecordedRunner(template_job)
    )
    # As the collector opens it (open_accounting): batch scripts read, one call per batch here
    # (one user).
    acc = SacctSource(batch_size=500, runner=runner, batch_scripts=True)
    url = f"sqlite:///{state_dir}/store.db"
    with Store.open(url) as store:
        collector = Collector(
            store=store,
            accounting=acc,
            spool_dir=str(spool_dir),
            state_dir=str(state_dir),
            options=CollectorOptions(batch_size=500),
        )
        if reports:
            settings = parse_settings(
                {"paths": {"state_dir": str(state_dir)}, "store": {"url": url}}, path=None
            )
            collector.reports = ReportPrerenderer(settings, store)
        load = os.getloadavg()[0]
        t, c, w = time.perf_counter(), time.process_time(), _children_cpu_s()
        report = collector.run_once(missing_pass=False)
        elapsed, cpu = time.perf_counter() - t, time.process_time() - c
        # The report worker's CPU (a child process, ended by the pass's flush): part of the
        # collector's cost, and not in ``process_time``.
        worker_cpu = _children_cpu_s() - w
        cpu += worker_cpu
    if len(report.ingested) != n_jobs:
        first_error = report.errors[0] if report.errors else "no error reported"
        raise SystemExit(f"ingested {len(report.ingested)} of {n_jobs}: {first_error}")
    db = state_dir / "store.db"
    con = sqlite3.connect(db)
    tl_bytes = con.execute("SELECT sum(length(data)) FROM timelines").fetchone()[0]
    rendered = con.execute("SELECT count(*) FROM job_reports").fetchone()[0]
    con.close()
    size = db.stat().st_size
    gpu_hours = n_jobs * n_gpus * 1.0
    shutil.rmtree(root, ignore_errors=True)
    if reports and rendered != n_jobs:
        raise SystemExit(f"rendered {rendered} reports for {n_jobs} jobs")
    return {
        "jobs": n_jobs,
        "gpus": n_gpus,
        "seconds": elapsed,
        "jobs_per_s": n_jobs / elapsed,
        "cpu_ms_per_job": cpu / n_jobs * 1e3,
        "worker_cpu_ms_per_job": worker_cpu / n_jobs * 1e3,
        "load": load,
        "sacct_calls": runner.calls,
        "db_bytes": size,
        "kb_per_gpu_hour": size / gpu_hours / 1000,
        "timeline_kb_per_gpu_hour": tl_bytes / gpu_hours / 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    ap.add_argument(
        "--template-job",
        default=None,
        help="a finished GPU job whose sacct output is replayed; 'offline': no sacct at all "
        "(a built-in job, the collector measured alone, no test cluster needed)",
    )
    ap.add_argument("--host", default=os.uname().nodename.split(".")[0])
    ap.add_argument(
        "--reports",
        choices=("off", "on", "both"),
        default="both",
        help="with the gpueff report step, without it, or both in the same run (default)",
    )
    ap.add_argument("--jsonl", help="also append one JSON line per run to this file")
    args = ap.parse_args()
    template = args.template_job or newest_gpu_job()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.reports]
    configs = [(g, n, r) for g in args.gpus for n in args.jobs for r in modes]
    results: dict[tuple[int, int, bool], list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="bench-collect-") as tmp:
        print(f"template job {template}; host {args.host}; {args.repeat} round(s)")
        # Rounds, each running every configuration once: on a shared machine a disturbance
        # then falls on one run of several configurations instead of on all runs of one.
        for k in range(args.repeat):
            for n_gpus, n, reports in configs:
                r = run(n, n_gpus, template, args.host, Path(tmp), reports)
                results[(n_gpus, n, reports)].append(r)
                print(
                    f"round {k + 1}: {n:,} jobs, {n_gpus} GPU(s), reports "
                    f"{'on' if reports else 'off'}: {r['jobs_per_s']:.0f} jobs/s, "
                    f"{r['cpu_ms_per_job']:.2f} ms CPU/job, load {r['load']:.1f}",
                    flush=True,
                )
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(dict(r, reports=reports, round=k + 1)) + "\n")
        print(
            "\n| jobs | GPUs/job | reports rendered | jobs/s median (min–max) | "
            "collector CPU ms/job median | sacct calls | load avg (1 min) | "
            "KB per GPU-hour (timelines alone) |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|")
        for (n_gpus, n, reports), runs in results.items():
            rates = sorted(r["jobs_per_s"] for r in runs)
            cpu = statistics.median(r["cpu_ms_per_job"] for r in runs)
            loads = [r["load"] for r in runs]
            r = runs[0]
            print(
                f"| {n:,} | {n_gpus} | {'yes' if reports else 'no'} | "
                f"{statistics.median(rates):.0f} "
                f"({rates[0]:.0f}–{rates[-1]:.0f}) | {cpu:.2f} | {r['sacct_calls']} | "
                f"{min(loads):.1f}–{max(loads):.1f} | {r['kb_per_gpu_hour']:.2f} "
                f"({r['timeline_kb_per_gpu_hour']:.2f}) |",
                flush=True,
            )
        from results import target_line

        for (n_gpus, n, reports), runs in results.items():
            if n_gpus == 4 and reports:
                rate = statistics.median(r["jobs_per_s"] for r in runs)
                print(
                    target_line(
                        f"collector, {n:,} jobs of 4 GPUs with reports rendered (median of "
                        f"{len(runs)})",
                        f"{rate:.0f} jobs/s",
                        "≥ 200 jobs/s",
                        rate >= 200,
                    )
                )


if __name__ == "__main__":
    main()
