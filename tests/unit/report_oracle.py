"""An independent computation of every number of the weekly report, in plain Python.

It reads the same rows the tests insert into the store (lists of dicts, one per row of
``jobs``, ``job_gpus`` and ``findings``) and applies the definitions of ``docs/report.md``
one job and one GPU at a time, with no SQL and no pandas, so that a mistake in the report's
queries cannot be repeated here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

WEEK_S = 7 * 86400.0

Row = dict[str, Any]


class Oracle:
    def __init__(
        self,
        jobs: list[Row],
        gpus: list[Row],
        findings: list[Row],
        *,
        unused_max_duty_pct: float = 1.0,
        idle_edge_min_s: float = 600.0,
    ) -> None:
        self.jobs = jobs
        self.gpus_of: dict[str, list[Row]] = defaultdict(list)
        for g in gpus:
            self.gpus_of[g["job_id"]].append(g)
        self.findings_of: dict[str, list[Row]] = defaultdict(list)
        for f in findings:
            self.findings_of[f["job_id"]].append(f)
        self.thr = unused_max_duty_pct
        self.edge_min = idle_edge_min_s

    # ------------------------------------------------------------------ per job and GPU

    def in_period(self, since: float, until: float) -> list[Row]:
        return [
            j
            for j in self.jobs
            if (j.get("alloc_gpus") or 0) > 0
            and j.get("end_s") is not None
            and since <= j["end_s"] < until
        ]

    @staticmethod
    def hours(job: Row) -> float:
        return job["elapsed_s"] / 3600.0

    def alloc(self, job: Row) -> float:
        if job.get("gpu_hours") is not None:
            return float(job["gpu_hours"])
        return job["alloc_gpus"] * self.hours(job)

    def gpu_active(self, job: Row, g: Row) -> float | None:
        if g.get("util_mean_pct") is None:
            return None
        return g["util_mean_pct"] / 100.0 * self.hours(job)

    def gpu_wasted(self, job: Row, g: Row) -> float | None:
        u = g.get("util_mean_pct")
        if u is None:
            return None
        if u <= self.thr:
            return self.hours(job)
        return (g.get("idle_fraction") or 0.0) * self.hours(job)

    def observed(self, job: Row) -> list[Row]:
        return [g for g in self.gpus_of[job["job_id"]] if g.get("util_mean_pct") is not None]

    def measured(self, job: Row) -> bool:
        return bool(self.observed(job))

    def duty(self, job: Row) -> float | None:
        obs = self.observed(job)
        return statistics.fmean(g["util_mean_pct"] for g in obs) if obs else None

    def active(self, job: Row) -> float:
        return sum(self.gpu_active(job, g) or 0.0 for g in self.observed(job))

    def wasted(self, job: Row) -> float:
        return sum(self.gpu_wasted(job, g) or 0.0 for g in self.observed(job))

    def observed_gh(self, job: Row) -> float:
        return len(self.observed(job)) * self.hours(job)

    def cause(self, job: Row) -> tuple[int | None, str | None]:
        best = None
        for f in self.findings_of[job["job_id"]]:
            if f.get("cause") is None:
                continue
            if best is None or f["seq"] < best["seq"]:
                best = f
        return (None, None) if best is None else (best["cause"], best["code"])

    # ------------------------------------------------------------------ report parts

    def headline(self, since: float, until: float) -> dict[str, Any]:
        js = self.in_period(since, until)
        meas = [j for j in js if self.measured(j)]
        energies = [
            g["energy_j"]
            for j in meas
            for g in self.gpus_of[j["job_id"]]
            if g.get("energy_j") is not None
        ]
        obs = sum(self.observed_gh(j) for j in meas)
        act = sum(self.active(j) for j in meas)
        return {
            "jobs": len(js),
            "jobs_measured": len(meas),
            "jobs_with_findings": sum(1 for j in js if self.cause(j)[0] is not None),
            "gpu_hours_allocated": sum(self.alloc(j) for j in js),
            "gpu_hours_unmeasured": sum(self.alloc(j) for j in js if not self.measured(j)),
            "gpu_hours_active": act,
            "gpu_hours_wasted": sum(self.wasted(j) for j in meas),
            "duty_cycle_median_pct": statistics.median([self.duty(j) for j in meas])
            if meas
            else None,
            "duty_cycle_weighted_pct": 100 * act / obs if obs else None,
            "energy_kwh": sum(energies) / 3.6e6 if energies else None,
        }

    def histogram(self, since: float, until: float) -> list[tuple[int, float]]:
        bins = [[0, 0.0] for _ in range(10)]
        for j in self.in_period(since, until):
            d = self.duty(j)
            if d is None:
                continue
            i = min(int(d // 10), 9)
            bins[i][0] += 1
            bins[i][1] += self.alloc(j)
        return [(int(n), float(h)) for n, h in bins]

    def groups(self, since: float, until: float, key: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        per_cause: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for j in self.in_period(since, until):
            k = j.get(key) if j.get(key) is not None else "(none)"
            g = out.setdefault(
                k, {"jobs": 0, "alloc": 0.0, "active": 0.0, "wasted": 0.0, "obs": 0.0}
            )
            g["jobs"] += 1
            g["alloc"] += self.alloc(j)
            if self.measured(j):
                g["active"] += self.active(j)
                g["wasted"] += self.wasted(j)
                g["obs"] += self.observed_gh(j)
                c = self.cause(j)[0]
                if c is not None:
                    per_cause[k][c] += self.wasted(j)
        for k, g in out.items():
            g["duty"] = 100 * g["active"] / g["obs"] if g["obs"] else None
            g["main_cause"], g["main_cause_gh"] = _main(per_cause.get(k))
        return out

    def top(self, since: float, until: float, key: str, n: int) -> list[str]:
        gs = self.groups(since, until, key)
        return sorted(gs, key=lambda k: (-gs[k]["wasted"], k))[:n]

    def by_model(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        per_cause: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for j in self.in_period(since, until):
            c = self.cause(j)[0]
            for g in self.gpus_of[j["job_id"]]:
                k = g.get("model") or "(unknown)"
                m = out.setdefault(
                    k, {"jobs": set(), "alloc": 0.0, "active": 0.0, "wasted": 0.0, "obs": 0.0}
                )
                m["jobs"].add(j["job_id"])
                m["alloc"] += self.hours(j)
                if g.get("util_mean_pct") is not None:
                    m["obs"] += self.hours(j)
                    m["active"] += self.gpu_active(j, g) or 0.0
                    m["wasted"] += self.gpu_wasted(j, g) or 0.0
                    # The job's cause, for the waste of its GPUs of this model (as the
                    # groups take it for the job's whole waste).
                    if c is not None and self.measured(j):
                        per_cause[k][c] += self.gpu_wasted(j, g) or 0.0
        for k, m in out.items():
            m["jobs"] = len(m["jobs"])
            m["duty"] = 100 * m["active"] / m["obs"] if m["obs"] else None
            m["main_cause"], m["main_cause_gh"] = _main(per_cause.get(k))
        return out

    def causes(self, since: float, until: float) -> dict[int, tuple[int, float]]:
        out: dict[int, list[float]] = {c: [0, 0.0] for c in (1, 2, 3, 4, 5, 6, 7, 0)}
        for j in self.in_period(since, until):
            if not self.measured(j):
                continue
            c = self.cause(j)[0] or 0
            out[c][0] += 1
            out[c][1] += self.wasted(j)
        return {c: (int(v[0]), float(v[1])) for c, v in out.items()}

    def never_used(
        self, since: float, until: float
    ) -> tuple[int, int, float, list[tuple[str, str, str]]]:
        hits = []
        for j in self.in_period(since, until):
            for g in self.gpus_of[j["job_id"]]:
                u = g.get("util_mean_pct")
                if (u is not None and u <= self.thr) or (u is None and not g["process_seen"]):
                    hits.append((self.hours(j), j["job_id"], g["host"], g["uuid"]))
        hits.sort(key=lambda h: (-h[0], h[1], h[2], h[3]))
        return (
            len(hits),
            len({h[1] for h in hits}),
            sum(h[0] for h in hits),
            [(h[1], h[2], h[3]) for h in hits],
        )

    def idle_edges(self, since: float, until: float) -> dict[str, tuple[float, float, float]]:
        out = {}
        for j in self.in_period(since, until):
            act = [g for g in self.gpus_of[j["job_id"]] if g.get("active_first_time_s") is not None]
            if not act:
                continue
            head = min(g.get("idle_head_s") or 0.0 for g in act)
            tail = min(g.get("idle_tail_s") or 0.0 for g in act)
            if head >= self.edge_min or tail >= self.edge_min:
                gh = sum((g.get("idle_head_s") or 0.0) + (g.get("idle_tail_s") or 0.0) for g in act)
                out[j["job_id"]] = (head, tail, gh / 3600.0)
        return out

    def hardware(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for j in self.in_period(since, until):
            for g in self.gpus_of[j["job_id"]]:
                xid = g.get("xid_events") or ""
                bad = (
                    (g.get("throttle_power_s") or 0) > 0
                    or (g.get("throttle_thermal_s") or 0) > 0
                    or (g.get("ecc_corrected") or 0) > 0
                    or (g.get("ecc_uncorrected") or 0) > 0
                    or xid != ""
                )
                if not bad:
                    continue
                n = out.setdefault(
                    g["host"],
                    {
                        "jobs": set(),
                        "power_h": 0.0,
                        "thermal_h": 0.0,
                        "ecc_c": 0,
                        "ecc_u": 0,
                        "xid": set(),
                    },
                )
                n["jobs"].add(j["job_id"])
                n["power_h"] += (g.get("throttle_power_s") or 0) / 3600
                n["thermal_h"] += (g.get("throttle_thermal_s") or 0) / 3600
                n["ecc_c"] += g.get("ecc_corrected") or 0
                n["ecc_u"] += g.get("ecc_uncorrected") or 0
                n["xid"].update(int(x) for x in xid.split(",") if x.strip())
        for n in out.values():
            n["jobs"] = len(n["jobs"])
            n["xid"] = tuple(sorted(n["xid"]))
        return out

    def trend(self, until: float, weeks: int) -> list[dict[str, Any]]:
        out = []
        for i in range(weeks):
            lo = until - (weeks - i) * WEEK_S
            js = self.in_period(lo, lo + WEEK_S)
            meas = [j for j in js if self.measured(j)]
            obs = sum(self.observed_gh(j) for j in meas)
            act = sum(self.active(j) for j in meas)
            out.append(
                {
                    "since": lo,
                    "jobs": len(js),
                    "alloc": sum(self.alloc(j) for j in js),
                    "active": act,
                    "wasted": sum(self.wasted(j) for j in meas),
                    "duty": 100 * act / obs if obs else None,
                }
            )
        return out

    def worst(self, since: float, until: float, user: str, n: int) -> list[str]:
        js = [j for j in self.in_period(since, until) if j["user"] == user and self.measured(j)]
        js.sort(key=lambda j: (-self.wasted(j), j["job_id"]))
        return [j["job_id"] for j in js[:n]]


def _main(causes: dict[int, float] | None) -> tuple[int | None, float]:
    """The cause with the most waste (the lowest among equals) and its waste; (None, 0.0)."""
    if not causes:
        return None, 0.0
    best = min(causes, key=lambda c: (-causes[c], c))
    return best, causes[best]
