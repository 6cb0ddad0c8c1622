"""Build sacct output the way ``SacctSource`` asks for it, and runners that replay it.

``SacctSource`` runs two queries per batch (``slurm_gpu.accounting.sacct``): the accounting
query (``FIELDS``, ``DELIM``) and the text query (``TEXT_FIELDS``, job lines only, a random
delimiter). ``FormatRunner`` and ``write_fake_sacct`` answer each call in the fields, the
delimiter and the lines it asks for, as sacct does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import (
    DELIM,
    FIELDS,
    TEXT_FIELDS,
    ParseResult,
    parse_sacct_output,
    split_records,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "sacct"

#: The field list of the files recorded in tests/data/sacct (one query, user strings
#: included, as the accounting adapter asked before the text moved to its own query).
RECORDED_FIELDS: tuple[str, ...] = (
    *FIELDS[: FIELDS.index("AdminComment")],
    "JobName",
    "Comment",
    "AdminComment",
    "WorkDir",
    "JobIDRaw",
)

#: A completed one-GPU job as sacct 22.05 prints it (values from the local test cluster).
BASE_ROW: dict[str, str] = {
    "JobIDRaw": "101",
    "JobID": "101",
    "State": "COMPLETED",
    "ExitCode": "0:0",
    "DerivedExitCode": "0:0",
    "User": "sgtest1",
    "UID": "1001",
    "Account": "default",
    "Partition": "gpu",
    "QOS": "normal",
    "AllocCPUS": "2",
    "NNodes": "1",
    "ReqMem": "1000M",
    "AllocTRES": "cpu=2,mem=1000M,node=1,billing=2,gres/gpu=1",
    "ReqTRES": "cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1",
    "MaxRSS": "",
    "TotalCPU": "00:01.500",
    "ElapsedRaw": "12",
    "Elapsed": "00:00:12",
    "TimelimitRaw": "10",
    "Timelimit": "00:10:00",
    "Submit": "1795000000",
    "Start": "1795000001",
    "End": "1795000013",
    "NodeList": "vm",
    "JobName": "train",
    "Comment": "",
    "AdminComment": "",
    "NTasks": "",
    "Reason": "None",
    "SubmitLine": "",
    "WorkDir": "/home/sgtest1",
}


def row(**overrides: str) -> dict[str, str]:
    """``BASE_ROW`` with some fields replaced."""
    out = dict(BASE_ROW)
    out.update(overrides)
    return out


def step(job: dict[str, str], name: str, **overrides: str) -> dict[str, str]:
    """A step line of ``job`` (steps carry MaxRSS and their own TotalCPU)."""
    out = dict(job)
    out.update(
        JobIDRaw=f"{job['JobIDRaw']}.{name}",
        JobID=f"{job['JobID']}.{name}",
        JobName=name,
        MaxRSS="0",
        ReqTRES="",
        Account=job["Account"],
    )
    out.update(overrides)
    return out


def render_fields(
    rows: Sequence[Mapping[str, str]],
    fields: Sequence[str],
    delimiter: str = DELIM,
    *,
    allocations: bool = False,
) -> str:
    """sacct ``--parsable2 --noheader --delimiter=… --format=…`` output of ``rows``; with
    ``allocations`` (``--allocations``) only the job lines."""
    return "".join(
        delimiter.join(r[f] for f in fields) + "\n"
        for r in rows
        if not (allocations and "." in r["JobIDRaw"])
    )


def render(rows: Sequence[Mapping[str, str]]) -> str:
    """The accounting query's output (``FIELDS``, ``DELIM``)."""
    return render_fields(rows, FIELDS)


def render_text(rows: Sequence[Mapping[str, str]], delimiter: str = DELIM) -> str:
    """The text query's output (``TEXT_FIELDS``, job lines only)."""
    return render_fields(rows, TEXT_FIELDS, delimiter, allocations=True)


def parse_rows(rows: Sequence[Mapping[str, str]]) -> ParseResult:
    """``rows`` through both queries' parsers, as ``SacctSource`` would see them."""
    return parse_sacct_output(render(rows), text=render_text(rows))


