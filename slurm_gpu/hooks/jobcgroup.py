"""Keep the sampler out of the job's cgroup when Slurm runs the prolog inside it.

``PrologFlags=RunInJob`` (Slurm 24.05+) runs the prolog in the job's extern step cgroup, so a
sampler the prolog starts would be counted against the job's memory limit and CPU time, frozen
when the job is suspended and killed with it. On cgroup v1 the prolog (root) moves the sampler
back to the cgroup the job's tree hangs from, controller by controller. On cgroup v2 that is
not possible (the job's parent, ``slurmstepd.scope``, holds no processes of its own by the
"no internal processes" rule), so the caller logs that the sampler runs inside the job.

Only ``/proc/<pid>/cgroup`` (written by the kernel) decides what is moved where.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CgroupLine:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-id:controllers:path``."""

    controllers: str
    """Comma-separated v1 controllers (``cpu,cpuacct``, ``name=systemd``); empty for v2."""
    path: str


def parse_proc_cgroup(text: str) -> list[CgroupLine]:
    """The lines of a ``/proc/<pid>/cgroup`` file (malformed lines skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            out.append(CgroupLine(parts[1], parts[2]))
    return out


def _job_index(path: str, job_id: str) -> int | None:
    """Index of the ``job_<id>`` component of ``path`` split on ``/``, or ``None``."""
    parts = path.split("/")
    return parts.index(f"job_{job_id}") if f"job_{job_id}" in parts else None


def inside_job(lines: list[CgroupLine], job_id: str) -> list[CgroupLine]:
    """The lines that put the process inside job ``job_id``'s cgroup."""
    return [ln for ln in lines if _job_index(ln.path, job_id) is not None]


def escape_path(path: str, job_id: str) -> str:
    """The cgroup the job's tree hangs from: ``path`` cut before Slurm's own top directory
    (``slurm`` or ``slurm_<node>`` on cgroup v1), or before ``uid_<uid>``/``job_<id>``."""
    parts = path.split("/")
    idx = _job_index(path, job_id)
    assert idx is not None
    cut = idx
    if cut > 0 and parts[cut - 1].startswith("uid_"):
        cut -= 1
    if cut > 0 and (parts[cut - 1] == "slurm" or parts[cut - 1].startswith("slurm_")):
        cut -= 1
    return "/".join(parts[:cut]) or "/"


def _v1_mount_dir(controllers: str) -> str:
    """The directory name of a v1 hierarchy under /sys/fs/cgroup (``name=systemd`` ->
    ``systemd``)."""
    return controllers[len("name=") :] if controllers.startswith("name=") else controllers


def move_out_of_job(
    pid: int, job_id: str, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> tuple[list[str], list[str]]:
    """Move ``pid`` out of job ``job_id``'s cgroups; returns (moved, not_moved) controllers.

    A v2 line is never moved (reported as ``unified``); a v1 controller whose target cannot be
    written is reported with the reason.
    """
    with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="ascii") as fh:
        lines = inside_job(parse_proc_cgroup(fh.read(64 * 1024)), job_id)
    moved: list[str] = []
    failed: list[str] = []
    for line in lines:
        if not line.controllers:
            failed.append("unified (cgroup v2)")
            continue
        target = os.path.join(
            cgroup_root, _v1_mount_dir(line.controllers), escape_path(line.path, job_id).lstrip("/")
        )
        try:
            with open(os.path.join(target, "cgroup.procs"), "w", encoding="ascii") as fh:
                fh.write(f"{pid}\n")
            moved.append(line.controllers)
        except OSError as exc:
            failed.append(f"{line.controllers} ({exc.strerror})")
    return moved, failed
