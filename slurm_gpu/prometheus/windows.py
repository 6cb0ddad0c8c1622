"""The live policy's evidence from Prometheus: each running GPU over the policy's window.

Every figure comes from Prometheus' own record, so that a node's clock and a Prometheus restart
cannot make a busy GPU look idle:

- ``max_over_time(slurm_gpu_gpu_utilization_ratio[W])`` and ``count_over_time(...)``: the
  highest duty cycle over the whole window at scrape resolution, and how many scrapes hold it;
- the busy-seconds and sampled-seconds counters' growth over the window (``max_over_time -
  min_over_time``, with ``resets()`` of the sampled counter: a sampler restart voids them);
- ``timestamp()`` of the utilisation and last-sample series: when Prometheus scraped them
  (freshness by Prometheus' clock), and ``changes()`` of the last-sample series over the
  freshness bound (the node's readings advance: frozen data are told apart);
- the instant series for the since-start counters, ``first_active`` and the node's times (skew,
  shown only; the node's start-to-last-reading span, a difference of its own times).

Series are kept apart by the scrape target Prometheus attached (``target_label``, by default
``instance``: with ``honor_labels`` off no exporter can set it), so the policy can check that a
series' ``host`` is the node that was scraped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_gpu.prometheus.client import PrometheusClient, Sample
from slurm_gpu.records import GpuWindow, PartWindow

_JOB_ID = re.compile(r"^[0-9]{1,20}$")

_UTIL = "slurm_gpu_gpu_utilization_ratio"
_BUSY = "slurm_gpu_gpu_busy_seconds_total"
_SAMPLED = "slurm_gpu_gpu_sampled_seconds_total"
_LAST = "slurm_gpu_job_last_sample_timestamp_seconds"
_START = "slurm_gpu_job_start_timestamp_seconds"
_FIRST = "slurm_gpu_gpu_first_active_timestamp_seconds"
_INSTANT = f'{{__name__=~"{_BUSY}|{_SAMPLED}|{_FIRST}|{_LAST}|{_START}"}}'


def window_queries(window_s: float, fresh_s: float) -> dict[str, str]:
    """The PromQL of one read, by what each answers (``window_s``: the policy's idle window;
    ``fresh_s``: the freshness bound), whole seconds."""
    w, f = f"{max(1, round(window_s))}s", f"{max(1, round(fresh_s))}s"
    return {
        "instant": _INSTANT,
        "scraped": f'timestamp({{__name__=~"{_UTIL}|{_LAST}"}})',
        "changes": f"changes({_LAST}[{f}])",
        "util_max": f"max_over_time({_UTIL}[{w}])",
        "util_points": f"count_over_time({_UTIL}[{w}])",
        "busy_growth": f"max_over_time({_BUSY}[{w}]) - min_over_time({_BUSY}[{w}])",
        "sampled_growth": f"max_over_time({_SAMPLED}[{w}]) - min_over_time({_SAMPLED}[{w}])",
        "resets": f"resets({_SAMPLED}[{w}])",
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


@dataclass(slots=True)
class _Part:
    user: str = ""
    account: str = ""
    targets: set[str] = field(default_factory=set)
    scrape_jobs: set[str] = field(default_factory=set)
    values: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, _Gpu] = field(default_factory=dict)


def _key(s: Sample) -> tuple[str, str] | None:
    jid, host = s.labels.get("job_id", ""), s.labels.get("host", "")
    if not _JOB_ID.match(jid) or not host:
        return None
    return jid, host


def assemble(
    answers: Mapping[str, Iterable[Sample]], now_s: float, window_s: float, target_label: str
) -> list[PartWindow]:
    """``PartWindow``s from the answers of ``window_queries`` (pure: the tests feed it)."""
    parts: dict[tuple[str, str], _Part] = {}
    for what, samples in answers.items():
        for s in samples:
            key = _key(s)
            if key is None:
                continue
            p = parts.setdefault(key, _Part())
            p.targets.add(target_host(s.labels.get(target_label, "")))
            p.scrape_jobs.add(s.labels.get("job", ""))
            uuid = s.labels.get("gpu_uuid", "")
            name = s.labels.get("__name__", "")
            field_name = f"{what}:{name}" if what == "instant" else what
            if uuid:
                p.gpus.setdefault(uuid, _Gpu()).values[field_name] = s.value
            else:
                if name == _LAST or what in ("scraped", "changes"):
                    p.user = p.user or s.labels.get("user", "")
                    p.account = p.account or s.labels.get("account", "")
                p.values[field_name] = s.value
    out = []
    for (jid, host), p in sorted(parts.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        last = p.values.get(f"instant:{_LAST}")
        start = p.values.get(f"instant:{_START}")
        scraped = p.values.get("scraped")
        changes = p.values.get("changes")
        out.append(
            PartWindow(
                job_id=jid,
                host=host,
                user=p.user,
                account=p.account,
                targets=tuple(sorted(p.targets)),
                scrape_jobs=tuple(sorted(p.scrape_jobs)),
                seen_age_s=None if scraped is None else max(0.0, now_s - scraped),
                advanced=None if changes is None else changes > 0,
                skew_s=None if scraped is None or last is None else scraped - last,
                span_s=None if last is None or start is None else last - start,
                gpus=tuple(_gpu(u, g.values, now_s, window_s) for u, g in sorted(p.gpus.items())),
            )
        )
    return out


def _gpu(uuid: str, v: dict[str, float], now_s: float, window_s: float) -> GpuWindow:
    util_max = v.get("util_max")
    scraped = v.get("scraped")
    return GpuWindow(
        uuid=uuid,
        util_max_pct=None if util_max is None else 100.0 * util_max,
        util_points=int(v.get("util_points", 0)),
        busy_growth_s=v.get("busy_growth"),
        sampled_growth_s=v.get("sampled_growth"),
        window_s=window_s,
        counter_reset=v.get("resets", 0.0) > 0,
        ever_used=f"instant:{_FIRST}" in v,
        busy_s=v.get(f"instant:{_BUSY}"),
        sampled_s=v.get(f"instant:{_SAMPLED}"),
        seen_age_s=None if scraped is None else max(0.0, now_s - scraped),
    )


def read_windows(
    client: PrometheusClient,
    window_s: float,
    fresh_s: float,
    now_s: float,
    target_label: str = "instance",
) -> list[PartWindow]:
    """Every running job's parts over the window, evaluated at ``now_s`` (one ``time`` for
    every query, so the answers describe the same moment). Raises the client's
    ``PrometheusUnavailableError``."""
    answers = {
        what: client.query(promql, now_s)
        for what, promql in window_queries(window_s, fresh_s).items()
    }
    return assemble(answers, now_s, window_s, target_label)
