"""Build sacct output the way ``SacctSource`` asks for it, and a runner that replays it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.accounting.sacct import DELIM, FIELDS

DATA = Path(__file__).resolve().parent.parent / "data" / "sacct"

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


def render(rows: Sequence[Mapping[str, str]]) -> str:
    """sacct ``--parsable2 --noheader --delimiter=DELIM --format=FIELDS`` output."""
    return "".join(DELIM.join(r[f] for f in FIELDS) + "\n" for r in rows)


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
