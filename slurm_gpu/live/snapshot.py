"""The samplers' live summaries on this node, read bounded and cleaned where they enter.

A sampler rewrites ``<spool_dir>-live/<job>/<host>.json`` every ``LIVE_INTERVAL_S``
(``capture.sampler``); this module lists them, reads each through ``capture.livefile.read_live``
(no link followed, at most ``LIVE_MAX_BYTES``) and turns each into a typed ``LiveJob``: every
number checked finite, every string (user, account, partition, host, GPU UUID) cleaned by
``textsafe`` here, once, so that the exposition and the views print them as they are.
"""

from __future__ import annotations

import os
import re
from typing import Any

from slurm_gpu.capture.livefile import read_live
from slurm_gpu.capture.spoolpaths import live_dir_of
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.records import LiveGpu, LiveJob, NodeSnapshot
from slurm_gpu.textsafe import clean_user_text

#: Most live summaries read per pass: bounds a scrape's cost and the series it exposes.
MAX_SUMMARIES = 4096
#: Most GPUs taken from one summary.
MAX_GPUS_PER_SUMMARY = 64
#: Longest label value kept, characters.
MAX_LABEL_LEN = 128

_JOB_DIR = re.compile(r"[0-9]{1,20}")
_HOST_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}\.json")


#: Integers beyond this magnitude are not numbers here (``float()`` of them overflows).
_MAX_INT = 2**1023


def _num(value: Any) -> float | None:
    """``value`` as a finite float; ``None`` for anything else (a bool, a string, NaN,
    infinity). Exact type tests (JSON gives plain ``int`` and ``float``; ``bool`` is not
    ``int`` here): this runs about 900 times per scrape of 64 GPUs."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0.0 else None  # NaN and infinities give NaN
    if kind is int and -_MAX_INT < value < _MAX_INT:
        return float(value)
    return None


def _int(value: Any) -> int | None:
    f = _num(value)
    return None if f is None or f < 0 else int(f)


#: Largest GPU number kept (Slurm's GPU indices and device minor numbers are small).
MAX_GPU_INDEX = 65535


def _index(value: Any) -> int | None:
    """A GPU's number: a JSON whole number 0..``MAX_GPU_INDEX``; ``None`` for anything else."""
    return value if type(value) is int and 0 <= value <= MAX_GPU_INDEX else None


def _text(value: Any, default: str = "") -> str:
    return clean_user_text(value, MAX_LABEL_LEN) if isinstance(value, str) else default


def _gpu(d: Any) -> LiveGpu | None:
    if not isinstance(d, dict) or not isinstance(d.get("uuid"), str):
        return None
    get = d.get
    return LiveGpu(
        _text(d["uuid"]),
        get("available", True) is not False,
        _num(get("utilization_pct")),
        _num(get("utilization_recent_pct")),
        _num(get("utilization_mean_pct")),
        _num(get("recent_window_s")),
        _num(get("busy_s")),
        _num(get("sampled_s")),
        _num(get("idle_since_s")),
        _num(get("active_first_s")),
        _int(get("memory_used_bytes")),
        _int(get("memory_total_bytes")),
        _int(get("memory_used_max_bytes")),
        _num(get("power_w")),
        _num(get("energy_j")),
        # A sampler from before gpu_index matched SLURM_JOB_GPUS by the minor number, which
        # both sources (NVML, virtual) know for every whole GPU.
        _index(get("gpu_index") if "gpu_index" in d else get("minor_number")),
    )


def parse_summary(body: dict[str, Any]) -> LiveJob:
    """A ``LiveJob`` from a summary ``read_live`` returned; ``SpoolFormatError`` when it
    lacks the job id, host or times."""
    job_id, host = body.get("job_id"), body.get("hostname")
    started, updated = _num(body.get("started_s")), _num(body.get("updated_s"))
    if not isinstance(job_id, str) or not _JOB_DIR.fullmatch(job_id) or not isinstance(host, str):
        raise SpoolFormatError("live summary without a job id or host")
    if started is None or updated is None:
        raise SpoolFormatError("live summary without its times")
    raw_gpus = body.get("gpus")
    gpus = tuple(
        g
        for g in (_gpu(d) for d in (raw_gpus if isinstance(raw_gpus, list) else ()))
        if g is not None
    )[:MAX_GPUS_PER_SUMMARY]
    h = body.get("host")
    h = h if isinstance(h, dict) else {}
    uid = body.get("uid")
    return LiveJob(
        job_id=job_id,
        host=_text(host),
        user=_text(body.get("user")),
        account=_text(body.get("account")),
        partition=_text(body.get("partition")),
        uid=uid if isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0 else None,
        started_s=started,
        updated_s=updated,
        interval_s=_num(body.get("interval_s")) or 0.0,
        cpu_time_s=_num(h.get("cpu_time_s")),
        rss_bytes=_int(h.get("rss_bytes")),
        allocated_cores=_int(h.get("allocated_cores")),
        gpus=gpus,
    )


def read_node(spool_dir: str, now_s: float, stale_after_s: float) -> NodeSnapshot:
    """Every live summary under ``spool_dir``'s live directory, newest reading at most
    ``stale_after_s`` old; at most ``MAX_SUMMARIES``. A missing live directory is an empty
    node (no job has run yet)."""
    root = live_dir_of(spool_dir)
    jobs: list[LiveJob] = []
    stale = unreadable = seen = 0
    try:
        job_dirs = sorted((d for d in os.listdir(root) if _JOB_DIR.fullmatch(d)), key=int)
    except OSError:
        job_dirs = []
    for job in job_dirs:
        try:
            names = sorted(
                n for n in os.listdir(os.path.join(root, job)) if _HOST_FILE.fullmatch(n)
            )
        except OSError:
            continue  # the job ended between the two listings
        for name in names:
            seen += 1
            if seen > MAX_SUMMARIES:
                unreadable += 1
                continue
            try:
                live = parse_summary(read_live(os.path.join(root, job, name)))
            except SpoolFormatError:
                unreadable += 1
                continue
            if live.job_id != job:
                unreadable += 1
            elif now_s - live.updated_s > stale_after_s:
                stale += 1
            else:
                jobs.append(live)
    return NodeSnapshot(jobs=tuple(jobs), stale=stale, unreadable=unreadable)
