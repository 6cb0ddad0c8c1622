"""Per-job summaries in Slurm's ``AdminComment``, in the ``JS1:`` encoding of jobstats.

``JS1:`` + base64(gzip(JSON)), where the JSON is the shape jobstats writes and reportseff 2.x
reads (``reportseff --format +GPUEff,GPUMem``)::

    {"gpus": 2, "total_time": 3600,              # GPUs allocated; elapsed seconds
     "nodes": {"gpu01": {
        "cpus": 8, "total_time": 20000.5,        # allocated cores; CPU seconds used
        "total_memory": 68719476736,             # memory allocated on the node, bytes
        "used_memory": 1234567890,               # peak RSS, bytes
        "gpu_total_memory": {"0": 85899345920},  # per GPU (key: minor number), bytes
        "gpu_used_memory":  {"0": 4294967296},   # peak, bytes
        "gpu_utilization":  {"0": 42.5}}}}       # mean duty cycle, percent

A key is written only when its value is known, and ``total_memory`` / ``gpu_total_memory`` only
when positive, because reportseff divides by them; ``cpus`` only together with the node's
``total_time`` (reportseff reads one whenever the other is there).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from slurm_gpu.accounting.runner import CommandRunner, SubprocessRunner
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.textsafe import clean_command_message

PREFIX = "JS1:"
#: Largest encoded comment we write; a summary of 8 GPUs on one node is about 300 bytes.
MAX_ENCODED_BYTES = 16 * 1024


class AdminCommentCaseError(AccountingError):
    """sacctmgr stored the comment lower-cased (Slurm 22.05), so no summary it writes survives:
    callers should stop writing rather than ask slurmdbd again for every job."""


def sacctmgr_path_for(sacctmgr_path: str, sacct_path: str) -> str:
    """The sacctmgr to run: ``sacctmgr_path`` when set, else the one beside an absolute
    ``sacct_path`` (the two ship together), else ``sacctmgr`` from PATH."""
    if sacctmgr_path:
        return sacctmgr_path
    if os.path.isabs(sacct_path):
        return os.path.join(os.path.dirname(sacct_path), "sacctmgr")
    return "sacctmgr"


def build_summary(job: JobRecord, nodes: Sequence[NodeRecord]) -> dict[str, Any]:
    """The jobstats-shaped summary of one job from its sealed per-node records."""
    node_count = len(nodes) or 1
    per_node_mem = job.req_mem_bytes // node_count if job.req_mem_bytes else None
    out_nodes: dict[str, dict[str, Any]] = {}
    gpu_count = 0
    for node in nodes:
        entry: dict[str, Any] = {}
        host = node.host
        cpus = host.allocated_cores if host and host.allocated_cores else None
        if cpus is None and job.alloc_cpus:
            cpus = max(1, job.alloc_cpus // node_count)
        # reportseff divides the node's total_time by cpus whenever cpus is non-zero and
        # raises KeyError without total_time: write both or neither.
        if cpus and host and host.cpu_time_s is not None:
            entry["cpus"] = cpus
            entry["total_time"] = round(host.cpu_time_s, 1)
        if per_node_mem and per_node_mem > 0:
            entry["total_memory"] = per_node_mem
            if host and host.rss_max_bytes is not None:
                entry["used_memory"] = host.rss_max_bytes
        totals: dict[str, int] = {}
        used: dict[str, int] = {}
        util: dict[str, float] = {}
        for position, gpu in enumerate(node.gpus):
            gpu_count += 1
            info = gpu.info
            key = str(
                info.minor_number
                if info.minor_number is not None
                else info.index
                if info.index is not None
                else position
            )
            mean = gpu.utilization.mean
            if mean is not None:
                util[key] = round(mean, 1)
            if info.memory_total_bytes:
                totals[key] = info.memory_total_bytes
                used[key] = gpu.memory_used_max_bytes or 0
        if util:
            entry["gpu_utilization"] = util
        # reportseff iterates gpu_total_memory and divides by it: all GPUs or none.
        if totals and len(totals) == len(node.gpus):
            entry["gpu_total_memory"] = totals
            entry["gpu_used_memory"] = used
        out_nodes[node.hostname] = entry
    gpus = job.alloc_tres.gpus if job.alloc_tres.gpus is not None else gpu_count
    return {"gpus": gpus, "nodes": out_nodes, "total_time": job.elapsed_s}


def encode(summary: dict[str, Any]) -> str:
    """``JS1:`` + base64(gzip(compact JSON)); deterministic (gzip mtime 0).

    Raises ``AccountingError`` when the result would exceed ``MAX_ENCODED_BYTES``.
    """
    data = json.dumps(summary, separators=(",", ":"), sort_keys=True).encode("ascii")
    text = PREFIX + base64.b64encode(gzip.compress(data, mtime=0)).decode("ascii")
    if len(text) > MAX_ENCODED_BYTES:
        raise AccountingError(
            f"job summary is {len(text)} bytes, more than {MAX_ENCODED_BYTES}",
            hint="the job has too many nodes to summarise in AdminComment",
        )
    return text


def decode(comment: str) -> dict[str, Any]:
    """Decode a ``JS1:`` comment. Raises ``AccountingError`` for another version, a comment
    that is not a job summary, or corrupt data."""
    if not comment.startswith("JS"):
        raise AccountingError(
            "AdminComment is not a job summary", hint="it does not start with 'JS1:'"
        )
    version = comment.split(":", 1)[0]
    if version != "JS1":
        raise AccountingError(
            f"unknown job summary version {version!r}",
            hint="this slurm-gpu reads JS1 only; upgrade slurm-gpu",
        )
    try:
        data = json.loads(gzip.decompress(base64.b64decode(comment[len(PREFIX) :], validate=True)))
    except (binascii.Error, OSError, EOFError, ValueError) as exc:
        raise AccountingError(
            f"corrupt JS1 job summary ({type(exc).__name__})",
            hint="rewrite it with 'slurm-gpu admincomment JOBID'",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict) or "gpus" not in data:
        raise AccountingError(
            "JS1 job summary lacks 'nodes' or 'gpus'",
            hint="rewrite it with 'slurm-gpu admincomment JOBID'",
        )
    return data


def sacctmgr_target(job: JobRecord) -> str:
    """The id to name in ``sacctmgr modify job where jobid=…``.

    An array task must be named ``ARRAYID_TASKID``: ``jobid=<array id>`` modifies every task
    of the array. Everything else is named by its raw id.
    """
    if job.array_job_id is not None and job.array_task_id and job.array_task_id.isdigit():
        return f"{job.array_job_id}_{job.array_task_id}"
    return job.job_id


class AdminCommentWriter:
    """Writes summaries with ``sacctmgr -i modify job where jobid=ID set AdminComment=…``.

    slurmdbd refuses the change for a few seconds after a job ends (the job row is still being
    completed), so a failed attempt is retried every ``retry_delay_s`` for ``retry_for_s``.
    ``scontrol update`` is no alternative for finished jobs: it fails with "Job has already
    finished" (from EpilogSlurmctld too); ``write_running`` uses it for jobs still running.

    Measured on Slurm 22.05.8: sacctmgr stores the value lower-cased (``JS1:AbC`` becomes
    ``js1:abc``), which destroys base64. ``write`` therefore reads the comment back with sacct
    and raises ``AccountingError`` when it did not survive.
    """

    def __init__(
        self,
        *,
        sacctmgr_path: str = "sacctmgr",
        sacct_path: str = "sacct",
        scontrol_path: str = "scontrol",
        verify: bool = True,
        timeout_s: float = 30.0,
        retry_for_s: float = 10.0,
        retry_delay_s: float = 1.0,
        runner: CommandRunner | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sacctmgr_path = sacctmgr_path
        self.sacct_path = sacct_path
        self.scontrol_path = scontrol_path
        self.verify = verify
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self.retry_delay_s = retry_delay_s
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.sleep = sleep
        self.clock = clock

    def argv(self, target: str, comment: str) -> list[str]:
        """The sacctmgr command line (exposed for tests and ``--dry-run``)."""
        return [
            self.sacctmgr_path,
            "-i",
            "modify",
            "job",
            "where",
            f"jobid={target}",
            "set",
            f"AdminComment={comment}",
        ]

    def write(self, job: JobRecord, comment: str) -> int:
        """Write ``comment`` into the job's AdminComment; returns the attempts it took.

        Raises ``AccountingError`` with sacctmgr's message when every attempt failed.
        """
        _check_js1(comment)
        target = sacctmgr_target(job)
        deadline = self.clock() + self.retry_for_s
        attempts = 0
        while True:
            attempts += 1
            done = self.runner(self.argv(target, comment), env={}, timeout_s=self.timeout_s)
            out = done.stdout.decode("utf-8", "replace")
            if done.returncode == 0 and "nothing modified" not in out.lower():
                if self.verify:
                    self._check_stored(job, target, comment)
                return attempts
            if self.clock() >= deadline:
                message = (done.stderr or out).strip().splitlines()
                raise AccountingError(
                    f"sacctmgr could not set AdminComment of job {target} after {attempts} "
                    f"attempts: {message[-1] if message else 'exit ' + str(done.returncode)}",
                    stderr=done.stderr,
                    hint="run as root or a Slurm operator (AdminComment needs admin rights), "
                    "and check that slurmdbd runs",
                )
            self.sleep(self.retry_delay_s)

    def write_running(self, job: JobRecord, comment: str) -> None:
        """Write ``comment`` with ``scontrol update`` while the job still runs (keeps case on
        every Slurm version). Raises ``AccountingError`` when slurmctld refuses."""
        _check_js1(comment)
        argv = [
            self.scontrol_path,
            "update",
            f"jobid={sacctmgr_target(job)}",
            f"AdminComment={comment}",
        ]
        done = self.runner(argv, env={}, timeout_s=self.timeout_s)
        if done.returncode != 0:
            raise AccountingError(
                f"scontrol could not set AdminComment of job {job.job_id_display}: "
                f"{clean_command_message(done.stderr)} (exit {done.returncode})",
                stderr=done.stderr,
                hint="scontrol update works only while the job is known to slurmctld and not "
                "finished; use write() after the job ends",
            )

    def _check_stored(self, job: JobRecord, target: str, comment: str) -> None:
        argv = [self.sacct_path, "-X", "-n", "-P", f"--jobs={target}", "--format=AdminComment"]
        done = self.runner(argv, env={}, timeout_s=self.timeout_s)
        stored = done.stdout.decode("utf-8", "replace").strip().splitlines()
        if done.returncode != 0 or not stored:
            return  # cannot tell; sacctmgr said it succeeded
        if stored[0] == comment:
            return
        if stored[0] == comment.lower():
            raise AdminCommentCaseError(
                f"sacctmgr stored the AdminComment of job {target} lower-cased, which breaks "
                "the JS1 encoding",
                hint="this Slurm's sacctmgr lower-cases AdminComment (seen on 22.05); upgrade "
                "Slurm (scontrol update keeps the case, but only while the job runs)",
            )
        raise AccountingError(
            f"AdminComment of job {target} reads back different from what was written",
            hint="another tool may be writing AdminComment too",
        )


def _check_js1(comment: str) -> None:
    if not comment.startswith(PREFIX) or any(c.isspace() for c in comment):
        raise AccountingError(
            "refusing to write an AdminComment that is not a JS1 summary",
            hint="build it with slurm_gpu.accounting.admincomment.encode",
        )
