"""The ``done/`` directory's names and the spool's job directories: where an ingested node's
files go (``done/<job>.<host>.record``, ``.jsonl``, ``.state``) and how they are found again.
"""

from __future__ import annotations

import os

from slurm_gpu.collector.sealedfiles import _JOB_ID, _closing, _job_dirs, _open_parent

#: Per-host spool files moved to ``done/`` with the record (the record last, see ``_finish``).
_KEEP_SUFFIXES = (".jsonl", ".state")
#: Per-host spool files deleted once the job is stored.
_DROP_SUFFIXES = (".live.json", ".pid")


def done_name(job_id: str, host: str, suffix: str) -> str:
    """The name of a node's file in ``done/``: ``<job>.<host><suffix>``."""
    return f"{job_id}.{host}{suffix}"


def _index_record(index: dict[str, list[str]], name: str) -> None:
    """Add ``name`` to ``index`` under its job id when it is a record of flat ``done/``."""
    job, dot, rest = name.partition(".")
    if dot and rest.endswith(".record") and len(rest) > len(".record") and _JOB_ID.fullmatch(job):
        index.setdefault(job, []).append(name)


def _touch(name: str, dir_fd: int) -> None:
    """Set ``name``'s times to now: a rename keeps a file's modification time, and ``done/``
    is pruned by the time a file was moved there."""
    os.utime(name, dir_fd=dir_fd, follow_symlinks=False)


def _id_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (1 << 62, job_id)


def _spool_job_dirs(spool_dir: str) -> set[str]:
    try:
        fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return set()
    with _closing(fd):
        return set(_job_dirs(fd))


def _has_record(spool_dir: str, job_id: str, dirs: set[str]) -> bool:
    if job_id not in dirs:
        return False
    try:
        parent, _ = _open_parent(os.path.join(spool_dir, job_id, "x"), (spool_dir,))
        with _closing(parent):
            return any(n.endswith(".record") for n in os.listdir(parent))
    except OSError:
        return False
