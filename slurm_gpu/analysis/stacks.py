"""What the job's stack samples (``docs/stacks.md``) do to the findings: evidence from inside
the job turns the rules' guesses from outside into confirmed or withdrawn findings.

- ``DATALOADER_BOUND`` is confirmed (evidence ``stacks_input_wait_pct``, ``stacks_confirmed``
  1) when the main processes waited for input in at least ``stacks_confirm_input_pct`` of
  the samples, and withdrawn when in less than ``stacks_withdraw_input_pct`` (with
  ``TOO_FEW_CPUS_PER_GPU``, which rests on the same reading); in between it stands with the
  share quoted (``stacks_confirmed`` 0).
- ``IDLE_PHASES`` is explained by what the main processes did while the GPUs were idle
  (``stacks_idle_<class>_pct`` for the leading classes).
- ``COMMUNICATION_WAIT`` and ``GPU_IMBALANCE`` get the collective waits per rank (the rank
  that waits least is the slow one).
- One ``STACK_PROFILE`` note (info) per job gives the shares, the coverage and the deciding
  frames (its subject), and says which finding the stacks withdrew.

Nothing here runs with fewer than ``stacks_min_samples`` samples; with fewer, and a reason from
the nodes (no job cgroup, ptrace forbidden, the reader refused or timed out), the one
``STACK_PROFILE`` note says stack sampling read too little, and why. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.analysis.findings import Code, Finding, Number, Scope, Severity
from slurm_gpu.analysis.metrics import DataStatus, JobMetrics
from slurm_gpu.analysis.stackmetrics import StackMetrics
from slurm_gpu.config import AnalysisSettings

#: Most characters of the deciding frames quoted in ``STACK_PROFILE``'s subject.
SUBJECT_MAX_LEN = 400
#: Classes quoted in an idle-phase explanation (the largest shares).
IDLE_CLASSES_SHOWN = 2
#: Classes shown in the note, and the only ones a cause can be read from, when present.
INPUT, COLLECTIVE, IO, EVALUATION = "input_wait", "collective", "checkpoint_io", "evaluation"
#: Findings that say the job waited for input, withdrawn together when the stacks say it did not.
INPUT_BOUND_CODES = (Code.DATALOADER_BOUND, Code.TOO_FEW_CPUS_PER_GPU)


def _r(value: float | None) -> Number:
    return None if value is None else round(value, 1)


def _coverage(st: StackMetrics) -> dict[str, Number]:
    return {
        "stacks_samples": st.samples,
        "stacks_bursts": st.bursts,
        "stacks_span_pct": _r(st.span_pct),
    }


def _collective_per_rank(st: StackMetrics, s: AnalysisSettings) -> dict[str, Number]:
    ranks = [r for r in st.ranks if r.samples >= max(1, s.stacks_min_samples // 4)]
    if len(ranks) < 2:
        return {}
    shares = [r.share(COLLECTIVE) for r in ranks]
    return {
        "stacks_ranks": len(ranks),
        "stacks_collective_max_pct": _r(max(shares)),
        "stacks_collective_min_pct": _r(min(shares)),
    }


def _idle_explained(st: StackMetrics, s: AnalysisSettings) -> dict[str, Number]:
    if st.idle_samples < s.stacks_min_samples:
        return {}
    top = sorted(
        ((pct, cls) for cls, pct in st.idle_shares_pct if pct > 0), key=lambda t: (-t[0], t[1])
    )[:IDLE_CLASSES_SHOWN]
    ev: dict[str, Number] = {"stacks_idle_samples": st.idle_samples}
    ev.update({f"stacks_idle_{cls}_pct": _r(pct) for pct, cls in top})
    return ev


def _subject(st: StackMetrics) -> str | None:
    parts = [f"{cls}: {', '.join(names)}" for cls, names in st.deciding]
    text = "; ".join(parts)
    return text[:SUBJECT_MAX_LEN] or None


def _unread(st: StackMetrics) -> Finding:
    """The ``STACK_PROFILE`` note of a job whose stack sampling read too little to use, with the
    reasons its nodes gave (``stacks_note_<reason>`` 1): the user opted in and is told why."""
    ev: dict[str, Number] = {"stacks_unread": 1, **_coverage(st)}
    ev["stacks_bursts_failed"] = st.bursts_failed
    ev.update({f"stacks_note_{note}": 1 for note in st.notes})
    return Finding(Code.STACK_PROFILE, Severity.INFO, ev, Scope.JOB, None)


def stack_evidence(m: JobMetrics, s: AnalysisSettings, found: Sequence[Finding]) -> list[Finding]:
    """``found`` with the stacks' evidence added, a data-loading finding confirmed or
    withdrawn, and the ``STACK_PROFILE`` note; ``found`` unchanged without enough samples."""
    st = m.stacks
    if st is None or m.status is not DataStatus.OK:
        return list(found)
    if st.samples < s.stacks_min_samples:
        return [*found, _unread(st)] if st.notes else list(found)
    input_pct = st.share(INPUT)
    out: list[Finding] = []
    withdrawn = False
    for f in found:
        ev = dict(f.evidence)
        if f.code in INPUT_BOUND_CODES:
            if input_pct < s.stacks_withdraw_input_pct:
                # TOO_FEW_CPUS_PER_GPU rests on the same guess (the host read input-bound).
                withdrawn = withdrawn or f.code is Code.DATALOADER_BOUND
                continue
            if f.code is not Code.DATALOADER_BOUND:
                out.append(f)
                continue
            ev["stacks_input_wait_pct"] = _r(input_pct)
            ev["stacks_confirmed"] = int(input_pct >= s.stacks_confirm_input_pct)
            ev.update(_coverage(st))
        elif f.code is Code.IDLE_PHASES:
            ev.update(_idle_explained(st, s))
        elif f.code in (Code.COMMUNICATION_WAIT, Code.GPU_IMBALANCE):
            ev.update(_collective_per_rank(st, s))
        out.append(Finding(f.code, f.severity, ev, f.scope, f.subject) if ev != f.evidence else f)
    note: dict[str, Number] = {**_coverage(st), "stacks_interval_s": st.interval_s}
    # Classes with samples, and input wait always (what a withdrawal is judged on).
    note.update({f"{cls}_pct": _r(pct) for cls, pct in st.shares_pct if pct > 0 or cls == INPUT})
    note["stacks_nodes"] = st.nodes
    note["stacks_bursts_failed"] = st.bursts_failed
    note.update(_idle_explained(st, s))
    note.update(_collective_per_rank(st, s))
    if withdrawn:
        note["withdrew_DATALOADER_BOUND"] = 1
        note["stacks_withdraw_input_pct"] = s.stacks_withdraw_input_pct
    out.append(Finding(Code.STACK_PROFILE, Severity.INFO, note, Scope.JOB, _subject(st)))
    return out
