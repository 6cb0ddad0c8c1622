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
from slurm_gpu.evaluation.score import (
    RECORDED_WEIGHT,
    TraceResult,
    at_margin,
    combined,
    run,
    score,
    targets,
    targets_met,
)
from slurm_gpu.evaluation.traces import (
    LABELS,
    OTHER_SIDE,
    PATTERN_LINES,
    PATTERNS,
    TRUTH_LINES,
    corpus,
    generate,
)
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
    # may disagree, and the evaluation says how often (margins), not a target. Four traces a
    # pattern are a small sample: 0.9 here, 0.95 in docs/diagnosis.md at twenty.
    ev = at_margin(full, "clear")
    assert {m.margin for m in full.margins} >= {"clear", "near"}
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


def _sides(pattern: str, n: int = 40) -> tuple[list[float], list[bool]]:
    """The deciding values of ``n`` traces of ``pattern`` and whether each holds, asserting
    that each trace's labels and expected finding follow its side of the line."""
    name, line, above = TRUTH_LINES[pattern]
    values, holds = [], []
    for i in range(n):
        t = generate(pattern, i)
        v = dict(t.params)[name]
        h = v >= line if above else v < line
        other_labels, other_expected = OTHER_SIDE.get(pattern, (frozenset(), ()))
        assert t.labels == (LABELS[pattern] if h else other_labels), (t.name, v)
        assert t.expected == (None if h else other_expected), (t.name, v)
        values.append(v)
        holds.append(h)
    return values, holds


def test_generators_draw_across_each_ground_truth_line_and_label_by_it() -> None:
    # Issue 26, point 9: ranges that span the line, labels from the pattern's truth.
    for pattern, (_name, line, _above) in TRUTH_LINES.items():
        values, holds = _sides(pattern)
        assert min(values) < line < max(values), (pattern, min(values), max(values))
        assert any(holds) and not all(holds), pattern
        margins = {generate(pattern, i).margin for i in range(40)}
        assert margins >= {"clear", "near"}, pattern
        # Clear of the line on both sides: the targets judge each side somewhere (a near-OOM
        # peak of 99 % is 1 % free against the line's 5 %, clear of it).
        clear = [v for v in values if abs(v - line) >= 0.15 * line]
        assert any(v < line for v in clear) and any(v > line for v in clear), pattern


@pytest.mark.parametrize("pattern", ["healthy", "host-bound", "idle-head"])
def test_the_new_lines_are_drawn_on_both_sides_and_label_by_them(pattern: str) -> None:
    # Issue 26: healthy duty across 50 %, a host's capacity across the GPUs' rate, the idle
    # head across 600 s; each side drawn clear of the line, labels by the side.
    assert pattern in TRUTH_LINES
    _name, line, _above = TRUTH_LINES[pattern]
    values, holds = _sides(pattern)
    assert any(holds) and not all(holds), (pattern, values)
    clear = [v for v in values if abs(v - line) >= 0.15 * line]
    assert any(v < line for v in clear) and any(v >= line for v in clear), (pattern, values)


def test_a_healthy_job_below_half_duty_is_labelled_low_utilization_by_its_generated_mean() -> None:
    seen = {True: 0, False: 0}
    for i in range(30):
        t = generate("healthy", i)
        truth = dict(t.params)["duty_pct"]
        measured = analyze(t.job, t.nodes, S).metrics.duty_mean_pct
        assert measured is not None
        # The truth is the generated mean, before reading noise and sampling.
        assert abs(measured - truth) < 3.0, (t.name, truth, measured)
        low = truth < 50.0
        seen[low] += 1
        assert t.labels == (frozenset({7}) if low else frozenset())
    assert seen[True] and seen[False], seen


def test_a_host_with_capacity_to_spare_leaves_its_cores_partly_idle() -> None:
    seen = {True: 0, False: 0}
    for i in range(30):
        t = generate("host-bound", i)
        capacity = dict(t.params)["host_capacity"]
        eff = analyze(t.job, t.nodes, S).metrics.core_efficiency_pct
        assert eff is not None
        seen[capacity < 1.0] += 1
        if capacity < 1.0:
            assert eff >= 90.0, (t.name, capacity, eff)  # every core pinned
        else:
            assert eff == pytest.approx(100.0 / capacity, abs=6.0), (t.name, capacity, eff)
    assert seen[True] and seen[False], seen


def test_every_pattern_says_its_line_or_why_it_has_none() -> None:
    assert set(PATTERN_LINES) == set(PATTERNS)
    for pattern, (drawn, thresholds, line) in PATTERN_LINES.items():
        assert drawn and thresholds and line, pattern
        assert line.startswith("none") == (pattern not in TRUTH_LINES), pattern


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


def _result(
    name: str, labels: set[int | str], predicted: set[int | str], found: bool = True
) -> TraceResult:
    return TraceResult(
        trace=name,
        pattern="dataloader" if labels else "healthy",
        labels=frozenset(labels),
        predicted=frozenset(predicted),
        codes=(),
        expected_code_found=found,
        profiler_named=True,
        false_positives=frozenset(predicted) - frozenset(labels),
        expected=("DATALOADER_BOUND",) if labels else (),
    )


