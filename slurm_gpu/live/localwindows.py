"""The live policy's evidence without Prometheus: this node's live summaries as windows.

On a single GPU server (``live.prometheus_url`` empty) the reader is the node itself, so its
clock is the reader's clock and the files' identity is their path (root's, checked by
``live.snapshot``). The two signals are then the sampler's own: its idle run (every reading,
at sampling resolution, at or below the threshold since ``idle_since``) stands for the
utilisation maximum, and its counters over the summary's recent window (5 minutes) for the
busy-seconds confirmation. Freshness is the file's last reading against this host's clock.
Each GPU's number (``gpu_index``) is the file's, checked against Slurm's allocation as the
exporter's label is.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.records import GpuWindow, LiveGpu, LiveJob, PartWindow

#: Stands for "a reading above the threshold fell in the window" (a summary keeps no maximum).
ABOVE_PCT = 100.0


def _gpu(g: LiveGpu, age_s: float, now_s: float, window_s: float, interval_s: float) -> GpuWindow:
    idle_all_window = g.idle_since_s is not None and now_s - g.idle_since_s >= window_s
    util_max = g.utilization_pct if idle_all_window else ABOVE_PCT
    recent = g.recent_window_s
    pct = g.utilization_recent_pct
    return GpuWindow(
        uuid=g.uuid,
        util_max_pct=util_max,
        util_points=max(1, int(window_s / interval_s)) if interval_s > 0 else 1,
        busy_growth_s=None if pct is None or not recent else pct / 100.0 * recent,
        sampled_growth_s=recent,
        window_s=recent or 0.0,
        counter_reset=False,
        ever_used=g.active_first_s is not None,
        busy_s=g.busy_s,
        sampled_s=g.sampled_s,
        seen_age_s=age_s,
        gpu_index=() if g.gpu_index is None else (str(g.gpu_index),),
    )


def local_windows(
    jobs: Sequence[LiveJob], now_s: float, window_s: float, max_age_s: float
) -> list[PartWindow]:
    """``PartWindow``s of this node's live summaries (``live.snapshot.read_node``)."""
    out = []
    for j in jobs:
        age = max(0.0, now_s - j.updated_s)
        out.append(
            PartWindow(
                job_id=j.job_id,
                host=j.host,
                user=j.user,
                account=j.account,
                targets=(j.host,),
                scrape_jobs=("",),
                sources=1,
                seen_age_s=age,
                advanced=age <= max_age_s,
                skew_s=None,
                span_s=j.updated_s - j.started_s,
                gpus=tuple(_gpu(g, age, now_s, window_s, j.interval_s) for g in j.gpus),
            )
        )
    return out
