"""Turn what ``benchmarks/device_record.py`` brought back from a GPU machine into recorded traces.

The node records are the real sampler's, sealed by the real epilog on the real driver. There
was no Slurm on that machine, so each job's accounting record is composed here from what the
recording script ran and measured: its start and end, exit code, the cores it was pinned to,
one GPU, the CPU time and peak memory the sampler measured, and a stated request (``--mem``,
``--time``) that the job was not held to. The file's ``recorded`` block says all of this.

Usage::

    python benchmarks/device_traces.py /path/to/device-output          # print the diagnoses
    python benchmarks/device_traces.py /path/to/device-output --write tests/data/traces
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpu.capture.recordcodec import from_jsonable  # noqa: E402
from slurm_gpu.capture.spool import read_record  # noqa: E402
from slurm_gpu.config import AnalysisSettings  # noqa: E402
from slurm_gpu.evaluation.recorded import dump_trace, write_trace  # noqa: E402
from slurm_gpu.evaluation.score import evaluate_trace  # noqa: E402
from slurm_gpu.evaluation.traces import LABELS, TOLERATED, Trace  # noqa: E402
from slurm_gpu.records import JobRecord, JobStep, NodeRecord  # noqa: E402

#: Workload (benchmarks/device_workloads.py) -> the corpus pattern whose labels it carries.
PATTERN = {
    "healthy": "healthy",
    "small-batch": "small-batch",
    "dataloader": "dataloader",
    "cpu-tail": "idle-tail",
    # One GPU: rank 0 keeps it busy, rank 1 holds a context and waits; nothing is lost on the
    # GPU, so nothing is to be found there (the GPU-side view of "one of two processes idle").
    "two-procs-one-idle": "healthy",
    # Every core feeding the GPU at a moderate duty cycle: host-bound (cause 2).
    "host-bound": "host-bound",
    # Four ranks time-sliced on the job's only GPU, which they kept busy (80 % duty on an H200):
    # the rules' note (RANKS_SHARE_GPU, info), not the binding fault of the synthetic
    # ranks-one-gpu, whose other allocated GPUs sit idle (cause 6 is not true here). The ranks
    # train in fp32 without autocast, so what is true of the job is no-amp's cause 3.
    "ranks-one-gpu": "no-amp",
    # Ended by the time limit mid-step: an outcome, whatever the GPU did before.
    "killed-at-limit": "timeout-steps",
}

#: The jobs last ~45 s: the same scaled thresholds as the demo traces of the local cluster.
ANALYSIS: dict[str, Any] = {"idle_edge_min_s": 10.0, "min_elapsed_s": 10, "time_unused_min_s": 600}

REQ_MEM_BYTES = 8 * 2**30
"""The request the composed record states (not enforced on the GPU machine), bytes."""
TIME_LIMIT_S = 600


def compose_job(job: dict[str, Any], node: NodeRecord, gpu_type: str) -> JobRecord:
    cores = int(job["cores"])
    raw = f"billing={cores},cpu={cores},gres/gpu:{gpu_type}=1,gres/gpu=1,mem=8G,node=1"
    tres = {
        "billing": cores,
        "cpus": cores,
        "gpu_types": [[gpu_type, 1]],
        "gpus": 1,
        "mem_bytes": REQ_MEM_BYTES,
        "nodes": 1,
        "raw": raw,
    }
    host = node.host
    start = float(job["start_s"])
    end = float(job["end_s"])
    limit = job.get("time_limit")
    ranks = len((job.get("workload") or {}).get("ranks") or ()) or 1
    # The job's one srun step, as accounting keeps it: its tasks, and how it ended (at the
    # time limit Slurm's SIGTERM leaves the step CANCELLED 0:15, or SIGKILL's 0:9).
    step_state, step_signal = "COMPLETED", 0
    if limit:
        step_state, step_signal = ("FAILED", 9) if limit.get("sigkill") else ("CANCELLED", 15)
    elif int(job["exit_code"]) != 0:
        step_state = "FAILED"
    step = JobStep(
        "0",
        cores,
        1,
        1,
        step_state,
        0 if limit else max(0, int(job["exit_code"])),
        step_signal,
        round(float(job["work_end_s"]) - float(job["work_start_s"])),
        host.cpu_time_s if host else None,
        tasks=ranks,
        end_s=float(round(float(job["work_end_s"]))),
    )
    state = "COMPLETED" if int(job["exit_code"]) == 0 else "FAILED"
    if limit:
        state = "TIMEOUT"
    data = {
        "account": "device",
        "alloc_cpus": cores,
        "alloc_tres": tres,
        "req_tres": tres,
        "elapsed_s": round(end - start),
        "end_s": float(round(end)),
        "start_s": float(round(start)),
        "submit_s": float(round(start)),
        "exit_code": 0 if limit else int(job["exit_code"]),
        "exit_signal": 0,
        "derived_exit_code": 0,
        "job_id": str(job["job_id"]),
        "job_id_display": str(job["job_id"]),
        "job_name": f"device-{job['pattern']}",
        "max_rss_bytes": host.rss_max_bytes if host else None,
        "nodelist": [node.hostname],
        "partition": "gpu",
        "qos": "normal",
        "req_mem_bytes": REQ_MEM_BYTES,
        "restarts": 0,
        "state": state,
        "time_limit_s": round(float(limit["time_limit_s"])) if limit else TIME_LIMIT_S,
        "total_cpu_s": host.cpu_time_s if host else None,
        "uid": node.uid,
        "user": "root",
        "work_dir": "/tmp",
        **dict.fromkeys(
            (
                "admin_comment",
                "array_job_id",
                "array_task_id",
                "cancelled_by_uid",
                "comment",
                "het_job_id",
                "het_job_offset",
                "mail_type",
                "mail_user",
            ),
        ),
    }
    record = from_jsonable(JobRecord, data)
    return dataclasses.replace(record, steps=(step,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the folder device_record.py's output was fetched to")
    parser.add_argument("--write", help="write the traces to this folder")
    args = parser.parse_args()
    src = Path(args.source)
    device = json.loads((src / "device.json").read_text())
    facts = device["facts"]
    name, _uuid, driver = (s.strip() for s in facts["nvidia_smi"].split(",")[:3])
    gpu_type = "h100" if "H100" in name else name.split()[1].lower()
    for job in device["jobs"]:
        if not job.get("record"):
            print(f"{job['pattern']}: no record ({job.get('error')})")
            continue
        node = read_record(str(src / job["record"]))
        record = compose_job(job, node, gpu_type)
        pattern = PATTERN[job["pattern"]]
        trace = Trace(
            name=job["pattern"],
            pattern=pattern,
            seed=0,
            job=record,
            nodes=(node,),
            labels=LABELS.get(pattern, frozenset()),
            tolerated=TOLERATED.get(pattern, frozenset()),
        )
        result = evaluate_trace(trace, dataclasses.replace(AnalysisSettings(), **ANALYSIS))
        g = node.gpus[0]
        print(
            f"{job['pattern']:>20} -> {pattern:<18} {', '.join(result.codes) or '(none)'}"
            f"  | mean duty {g.utilization.mean:.2f} %"
        )
        if args.write and pattern in LABELS:
            data = dump_trace(
                record,
                [node],
                pattern,
                analysis=ANALYSIS,
                recorded={
                    "cluster": f"one {name} (driver {driver}), no Slurm: real prolog, sampler "
                    "(NVML, every 1 s) and epilog; job record composed by "
                    "benchmarks/device_traces.py",
                    "command": "benchmarks/device_record.py --install",
                    "date": device["date"][:10],
                    "gpu": name,
                    "driver": driver,
                    "torch": facts.get("torch"),
                    "nvidia_ml_py": facts.get("nvidia_ml_py"),
                    "workload": f"benchmarks/device_workloads.py {job['pattern']} "
                    f"{job.get('workload_args', '')}".strip(),
                    "workload_report": job.get("workload"),
                    "time_limit": job.get("time_limit"),
                },
            )
            print("  wrote", write_trace(args.write, data))


if __name__ == "__main__":
    main()
