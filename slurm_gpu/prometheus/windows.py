"""The live policy's evidence from Prometheus: each running GPU over the policy's window.

Every figure comes from Prometheus' own record, so that a node's clock and a Prometheus restart
cannot make a busy GPU look idle:

- ``max_over_time(slurm_gpu_gpu_utilization_ratio[W])`` of every GPU, and for the GPUs at or
  below the idle threshold ``count_over_time(...)``: the highest duty cycle over the whole
  window at scrape resolution, and how many scrapes hold it;
- the busy-seconds and sampled-seconds counters' growth over the window (``max_over_time -
  min_over_time``, with ``resets()`` of the sampled counter: a sampler restart voids them);
- ``timestamp()`` of the utilisation and last-sample series: when Prometheus scraped them
  (freshness by Prometheus' clock), and ``changes()`` of the last-sample series over the
  freshness bound (the node's readings advance: frozen data are told apart);
- the instant series for the since-start counters, ``first_active`` and the node's times (skew,
  shown only; the node's start-to-last-reading span, a difference of its own times);
- each GPU's ``gpu_index`` label now (an instant query of ``slurm_gpu_gpu_available``, which
  every GPU series set has): the number Slurm names the GPU by on its node, which the policy
  checks against Slurm's allocation. The window answers group without it, so a GPU's series
  from before and after an exporter upgrade stay one GPU.

A GPU above the threshold somewhere in the window is busy whatever else is said of it, so the
second signal and the rest are read (``detail_queries``) only for the jobs with a GPU at or
below the threshold, named by job id: a pass over 10,000 busy jobs reads four small answers.

Series are kept apart by the scrape target Prometheus attached (``target_label``, by default
``instance``: with ``honor_labels`` off no exporter can set it), so the policy can check that a
series' ``host`` is the node that was scraped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from slurm_gpu.prometheus.client import PrometheusClient, Sample
from slurm_gpu.records import GpuWindow, PartWindow

_JOB_ID = re.compile(r"[0-9]{1,20}")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_UTIL = "slurm_gpu_gpu_utilization_ratio"
_BUSY = "slurm_gpu_gpu_busy_seconds_total"
_SAMPLED = "slurm_gpu_gpu_sampled_seconds_total"
_LAST = "slurm_gpu_job_last_sample_timestamp_seconds"
_START = "slurm_gpu_job_start_timestamp_seconds"
_FIRST = "slurm_gpu_gpu_first_active_timestamp_seconds"
_AVAILABLE = "slurm_gpu_gpu_available"


#: Most job ids named in one detail query (a regular expression of alternatives, which
#: Prometheus answers from its index): keeps a query's URL short.
DETAIL_CHUNK = 500


def _groups(target_label: str) -> tuple[str, str]:
    if not _LABEL_NAME.fullmatch(target_label):
        raise ValueError(f"not a label name: {target_label!r}")
    part = ", ".join(dict.fromkeys(("job_id", "host", "job", "instance", target_label)))
    return part, f"{part}, gpu_uuid"


def _range(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def window_queries(
    window_s: float, fresh_s: float, threshold_pct: float = 1.0, target_label: str = "instance"
) -> dict[str, str]:
    """The PromQL read for every running job (``window_s``: the policy's idle window;
    ``fresh_s``: the freshness bound): each job's last reading, its scrape time and whether
    it advanced, each GPU's utilisation maximum over the window and its ``gpu_index`` now.
    Answers keep only the labels the policy reads. (``threshold_pct`` is not used here: the
    same signature as ``detail_queries``.)"""
    part, gpu = _groups(target_label)
    w, f = _range(window_s), _range(fresh_s)
    return {
        "last": f"max by ({part}, user, account) ({_LAST})",
        "scraped": f"max by ({part}) (timestamp({_LAST}))",
        "changes": f"max by ({part}) (changes({_LAST}[{f}]))",
        "util_max": f"max by ({gpu}) (max_over_time({_UTIL}[{w}]))",
        "gpu_index": f"max by ({gpu}, gpu_index) ({_AVAILABLE})",
    }


def detail_queries(
    job_ids: Iterable[str], window_s: float, target_label: str = "instance"
) -> dict[str, str]:
    """The PromQL of the second signal and the rest, for the jobs with a GPU at or below the
    threshold only (the only ones the policy may act on; a job id is digits, checked)."""
    ids = sorted(set(job_ids), key=int)
    if not ids or not all(_JOB_ID.fullmatch(j) for j in ids):
        raise ValueError("detail queries need raw job ids")
    part, gpu = _groups(target_label)
    w = _range(window_s)
    sel = f'job_id=~"{"|".join(ids)}"'
    util, busy, sampled = (f"{m}{{{sel}}}" for m in (_UTIL, _BUSY, _SAMPLED))
    last, start, first = (f"{m}{{{sel}}}" for m in (_LAST, _START, _FIRST))
    return {
        "span": f"max by ({part}) ({last}) - on({part}) max by ({part}) ({start})",
        "util_scraped": f"max by ({gpu}) (timestamp({util}))",
        "util_points": f"max by ({gpu}) (count_over_time({util}[{w}]))",
        "busy_growth": f"max by ({gpu}) (max_over_time({busy}[{w}]) - min_over_time({busy}[{w}]))",
        "sampled_growth": (
            f"max by ({gpu}) (max_over_time({sampled}[{w}]) - min_over_time({sampled}[{w}]))"
        ),
        "resets": f"max by ({gpu}) (resets({sampled}[{w}]))",
        "busy_s": f"max by ({gpu}) ({busy})",
        "sampled_s": f"max by ({gpu}) ({sampled})",
        "first_active": f"max by ({gpu}) ({first})",
    }


def target_host(value: str) -> str:
    """The host of a target label value: ``node-1.example.org:9817`` -> ``node-1``,
    ``[fe80::1]:9817`` -> ``fe80::1``; no port: the value's first DNS label."""
    v = value.strip()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.split(".", 1)[0] if not v.replace(".", "").isdigit() else v


