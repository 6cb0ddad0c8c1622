"""Which partitions give every job whole nodes, as Slurm itself says (``OverSubscribe``).

A partition configured ``OverSubscribe=EXCLUSIVE`` allocates every job all the CPUs of its
nodes whatever it requested (``slurm.conf(5)``). The collector reads that once per pass with
``scontrol show partition --oneliner`` and adds those partitions to
``[analysis] exclusive_partitions``, so a site need not list them twice, and a job there that
requested exactly a whole node (which accounting cannot tell from an exclusive allocation) is
judged as one too.
"""

from __future__ import annotations

import os
import re

from slurm_gpu.accounting.runner import CommandRunner, SubprocessRunner
from slurm_gpu.errors import AccountingError

#: A partition name as slurm.conf allows it; anything else in scontrol's output is ignored.
_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
#: Bytes of scontrol output read at most (a few hundred bytes per partition).
MAX_OUTPUT_BYTES = 4 * 1024 * 1024


def scontrol_path_for(sacct_path: str) -> str:
    """The scontrol beside an absolute ``sacct_path`` (the client commands ship together),
    else ``scontrol`` from PATH."""
    if os.path.isabs(sacct_path):
        return os.path.join(os.path.dirname(sacct_path), "scontrol")
    return "scontrol"


def parse_exclusive(text: str) -> frozenset[str]:
    """The names of the partitions with ``OverSubscribe=EXCLUSIVE`` in the output of
    ``scontrol show partition --oneliner`` (one partition per line, ``Key=Value`` fields)."""
    found = set()
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields.get("PartitionName", "")
        if fields.get("OverSubscribe", "").upper() == "EXCLUSIVE" and _NAME.fullmatch(name):
            found.add(name)
    return frozenset(found)


def exclusive_partitions(
    scontrol_path: str = "scontrol",
    *,
    runner: CommandRunner | None = None,
    timeout_s: float = 30.0,
) -> frozenset[str]:
    """The partitions Slurm configures ``OverSubscribe=EXCLUSIVE``.

    Raises ``AccountingError`` when scontrol cannot run, fails, or prints more than
    ``MAX_OUTPUT_BYTES``."""
    run = runner or SubprocessRunner()
    argv = [scontrol_path, "show", "partition", "--oneliner"]
    done = run(argv, env={"SLURM_TIME_FORMAT": "standard"}, timeout_s=timeout_s)
    if done.returncode != 0:
        raise AccountingError(
            f"{scontrol_path} show partition failed (exit {done.returncode})",
            stderr=done.stderr,
            hint="is slurmctld up? set [analysis] exclusive_partitions_from_slurm = false to "
            "rely on [analysis] exclusive_partitions alone",
        )
    if len(done.stdout) > MAX_OUTPUT_BYTES:
        raise AccountingError(
            f"{scontrol_path} show partition printed over {MAX_OUTPUT_BYTES} bytes",
            hint="list the exclusive partitions in [analysis] exclusive_partitions instead",
        )
    return parse_exclusive(done.stdout.decode("utf-8", "replace"))
