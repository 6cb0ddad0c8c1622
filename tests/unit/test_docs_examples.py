"""The README's and the docs' examples say what the code does: every ``slurm-gpu``/``gpueff``
command shown is one the command line accepts, the shown ``gpueff`` reports have the shape
``gpueff`` prints, and the slurm.conf lines shown are those ``hooks install`` prints."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gpueff_factory as F
import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli as admin_cli
from slurm_gpu.cli.gpueff import cli as gpueff_cli
from slurm_gpu.config import EnergySettings
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.terminal import TerminalRenderer

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: A shown command with a placeholder (``JOBID...``, ``[--json]``, ``WHEN``) is a synopsis, not
#: a command to run.
_PLACEHOLDER = re.compile(r"\[|\.\.\.|…|<|\b[A-Z]{2,}\b|\bD\b|\bN\b")


def _blocks(path: Path) -> Iterator[list[str]]:
    """The fenced code blocks of a Markdown file, as lists of lines."""
    block: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                yield block
                block = None
        elif block is not None:
            block.append(line)


def _commands() -> Iterator[tuple[str, str, list[str]]]:
    """(file, line, argv) of every complete command shown in a code block."""
    for path in DOCS:
        for block in _blocks(path):
            joined: list[str] = []
            for line in block:
                if joined and joined[-1].endswith("\\"):
                    joined[-1] = joined[-1][:-1] + " " + line.strip()
                else:
                    joined.append(line.strip())
            for line in joined:
                text = line.removeprefix("$ ").split(" #", 1)[0].strip()
                words = text.split(" ", 1)
                if Path(words[0]).name not in ("slurm-gpu", "gpueff") or len(words) < 2:
                    continue
                if _PLACEHOLDER.search(words[1]) or any(c in words[1] for c in "|>"):
                    continue
                try:
                    argv = shlex.split(words[1])
                except ValueError:  # prose in a block (a log line), not a command
                    continue
                yield path.name, line, [Path(words[0]).name, *argv]


COMMANDS = list(_commands())


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize(("doc", "line", "argv"), COMMANDS, ids=[c[1] for c in COMMANDS])
def test_every_shown_command_is_accepted(doc: str, line: str, argv: list[str]) -> None:
    """Parsed as typed (unknown options, missing values fail); ``--help`` stops it there."""
    cli = gpueff_cli if argv[0] == "gpueff" else admin_cli
    args = argv[1:]
    # --help after the last subcommand: options are parsed, nothing runs.
    res = CliRunner().invoke(cli, [*args, "--help"])
    assert res.exit_code == 0, f"{doc}: {line}\n{res.output}"


# --------------------------------------------------------------------------- report excerpts


def _shape(line: str) -> str:
    """A report line with what differs between jobs made generic: numbers, bars, the job's
    name, the node:slot, GPU model, user, account and partition."""
    line = re.sub(r"\[[#.]+\]", "[#]", line)
    line = re.sub(r'"[^"]*"', '"NAME"', line)
    line = re.sub(r"\b[a-z][a-z0-9-]*:\d+\b(?!:)", "HOST:9", line)
    line = re.sub(r"x NVIDIA .*$", "x MODEL", line)
    line = re.sub(r"(user|account|partition|nodes) \S+", r"\1 X", line)
    line = re.sub(r"\d+(\.\d+)?", "9", line)
    return " ".join(line.split())


def _rendered() -> tuple[set[str], str]:
    """The shapes of the lines ``gpueff`` prints for an idle-GPU job like the docs show, with
    both forms of the GPU recommendation (``--gres``, ``--gpus``), and the whole text's shape
    on one line per report (wrapped prose is compared as text)."""
    words = adapter.findings_wording()

    @dataclasses.dataclass(frozen=True)
    class Finding:
        code: str = "GPU_UNUSED"
        severity: str = "critical"
        cause: int = 6
        subject: str = "GPU-node1-0001"
        evidence: Any = dataclasses.field(
            default_factory=lambda: {
                "duty_mean_pct": 0.0,
                "gpus_used": 1,
                "gpus_allocated": 2,
                "gpu_hours_wasted": 1.0,
                "process_seen": False,
                "ranks_share_gpu": False,
                "whole_node": False,
            }
        )

    shapes: set[str] = set()
    texts: list[str] = []
    for flag, current, proposed in (("--gres", "gpu:a100:2", "gpu:a100:1"), ("--gpus", "2", "1")):
        rec = adapter.recommendation_from_mapping(
            {
                "option": "gpus",
                "current": current,
                "proposed": proposed,
                "sbatch_lines": [f"#SBATCH {flag}={proposed}"],
                "gpu_hours_saved": 1.0,
            }
        )
        gpus = adapter.gpu_lines_from_records([F.node_record()])
        gpus = tuple(dataclasses.replace(g, name="NVIDIA A100-SXM4-40GB") for g in gpus)
        base = adapter.accounting_report(F.job(), min_elapsed_s=30)
        report = adapter.with_telemetry(
            base,
            gpus,
            live=False,
            findings=[adapter.finding_view(Finding(), words)],
            recommendations=[rec],
            # Priced as the docs' example site prices it (a cost and a carbon intensity).
            energy_settings=EnergySettings(price_per_kwh=0.3, co2_g_per_kwh=400.0),
        )
        text = TerminalRenderer(colour=False).report(report)
        shapes |= {_shape(ln) for ln in text.splitlines()}
        texts.append(" ".join(_shape(ln) for ln in text.splitlines()))
    return shapes, "\n".join(texts)


def _excerpts() -> Iterator[tuple[str, str]]:
    for path in (REPO / "README.md", REPO / "docs" / "gpueff.md"):
        for block in _blocks(path):
            if block and re.match(r"\$ gpueff \d+", block[0]):
                for line in block[1:]:
                    yield path.name, line


EXCERPTS = list(_excerpts())


def test_the_docs_show_gpueff_reports() -> None:
    assert {doc for doc, _ in EXCERPTS} == {"README.md", "gpueff.md"}


@pytest.mark.parametrize(
    ("doc", "line"), EXCERPTS, ids=[f"{d}:{ln.strip()[:30]}" for d, ln in EXCERPTS]
)
def test_every_shown_report_line_has_the_shape_gpueff_prints(doc: str, line: str) -> None:
    text = line.strip()
    if not text or set(text) <= set("▁▂▃▄▅▆▇█"):
        return  # a blank line or a sparkline: nothing to compare
    shapes, whole = _rendered()
    if "..." not in text and "…" not in text and _shape(line) in shapes:
        return
    # Prose (a finding's wrapped text) or an excerpt with elisions: each shown piece must be
    # in the text gpueff prints.
    pieces = [p for p in re.split(r"\.\.\.|…", _shape(line)) if p.strip()]
    missing = [p.strip() for p in pieces if p.strip() not in whole]
    assert not missing, f"{doc}: {line!r}: not printed by gpueff: {missing}"


def test_the_slurm_conf_lines_shown_are_those_hooks_install_prints(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    dest = tmp_path / "d"
    res = CliRunner().invoke(
        admin_cli, ["hooks", "install", "--dest", str(dest), "--config", str(cfg)]
    )
    assert res.exit_code == 0, res.output
    printed = [ln.replace(str(dest), "/etc/slurm/slurm-gpu") for ln in res.output.splitlines()]
    readme = next(b for b in _blocks(REPO / "README.md") if b and b[0].strip() == "# slurm.conf")
    assert [ln.strip() for ln in readme[1:]] == [
        ln for ln in printed if "=" in ln and not ln.startswith("installed")
    ]
