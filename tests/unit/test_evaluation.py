"""The scored evaluation on held-out seeds, the trace generators, and finding wording."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2
import pytest
from analysis_factory import GIB, T0, gpu, host, job, node, timeline
from click.testing import CliRunner

from slurm_gpu.analysis import Code, Finding, PastJob, analyze
from slurm_gpu.analysis.wording import environment, template_name, wording
from slurm_gpu.cli.admin import cli
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.evaluation.score import run, score
from slurm_gpu.evaluation.traces import PATTERNS, corpus, generate
from slurm_gpu.records import JobStep, StackSummary

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates" / "findings"
S = AnalysisSettings()
#: Seeds the thresholds were never tuned on (tuning used seed 1).
HELD_OUT_SEEDS = (3, 4)


@pytest.mark.parametrize("seed", HELD_OUT_SEEDS)
def test_targets_hold_on_held_out_seeds(seed: int) -> None:
    full = run(corpus(4, seed), S, seed=seed, n_per_pattern=4)
    # The targets hold clear of the ground-truth lines; near them the labels and the rules
    # may disagree, and the evaluation says how often (margins), not a target.
    ev = score([r for r in full.results if r.margin == "clear"], seed=seed, n_per_pattern=4)
    assert {m.margin for m in full.margins} == {"clear", "near", "ambiguous"}
    recall_checked, precision_checked = set(), set()
    for c in ev.causes:
        if c.labelled:
            recall_checked.add(c.cause)
            assert c.recall is not None and c.recall >= 0.9, c
        if c.predicted >= 4:
            precision_checked.add(c.cause)
            assert c.precision is not None and c.precision >= 0.9, c
    # Both branches were taken for every cause the corpus always holds clear of a line.
    always = {1, 2, 3, 5, 6, "site", "outcome"}
    assert recall_checked >= always and precision_checked >= always
    assert ev.false_alarm_rate is not None and ev.false_alarm_rate <= 0.05
    assert ev.profiler_coverage == 1.0
    assert ev.recommendations > 0
    assert (ev.recs_invalid, ev.recs_below_use, ev.recs_incoherent, ev.recs_not_actionable) == (
        0,
        0,
        0,
        0,
    )


def test_generators_draw_across_each_ground_truth_line_and_label_by_it() -> None:
    # Issue 26, point 9: ranges that span the line, labels from the pattern's truth.
    from slurm_gpu.evaluation.traces import TRUTH_LINES

    for pattern, (name, line, above) in TRUTH_LINES.items():
        traces = [generate(pattern, i) for i in range(40)]
        values = [dict(t.params)[name] for t in traces]
        assert min(values) < line < max(values), (pattern, min(values), max(values))
        for t, v in zip(traces, values, strict=True):
            holds = v >= line if above else v < line
            assert bool(t.labels) == holds, (t.name, v)
            assert t.expected == (None if holds else ())
        assert {t.margin for t in traces} >= {"clear", "near"}, pattern


def test_overtime_draws_no_limit_inside_the_info_band_as_a_clear_positive() -> None:
    # The old lower bound (2.6) lay inside the info band (a warning only above 3.125): such a
    # trace is now labelled by the 2.5 line and scored as near it, not as clear.
    in_band = 0
    for i in range(60):
        t = generate("overtime", i)
        factor = dict(t.params)["limit_factor"]
        if 2.5 <= factor < 2.5 / 0.8:
            in_band += 1
            assert t.margin in ("near", "ambiguous") or factor >= 2.5 * 1.15
    assert in_band  # the band was drawn


def test_generation_is_deterministic_and_varied() -> None:
    a, b = generate("dataloader", 7), generate("dataloader", 7)
    assert a.job == b.job and a.nodes == b.nodes
    params = {generate("healthy", i).params for i in range(6)}
    assert len(params) == 6
    assert {t.pattern for t in corpus(1, 5)} == set(PATTERNS)


def test_traces_are_built_by_the_streaming_aggregates() -> None:
    t = generate("idle-gpu", 3)
    assert t.nodes[0].source == "synthetic" and t.nodes[0].timeline
    g = t.nodes[0].gpus[-1]
    assert g.samples == g.samples_available > 0 and g.utilization.n == g.samples


def test_unknown_pattern_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown pattern"):
        generate("nope", 1)


def test_evaluate_command_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "diagnosis.md"
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    res = CliRunner().invoke(
        cli, ["--config", str(cfg), "evaluate", "--n", "1", "--seed", "5", "--write", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "## Held-out corpus (seed 5)" in text and "## Tuning corpus (seed 1)" in text
    assert "| cause | labelled |" in text


def test_evaluate_refuses_the_tuning_seed_as_held_out(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    res = CliRunner().invoke(cli, ["--config", str(cfg), "evaluate", "--seed", "1"])
    assert res.exit_code == 2 and "differ" in res.output


# --------------------------------------------------------------------------- wording


STACKS = StackSummary(
    classes=("input_wait", "compute", "sleep_idle", "other"),
    counts=(10, 80, 10, 0),
    idle_counts=(0, 0, 0, 0),
    deciding=(("dataloader.__next__",), ("module._call_impl",), (), ()),
    interval_s=300.0,
    bursts=20,
    bursts_failed=0,
    first_s=T0 + 60,
    last_s=T0 + 3000,
)


def _scenarios() -> list[Finding]:
    """Findings covering every code, from the corpus plus constructed edge cases."""
    found = [f for t in corpus(1, 6) for f in analyze(t.job, t.nodes, S).findings]
    cases = [
        (job(elapsed=0, total_cpu=0.0), [node()]),
        (job(), []),
        (job(gpus=2, nodes=("a", "b")), [node([gpu("GPU-a")], hostname="a")]),
        (job(), [node([replace(gpu(duty=[80.0] * 40), samples=100)])]),
        (job(state="OUT_OF_MEMORY"), [node()]),
        (job(), [node([gpu(mem_frac=0.97)])]),
        (job(), [node([gpu(ecc_uncorrected=1, xid_events=(79,), throttle_thermal_s=900.0)])]),
        (job(), [node([gpu(throttle_power_s=900.0)])]),
        (
            job(cpus=32, total_cpu=3600.0, max_rss=GIB, mem=64 * GIB),
            [node(host_summary=host(cores=32, busy_frac=1 / 32, rss_max_bytes=GIB))],
        ),
        (job(), [node([gpu(active=(T0 + 1300, T0 + 3600))])]),
        (
            job(cpus=2),
            [
                node(
                    [gpu(duty=25.0)],
                    tl=timeline([25.0] * 4, [1.9] * 4),
                    host_summary=host(cores=2, busy_frac=0.95),
                )
            ],
        ),
        (job(), [node([gpu(duty=20.0, mem_frac=0.1)])]),
        (job(), [node([gpu(duty=[0.0] * 55 + [95.0] * 45, mem_frac=0.7)])]),
        (
            job(gpus=2),
            [node([gpu("GPU-a", max_processes=4), gpu("GPU-b", duty=0.0, mem_frac=0.005)])],
        ),
        # A task farm of one-core steps, all failed; a node failure.
        (
            replace(
                job(cpus=96, gpus=4, total_cpu=4 * 3600.0),
                steps=(
                    JobStep("0", 1, 1, 1, "FAILED", 1, 0, 3000, 2990.0),
                    JobStep("1", 1, 1, 1, "FAILED", 1, 0, 3000, 2990.0),
                ),
            ),
            [node([gpu(f"GPU-{i}", duty=65.0) for i in range(4)], host_summary=host(cores=96))],
        ),
        (job(state="NODE_FAIL"), [node()]),
        # Ended by the time limit with a step still running; a step still running when the
        # batch script returned.
        (
            replace(
                job(state="TIMEOUT", limit=3600),
                steps=(JobStep("0", 8, 1, 1, "CANCELLED", 0, 15, 3600, 100.0),),
            ),
            [node()],
        ),
        (
            replace(job(), steps=(JobStep("0", 8, 1, 1, "CANCELLED", 0, 15, 3600, 100.0),)),
            [node()],
        ),
        # Recurring mid-job idle phases; a ragged end (one GPU stops 30 min early).
        (
            job(elapsed=7200, limit=14400),
            [
                node(
                    [gpu(duty=60.0, end=T0 + 7200, active=(T0 + 60, T0 + 7140))],
                    end=T0 + 7200,
                    tl=timeline(([80.0] * 10 + [0.0] * 10) * 6, [1.0] * 120),
                )
            ],
        ),
        (
            job(gpus=2),
            [node([gpu("GPU-a"), gpu("GPU-b", active=(T0 + 10, T0 + 1800))])],
        ),
        # Read from dcgm-exporter: one GPU unused, and no process list to say more.
        (
            job(gpus=2),
            [replace(node([gpu("GPU-a"), gpu("GPU-b", duty=0.0)]), source="dcgm-exporter")],
        ),
        # With stack samples (docs/stacks.md): the STACK_PROFILE note.
        (job(), [replace(node(), stacks=STACKS)]),
    ]
    for j, nodes in cases:
        found.extend(analyze(j, nodes, S).findings)
    # The same fault as the user's last similar job.
    seen = PastJob("1", "alice", "train", "/home/alice", "COMPLETED", 3600, 2, 1, None, None, None)
    again = analyze(
        job(gpus=2),
        [node([gpu("GPU-a"), gpu("GPU-b", duty=0.0)])],
        S,
        history=[replace(seen, account="lab", finding_codes=("GPU_UNUSED",))],
    )
    found.extend(again.findings)
    return found


def test_every_code_has_wording_that_renders() -> None:
    env = environment(jinja2.FileSystemLoader(str(TEMPLATES)))
    for code in Code:
        assert (TEMPLATES / template_name(code.value)).is_file(), f"no wording for {code}"
    findings = _scenarios()
    assert {f.code for f in findings} == set(Code), set(Code) - {f.code for f in findings}
    for f in findings:
        title, text = wording(env, f)
        assert title and text and "n/a" not in title, f.code
        assert "{{" not in text


def test_no_template_without_a_code() -> None:
    names = {p.name for p in TEMPLATES.glob("*.j2")}
    assert names == {template_name(c.value) for c in Code}