def test_a_recorded_trace_that_disagrees_fails_the_targets_whatever_the_synthetic_score() -> None:
    synthetic = score(
        [_result(f"s{i}", {2}, {2}) for i in range(20)] + [_result("h", set(), set())],
        seed=2,
        n_per_pattern=20,
    )
    agreeing = score([_result("r1", {2}, {2})], seed=0, n_per_pattern=1)
    assert targets_met(targets(synthetic, agreeing))
    missed = score(
        [_result("r1", {2}, {2}), _result("r2", {2}, set(), False)], seed=0, n_per_pattern=1
    )
    found = targets(synthetic, missed)
    assert not targets_met(found)
    (gate,) = [t for t in found if "recorded" in t.name]
    assert not gate.met and gate.detail == "r2"
    assert all(t.met for t in found if t is not gate)


def test_a_recorded_trace_counts_as_recorded_weight_synthetic_ones() -> None:
    synthetic = score([_result(f"s{i}", {2}, {2}) for i in range(10)], seed=2, n_per_pattern=10)
    recorded = score(
        [_result("r1", {2}, set(), False), _result("r2", set(), {2})], seed=0, n_per_pattern=1
    )
    (c2,) = [c for c in combined(synthetic, recorded) if c.cause == 2]
    # Recall: 10 synthetic hits of 10 + one recorded miss weighing RECORDED_WEIGHT.
    assert c2.recall == pytest.approx(10 / (10 + RECORDED_WEIGHT))
    # Precision: 10 right synthetic predictions + one wrong recorded one.
    assert c2.precision == pytest.approx(10 / (10 + RECORDED_WEIGHT))


def test_a_low_score_near_the_line_misses_no_target_one_clear_of_it_does() -> None:
    near = [replace(_result(f"n{i}", {2}, set(), False), margin="near") for i in range(5)]
    clear = [_result(f"c{i}", {2}, {2}) for i in range(20)] + [_result("h", set(), set())]
    assert targets_met(targets(score(near + clear, seed=2, n_per_pattern=20)))
    # One clear miss in 21 is 0.95, the target; two in 22 fall below it.
    missed = [_result(f"miss{i}", {2}, set(), False) for i in range(2)]
    assert targets_met(targets(score(near + clear + missed[:1], seed=2, n_per_pattern=20)))
    found = targets(score(near + clear + missed, seed=2, n_per_pattern=20))
    (recall,) = [t for t in found if t.name.startswith("recall")]
    assert not recall.met and recall.detail == "cause 2: 0.91", recall


def test_evaluate_says_whether_the_targets_are_met_and_gates_on_recorded_traces(
    tmp_path: Path,
) -> None:
    import json

    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    recorded = tmp_path / "traces"
    recorded.mkdir()
    src = REPO / "tests" / "data" / "traces" / "healthy-1.json"
    data = json.loads(src.read_text())
    (recorded / "healthy-1.json").write_text(json.dumps(data))
    out = tmp_path / "d.md"
    args = ["--config", str(cfg), "evaluate", "--n", "1", "--seed", "5", "--recorded"]
    res = CliRunner().invoke(cli, [*args, str(recorded), "--write", str(out)])
    assert res.exit_code == 0, res.output
    assert "every recorded trace gets its labelled finding" in res.output
    assert f"combined (a recorded trace counts {RECORDED_WEIGHT})" in res.output
    text = out.read_text()
    assert "## Targets" in text and "## How the synthetic corpus relates to the thresholds" in text
    assert text.index("## Targets") < text.index("## Recorded corpus") < text.index("## Held-out")
    # Only the generated corpora are drawn across lines.
    recorded_part = text[text.index("## Recorded corpus") : text.index("## Held-out")]
    assert "across the line" not in recorded_part
    assert "across the line" in text[text.index("## Held-out") :]
    # The same healthy job labelled as near-OOM: the recorded gate fails.
    data["pattern"], data["labels"], data["expected_codes"] = (
        "near-oom",
        [4],
        ["GPU_MEMORY_NEAR_FULL"],
    )
    (recorded / "healthy-1.json").write_text(json.dumps(data))
    res = CliRunner().invoke(cli, [*args, str(recorded)])
    assert res.exit_code == 0, res.output
    assert (
        "not met: every recorded trace gets its labelled finding and no other cause — healthy-1"
        in res.output
    )
    assert "targets: NOT all met" in res.output


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


def test_generated_jobs_write_their_options_on_the_command_line_or_in_the_script() -> None:
    # Both places are drawn, and the request style read from either is the same kind of
    # style: the evaluation's recommendation checks cover jobs whose options only the batch
    # script names (issue 26, point 5).
    from slurm_gpu.analysis.request import request_of

    places = {"command line": 0, "batch script": 0}
    for seed in range(40):
        j = generate("healthy", seed).job
        in_script = j.batch_directives is not None
        places["batch script" if in_script else "command line"] += 1
        if in_script:
            assert j.submit_line == "sbatch job.sh"
        assert request_of(j).gpu_form is not None, (j.submit_line, j.batch_directives)
    assert min(places.values()) >= 8, places