def same_host(target: str, host: str) -> bool:
    """Whether a scrape target's host (``target_host``) is the node ``host`` (short names
    compared)."""
    if not target or not host:
        return False
    return target == host or target.split(".", 1)[0] == host.split(".", 1)[0]


@dataclass(slots=True)
class _Gpu:
    values: dict[str, float] = field(default_factory=dict)
    indices: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Part:
    user: str = ""
    account: str = ""
    sources: set[tuple[str, str, str]] = field(default_factory=set)
    values: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, _Gpu] = field(default_factory=dict)


def _key(s: Sample) -> tuple[str, str] | None:
    jid, host = s.labels.get("job_id", ""), s.labels.get("host", "")
    if not _JOB_ID.fullmatch(jid) or not host:
        return None
    return jid, host


def _source(s: Sample, target_label: str) -> tuple[str, str, str]:
    labels = s.labels
    return labels.get("instance", ""), labels.get("job", ""), labels.get(target_label, "")


def assemble(
    answers: Mapping[str, Sequence[Sample]], now_s: float, window_s: float, target_label: str
) -> list[PartWindow]:
    """``PartWindow``s from the answers of ``window_queries`` (pure: the tests feed it).

    A job and host exist only where a target serves its last-sample series now (the
    ``scraped`` answer, an instant query): the window answers of a target that stopped
    serving it (an exporter killed, hung, or replaced) linger for the window's length and are
    left out, so they neither stand for data nor count as a second source."""
    current: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
    for s in answers.get("scraped", ()):
        key = _key(s)
        if key is not None:
            current.setdefault(key, set()).add(_source(s, target_label))
    # The answers hold a series per job or per GPU (71,500 samples for 10,000 running jobs
    # of 2 GPUs, one in a hundred idle): the loop does only what differs between samples. A
    # key is looked up as it stands: ``current`` holds only keys ``_key`` accepted, so
    # another answer's sample with a malformed job id or no host is dropped by that lookup.
    parts: dict[tuple[str, str], _Part] = {}
    for what, samples in answers.items():
        is_index, is_last = what == "gpu_index", what == "last"
        for s in samples:
            labels = s.labels
            key = (labels.get("job_id", ""), labels.get("host", ""))
            served = current.get(key)
            if served is None:
                continue
            source = _source(s, target_label)
            if source not in served:
                continue
            p = parts.get(key)
            if p is None:
                p = parts[key] = _Part()
            p.sources.add(source)
            uuid = labels.get("gpu_uuid", "")
            if uuid:
                g = p.gpus.get(uuid)
                if g is None:
                    g = p.gpus[uuid] = _Gpu()
                if is_index:
                    g.indices.add(labels.get("gpu_index", ""))
                else:
                    g.values[what] = s.value
            else:
                if is_last:
                    p.user = p.user or labels.get("user", "")
                    p.account = p.account or labels.get("account", "")
                p.values[what] = s.value
    out = []
    for (jid, host), p in sorted(parts.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        last = p.values.get("last")
        scraped = p.values.get("scraped")
        changes = p.values.get("changes")
        out.append(
            PartWindow(
                job_id=jid,
                host=host,
                user=p.user,
                account=p.account,
                targets=tuple(sorted({target_host(src[2]) for src in p.sources})),
                scrape_jobs=tuple(sorted({src[1] for src in p.sources})),
                sources=len(p.sources),
                seen_age_s=None if scraped is None else max(0.0, now_s - scraped),
                advanced=None if changes is None else changes > 0,
                skew_s=None if scraped is None or last is None else scraped - last,
                span_s=p.values.get("span"),
                gpus=tuple(_gpu(u, g, now_s, window_s) for u, g in sorted(p.gpus.items())),
            )
        )
    return out


def _gpu(uuid: str, g: _Gpu, now_s: float, window_s: float) -> GpuWindow:
    v = g.values
    util_max = v.get("util_max")
    scraped = v.get("util_scraped")
    return GpuWindow(
        uuid=uuid,
        util_max_pct=None if util_max is None else 100.0 * util_max,
        util_points=int(v.get("util_points", 0)),
        busy_growth_s=v.get("busy_growth"),
        sampled_growth_s=v.get("sampled_growth"),
        window_s=window_s,
        counter_reset=v.get("resets", 0.0) > 0,
        # Known for the GPUs at or below the threshold only (the others' is not read).
        ever_used=("first_active" in v) if "util_points" in v else None,
        busy_s=v.get("busy_s"),
        sampled_s=v.get("sampled_s"),
        seen_age_s=None if scraped is None else max(0.0, now_s - scraped),
        gpu_index=tuple(sorted(g.indices)),
    )


def read_windows(
    client: PrometheusClient,
    window_s: float,
    fresh_s: float,
    now_s: float,
    target_label: str = "instance",
    threshold_pct: float = 1.0,
) -> list[PartWindow]:
    """Every running job's parts over the window, evaluated at ``now_s`` (one ``time`` for
    every query, so the answers describe the same moment); the queries of each step run
    side by side. Raises the client's ``PrometheusUnavailableError``."""
    answers = _ask(client, window_queries(window_s, fresh_s, threshold_pct, target_label), now_s)
    limit = threshold_pct / 100.0
    candidates = sorted(
        {
            s.labels["job_id"]
            for s in answers["util_max"]
            if s.value <= limit and _JOB_ID.fullmatch(s.labels.get("job_id", ""))
        },
        key=int,
    )
    for i in range(0, len(candidates), DETAIL_CHUNK):
        chunk = candidates[i : i + DETAIL_CHUNK]
        for what, samples in _ask(
            client, detail_queries(chunk, window_s, target_label), now_s
        ).items():
            answers.setdefault(what, []).extend(samples)
    return assemble(answers, now_s, window_s, target_label)


def _ask(
    client: PrometheusClient, queries: Mapping[str, str], now_s: float
) -> dict[str, list[Sample]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {what: pool.submit(client.query, q, now_s) for what, q in queries.items()}
        return {what: f.result() for what, f in futures.items()}
