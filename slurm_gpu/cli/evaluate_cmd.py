"""``slurm-gpu evaluate``: score the diagnosis on synthetic labelled traces and the recorded
ones, and say whether the targets are met."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from slurm_gpu.cli.common import settings_from
from slurm_gpu.errors import UsageError


@click.command("evaluate")
@click.option(
    "--n",
    "n",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="Traces per pattern.",
)
@click.option(
    "--seed",
    type=int,
    default=2,
    show_default=True,
    help="Seed of the held-out corpus (the table's headline).",
)
@click.option(
    "--tuning-seed",
    type=int,
    default=1,
    show_default=True,
    help="Seed of the corpus the thresholds were tuned on (reported alongside).",
)
@click.option(
    "--write",
    "write_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the Markdown table to this file (e.g. docs/diagnosis.md).",
)
@click.option(
    "--recorded",
    "recorded_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of traces recorded on a real cluster (default: tests/data/traces of a "
    "source checkout, when there).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    n: int,
    seed: int,
    tuning_seed: int,
    write_path: str | None,
    recorded_dir: str | None,
) -> None:
    """Generate labelled traces of every pattern, diagnose them with the configured
    thresholds, and print per-cause precision and recall, the false-alarm rate, and each
    target met or not (a recorded trace that disagrees with its label misses one)."""
    from slurm_gpu.evaluation.score import (
        RECORDED_WEIGHT,
        combined,
        markdown,
        run,
        summary_lines,
        target_lines,
        targets,
        targets_met,
    )
    from slurm_gpu.evaluation.traces import corpus

    if seed == tuning_seed:
        raise UsageError(
            "the held-out seed must differ from the tuning seed",
            hint="pass --seed and --tuning-seed with different values",
        )
    settings = settings_from(ctx).analysis
    held = run(corpus(n, seed), settings, seed=seed, n_per_pattern=n)
    tuned = run(corpus(n, tuning_seed), settings, seed=tuning_seed, n_per_pattern=n)
    recorded = _recorded(recorded_dir, settings)
    # Recorded traces weigh above synthetic ones: a gate among the targets, a weight in the
    # combined figures, and their section before the synthetic corpora.
    text = markdown(
        held,
        tuned,
        recorded=recorded[1] if recorded else None,
        recorded_section=recorded[0] if recorded else (),
    )
    if write_path:
        try:
            Path(write_path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot write {write_path}: {exc.strerror}", hint="check the directory exists"
            ) from None
        click.echo(f"wrote {write_path}")
    for line in summary_lines(held):
        click.echo(line)
    if recorded:
        ev = recorded[1]
        click.echo(
            f"recorded: {len(ev.results)} traces, "
            f"{sum(r.expected_code_found for r in ev.results)} with the expected finding, "
            f"{ev.healthy_false_alarms} false alarm(s)"
        )
    for c in held.causes:
        recall = "-" if c.recall is None else f"{c.recall:.2f}"
        precision = "-" if c.precision is None else f"{c.precision:.2f}"
        click.echo(
            f"cause {c.cause}: recall {recall} precision {precision} ({c.labelled} labelled)"
        )
    if recorded:
        for w in combined(held, recorded[1]):
            recall = "-" if w.recall is None else f"{w.recall:.2f}"
            precision = "-" if w.precision is None else f"{w.precision:.2f}"
            click.echo(
                f"cause {w.cause} combined (a recorded trace counts {RECORDED_WEIGHT}): "
                f"recall {recall} precision {precision}"
            )
    found = targets(held, recorded[1] if recorded else None)
    for line in target_lines(found):
        click.echo(line.replace("**", ""))
    click.echo("targets: " + ("all met" if targets_met(found) else "NOT all met"))


def _recorded(directory: str | None, settings: Any) -> tuple[list[str], Any] | None:
    """The recorded section's Markdown and scores, or ``None`` when there are no traces."""
    from slurm_gpu.evaluation.recorded import evaluate_recorded, load_corpus, markdown_section

    path = (
        Path(directory) if directory else Path(__file__).resolve().parents[2] / "tests/data/traces"
    )
    if not path.is_dir():
        if directory:
            raise UsageError(f"{directory} is not a directory", hint="pass --recorded DIR")
        return None
    traces = load_corpus(path)
    if not traces:
        return None
    ev = evaluate_recorded(traces, settings)
    return markdown_section(ev, traces), ev
