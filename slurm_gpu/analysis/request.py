"""How the job asked for its resources, so that advice is written in the same form.

A script written with ``--gpus=2`` or ``--ntasks=2 --gpus-per-task=1`` that is told
``#SBATCH --gres=gpu:a100:1`` cannot use the line as it is (sbatch refuses a typed and an
untyped GPU request together: "Invalid GRES specification (with and without type
identification)"), and a GPU type the user never asked for narrows where the job can run. The
request's style is read from the command line the job was submitted with (sacct's
``SubmitLine``, Slurm 20.11 and later), over the ``#SBATCH`` lines of the batch script where
the site keeps scripts (``accounting.batchscript``), and, for the GPU type, from ReqTRES (a
typed ``gres/gpu:<type>`` there only when the user asked for one: AllocTRES names the type of
every GPU given, asked for or not). Where neither says anything of a resource, the style is
unknown and the usual form is used (``--gres`` on one node, ``--gpus`` on several,
``--cpus-per-task``, ``--mem``).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from slurm_gpu.records import JobRecord

#: Request forms of the GPU count.
GRES = "gres"
GPUS = "gpus"
GPUS_PER_NODE = "gpus-per-node"
GPUS_PER_TASK = "gpus-per-task"
#: Request forms of the cores and of the memory.
CPUS_PER_TASK = "cpus-per-task"
CPUS_PER_GPU = "cpus-per-gpu"
MEM = "mem"
MEM_PER_GPU = "mem-per-gpu"
MEM_PER_CPU = "mem-per-cpu"

#: Short options of sbatch/salloc/srun and their long names (those read here).
_SHORT = {"-G": "--gpus", "-c": "--cpus-per-task", "-n": "--ntasks", "-N": "--nodes"}
#: Short options that take no value (all others do).
_SHORT_FLAGS = frozenset({"-h", "-H", "-I", "-k", "-O", "-Q", "-s", "-v", "-V", "-W", "-u"})
#: Long options that take no value (an option without ``=`` not listed here takes the next
#: word as its value only when it is one of ``_READ``).
_READ = frozenset(
    {
        "--gres",
        "--gpus",
        "--gpus-per-node",
        "--gpus-per-task",
        "--cpus-per-task",
        "--cpus-per-gpu",
        "--mem",
        "--mem-per-gpu",
        "--mem-per-cpu",
        "--ntasks",
        "--ntasks-per-node",
        "--nodes",
    }
)


@dataclass(frozen=True, slots=True)
class Request:
    """The job's request, as far as its submit line and ReqTRES tell."""

    gpu_form: str | None = None
    """``gres``, ``gpus``, ``gpus-per-node`` or ``gpus-per-task``; ``None``: unknown."""
    gpu_type: str | None = None
    """The GPU type the user asked for; ``None`` when it asked for none (or it is unknown)."""
    gpus_per_task: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpu_form: str | None = None
    """``cpus-per-task`` or ``cpus-per-gpu``; ``None``: not on the submit line."""
    cpus_value: int | None = None
    """The value given to ``cpu_form``."""
    mem_form: str | None = None
    """``mem``, ``mem-per-gpu`` or ``mem-per-cpu``; ``None``: not on the submit line."""
    from_submit_line: bool = False
    """Some resource option was read from the job's own request (its submit line or its batch
    script's ``#SBATCH`` lines)."""

    @property
    def cores_per_gpu(self) -> bool:
        """Cores come with each GPU: ``--cpus-per-gpu``, or ``--cpus-per-task`` with
        ``--gpus-per-task`` (a GPU cut then takes their cores with it)."""
        return self.cpu_form == CPUS_PER_GPU or (
            self.cpu_form == CPUS_PER_TASK and self.gpu_form == GPUS_PER_TASK
        )


def _options(line: str) -> list[tuple[str, str]]:
    """(long option, value) pairs of a submit line, up to its first word that is not an
    option (the script); ``[]`` for a line that does not split."""
    try:
        words = shlex.split(line)
    except ValueError:
        return []
    return _options_of(words[1:])  # past the command itself