def render_for(rows: Sequence[Mapping[str, str]], argv: Sequence[str]) -> bytes:
    """What sacct would print for ``argv`` (its ``--format``, ``--delimiter`` and
    ``--allocations``); no filtering by job id or time."""
    fmt = next(a for a in argv if a.startswith("--format=")).removeprefix("--format=")
    delim = next(a for a in argv if a.startswith("--delimiter=")).removeprefix("--delimiter=")
    text = render_fields(rows, fmt.split(","), delim, allocations="--allocations" in argv)
    return text.encode("utf-8", "surrogateescape")


def recorded_rows(path: Path) -> list[dict[str, str]]:
    """The records of a recorded file of tests/data/sacct (``RECORDED_FIELDS``), as rows; the
    fields asked for since (``NTasks``, ``Reason``) empty, as sacct prints an unknown."""
    records, skipped = split_records(path.read_bytes().decode("utf-8"), RECORDED_FIELDS)
    assert records and not skipped, f"{path} is not in the recorded format"
    asked = [*FIELDS, *TEXT_FIELDS]
    later = dict.fromkeys([f for f in asked if f not in RECORDED_FIELDS], "")
    return [{**later, **dict(zip(RECORDED_FIELDS, values, strict=True))} for values in records]


class ReplayRunner:
    """A command runner that answers every call with the same result, recording the calls."""

    def __init__(self, stdout: bytes | str = b"", returncode: int = 0, stderr: str = "") -> None:
        self.stdout = stdout.encode() if isinstance(stdout, str) else stdout
        self.returncode = returncode
        self.stderr = stderr
        self.calls: list[list[str]] = []
        self.envs: list[Mapping[str, str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        self.envs.append(dict(env))
        return CommandResult(self.returncode, self.stdout, self.stderr)


class FormatRunner:
    """A command runner that answers each call with ``rows`` rendered as that call asks
    (``render_for``), recording the calls. ``text_override``: what the text query prints
    instead (a test of what sacct prints for crafted strings)."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, str]],
        text_override: Callable[[str], str] | None = None,
    ) -> None:
        self.rows = list(rows)
        self.text_override = text_override
        self.calls: list[list[str]] = []
        self.envs: list[Mapping[str, str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        self.envs.append(dict(env))
        if self.text_override is not None and "--allocations" in argv:
            delim = next(a for a in argv if a.startswith("--delimiter=")).split("=", 1)[1]
            return CommandResult(0, self.text_override(delim).encode(), "")
        return CommandResult(0, render_for(self.rows, argv), "")

    @property
    def accounting_calls(self) -> list[list[str]]:
        """The calls of the accounting query (not the text query)."""
        return [c for c in self.calls if "--allocations" not in c]


_FAKE_SACCT = """\
import json, sys
rows = json.load(open({rows!r}, encoding="utf-8"))
args = sys.argv[1:]
{marker}
fmt = next(a for a in args if a.startswith("--format="))[len("--format="):].split(",")
delim = next(a for a in args if a.startswith("--delimiter="))[len("--delimiter="):]
jobs_only = "--allocations" in args
out = "".join(
    delim.join(r[f] for f in fmt) + "\\n"
    for r in rows
    if not (jobs_only and "." in r["JobIDRaw"])
)
sys.stdout.buffer.write(out.encode("utf-8"))
"""


def write_fake_sacct(
    directory: Path, rows: Sequence[Mapping[str, str]], *, marker: Path | None = None
) -> Path:
    """An executable ``directory/sacct`` that prints ``rows`` as each call asks (fields,
    delimiter, ``--allocations``); with ``marker``, it touches that file when run."""
    data = directory / "sacct-rows.json"
    data.write_text(json.dumps(list(rows)), encoding="utf-8")
    touch = f"open({str(marker)!r}, 'a').close()" if marker is not None else ""
    script = directory / "sacct"
    script.write_text(f"#!{sys.executable} -I\n" + _FAKE_SACCT.format(rows=str(data), marker=touch))
    script.chmod(0o755)
    return script
