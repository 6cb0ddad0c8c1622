"""The ``#SBATCH`` lines of a job's batch script, from ``sacct --batch-script``.

A script written with ``#SBATCH --gpus=2`` and submitted as ``sbatch train.sh`` names no
resource on its submit line: its request style is in the script. Slurm keeps the script in
accounting where the site sets ``AccountingStoreFlags=job_script`` (21.08 and later), and
``sacct --batch-script -j <ids>`` prints each kept one as::

    Batch Script for <id>
    --------------------------------------------------------------------------------
    <the script>

(nothing for a job without a script: ``srun`` and ``salloc`` jobs, or one stored before the
flag was set). Only the directives are kept, read the way sbatch reads them: after the
``#!`` line, comment and blank lines, up to the first command or the ``#SBATCH hetjob`` line
that starts a second component. The script is user text: a header line inside one is taken
as nobody's (``split_scripts``), the kept lines are bounded and cleaned.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from slurm_gpu.textsafe import clean_user_text

#: Directive lines kept from one script (sbatch reads more; no request needs this many).
MAX_DIRECTIVE_LINES = 64
#: Characters kept of one directive line.
MAX_DIRECTIVE_LEN = 512
#: Bytes of ``sacct --batch-script`` output read for one query (the rest is not read: a
#: script's directives are at its top, and Slurm's own cap on one script is 4 MiB by default).
MAX_OUTPUT_BYTES = 8 * 1024 * 1024

_HEADER_RE = re.compile(r"Batch Script for (\S+)\n-{20,}\n")
_DIRECTIVE = "#SBATCH"
#: Directive words that start the next component of a heterogeneous job.
_NEXT_COMPONENT = frozenset({"hetjob", "packjob"})


def split_scripts(output: str, job_ids: Sequence[str]) -> dict[str, str]:
    """Raw job id -> its script, for the ids of ``job_ids`` that have a section in
    ``output``. A job whose header appears more than once (a script that prints a header
    line) is left out, and the text after a header line up to the next one belongs to that
    header only: no script can hand another job its lines."""
    wanted = set(job_ids)
    heads = [m for m in _HEADER_RE.finditer(output) if m.group(1) in wanted]
    counts = Counter(m.group(1) for m in heads)
    out: dict[str, str] = {}
    for i, m in enumerate(heads):
        job_id = m.group(1)
        if counts[job_id] != 1:
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(output)
        out[job_id] = output[m.end() : end]
    return out


def directives_of(script: str) -> str | None:
    """The script's ``#SBATCH`` lines as sbatch reads them (up to its first command), each
    cleaned and cut to ``MAX_DIRECTIVE_LEN`` characters, at most ``MAX_DIRECTIVE_LINES`` of
    them, joined by newlines; ``None`` when there is none."""
    kept: list[str] = []
    for number, raw in enumerate(script.splitlines()):
        line = raw.strip()
        if number == 0 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break  # the first command: sbatch reads no directive after it
        if not line.startswith(_DIRECTIVE):
            continue
        body = line[len(_DIRECTIVE) :]
        if body and not body[0].isspace():
            continue  # "#SBATCHX": a comment, not a directive
        words = body.split("#", 1)[0].split()
        if words and words[0] in _NEXT_COMPONENT:
            break
        kept.append(clean_user_text(line, MAX_DIRECTIVE_LEN))
        if len(kept) == MAX_DIRECTIVE_LINES:
            break
    return "\n".join(kept) if kept else None