def _directive_options(directives: str) -> list[tuple[str, str]]:
    """(long option, value) pairs of a script's ``#SBATCH`` lines, in order; a line that
    does not split is skipped (sbatch would refuse it)."""
    out: list[tuple[str, str]] = []
    for line in directives.splitlines():
        try:
            words = shlex.split(line.strip().removeprefix("#SBATCH"), comments=True)
        except ValueError:
            continue
        out.extend(_options_of(words))
    return out


def _options_of(words: list[str]) -> list[tuple[str, str]]:
    """(long option, value) pairs of ``words``, up to the first word that is not an option."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--" or not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if not eq and name in _READ and i < len(words):
                value = words[i]
                i += 1
            out.append((name, value))
            continue
        short, value = word[:2], word[2:]
        if short in _SHORT_FLAGS:
            continue
        if not value and i < len(words):
            value = words[i]
            i += 1
        out.append((_SHORT.get(short, short), value))
    return out


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _typed_count(value: str) -> tuple[str | None, int | None]:
    """``a100:2`` -> (``a100``, 2); ``2`` -> (None, 2); the first entry of a list."""
    first = value.split(",", 1)[0]
    parts = first.split(":")
    if len(parts) == 1:
        return None, _int(parts[0])
    return parts[0] or None, _int(parts[-1])


def _gres_gpu(value: str) -> tuple[str | None, int | None] | None:
    """``gpu:a100:2`` -> (``a100``, 2); ``gpu:2`` -> (None, 2); ``gpu`` -> (None, 1); ``None``
    when no entry of the list is a GPU."""
    for entry in value.split(","):
        parts = entry.split(":")
        if parts[0].removeprefix("gres/") != "gpu":
            continue
        if len(parts) == 1:
            return None, 1
        if len(parts) == 2:
            count = _int(parts[1])
            return (None, count) if count is not None else (parts[1], 1)
        return parts[1], _int(parts[2])
    return None


def request_of(job: JobRecord) -> Request:
    """The job's request style (``Request``): the batch script's ``#SBATCH`` lines, then the
    submit line's options, the last one of a kind winning as in sbatch (its command line
    overrides the script); the GPU type from those, else from ReqTRES."""
    gpu_form = gpu_type = cpu_form = mem_form = None
    gpus_per_task = ntasks = ntasks_per_node = cpus_value = None
    seen = False
    options = _directive_options(job.batch_directives or "") + _options(job.submit_line or "")
    for name, value in options:
        if name == "--gres":
            got = _gres_gpu(value)
            if got is not None:
                gpu_form, gpu_type, seen = GRES, got[0], True
        elif name in ("--gpus", "--gpus-per-node", "--gpus-per-task"):
            gpu_form, seen = name[2:], True
            gpu_type, count = _typed_count(value)
            if name == "--gpus-per-task":
                gpus_per_task = count
        elif name in ("--cpus-per-task", "--cpus-per-gpu"):
            cpu_form, cpus_value, seen = name[2:], _int(value), True
        elif name in ("--mem", "--mem-per-gpu", "--mem-per-cpu"):
            mem_form, seen = name[2:], True
        elif name == "--ntasks":
            ntasks = _int(value)
        elif name == "--ntasks-per-node":
            ntasks_per_node = _int(value)
    if gpu_form is None:
        typed = job.req_tres.gpu_types
        gpu_type = typed[0][0] if len(typed) == 1 else None
    return Request(
        gpu_form=gpu_form,
        gpu_type=gpu_type,
        gpus_per_task=gpus_per_task,
        ntasks=ntasks,
        ntasks_per_node=ntasks_per_node,
        cpu_form=cpu_form,
        cpus_value=cpus_value,
        mem_form=mem_form,
        from_submit_line=seen,
    )


def gpu_lines(req: Request, gpus: int, nnodes: int) -> tuple[tuple[str, ...], str]:
    """(``#SBATCH`` lines, the proposed value as shown) asking for ``gpus`` GPUs in all over
    ``nnodes`` nodes, in the job's own form and with its own GPU type (none if it named none).
    ``--gpus-per-task`` keeps the GPUs per task and changes the task count."""
    kind = f"{req.gpu_type}:" if req.gpu_type else ""
    nodes = max(nnodes, 1)
    per_node = math.ceil(gpus / nodes)
    form = req.gpu_form or (GRES if nodes == 1 else GPUS)
    if form == GRES:
        return (f"#SBATCH --gres=gpu:{kind}{per_node}",), f"gpu:{kind}{per_node}"
    if form == GPUS_PER_NODE:
        return (f"#SBATCH --gpus-per-node={kind}{per_node}",), f"{kind}{per_node}"
    if form == GPUS_PER_TASK:
        per_task = req.gpus_per_task or 1
        tasks = math.ceil(gpus / per_task)
        if req.ntasks_per_node is not None and req.ntasks is None:
            each = math.ceil(tasks / nodes)
            return (f"#SBATCH --ntasks-per-node={each}",), f"{each} tasks per node"
        return (f"#SBATCH --ntasks={tasks}",), f"{tasks} tasks"
    return (f"#SBATCH --gpus={kind}{gpus}",), f"{kind}{gpus}"


def current_gpus(req: Request, gpus: int, nnodes: int) -> str:
    """What the job asked for, as ``gpu_lines`` shows a proposal."""
    return gpu_lines(req, gpus, nnodes)[1]


def tasks_per_node(req: Request, gpus_per_node: int, nnodes: int) -> int:
    """Tasks on one node once the GPUs per node are ``gpus_per_node`` (at least 1)."""
    if req.gpu_form == GPUS_PER_TASK and req.gpus_per_task:
        return max(1, math.ceil(gpus_per_node / req.gpus_per_task))
    if req.ntasks_per_node:
        return req.ntasks_per_node
    if req.ntasks:
        return max(1, math.ceil(req.ntasks / max(nnodes, 1)))
    return 1


def cpu_line(req: Request, cores_per_node: int, gpus_per_node: int, nnodes: int) -> tuple[str, int]:
    """(``#SBATCH`` line, its value) giving a node at least ``cores_per_node`` cores with
    ``gpus_per_node`` GPUs on it, in the job's form: per GPU where it asked per GPU, else per
    task. A job whose request names no CPU option may still name one in a batch script the
    site does not keep: ``--cpus-per-task`` is the common form there, and a
    ``--cpus-per-gpu`` line beside it would make sbatch refuse the script."""
    if req.cpu_form != CPUS_PER_GPU or not gpus_per_node:
        tasks = tasks_per_node(req, gpus_per_node, nnodes)
        value = max(1, math.ceil(cores_per_node / tasks))
        return f"#SBATCH --cpus-per-task={value}", value
    value = max(1, math.ceil(cores_per_node / gpus_per_node))
    return f"#SBATCH --cpus-per-gpu={value}", value


def mem_line(
    req: Request, per_node_bytes: int, gpus_per_node: int, cpus_per_node: int, round_bytes: int
) -> tuple[str, int]:
    """(``#SBATCH`` line, bytes per unit) asking for at least ``per_node_bytes`` on a node, in
    the job's form: per GPU, per CPU, or per node (``--mem``), rounded up to ``round_bytes``."""

    def up(value: float) -> int:
        return int(math.ceil(value / round_bytes - 1e-9) * round_bytes)

    if req.mem_form == MEM_PER_GPU and gpus_per_node:
        each = up(per_node_bytes / gpus_per_node)
        return f"#SBATCH --mem-per-gpu={format_size(each)}", each
    if req.mem_form == MEM_PER_CPU and cpus_per_node:
        # Per CPU in MiB steps: rounding each CPU's share up to whole GiB would multiply out.
        each = math.ceil(per_node_bytes / cpus_per_node / 1024**2) * 1024**2
        return f"#SBATCH --mem-per-cpu={format_size(each)}", each
    total = up(per_node_bytes)
    return f"#SBATCH --mem={format_size(total)}", total


def format_size(nbytes: int) -> str:
    """Whole GiB (``16G``) where exact, else MiB (``1500M``), as sbatch reads them."""
    gib = 1024**3
    if nbytes % gib == 0:
        return f"{nbytes // gib}G"
    return f"{math.ceil(nbytes / 1024**2)}M"
