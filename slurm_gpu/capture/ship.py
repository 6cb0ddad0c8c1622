"""Shipping sealed records from a node's local spool to the collector's shared inbox.

The spool must be local to the node: the epilog's time bound would not survive a hung network
filesystem. So the epilog only seals locally, and ``slurm-gpu ship`` (a per-node timer, never a
hook) copies each sealed ``<job>/<host>.record`` to ``<inbox>/<job>/<host>.record`` — written
to a temporary name, fsynced, then renamed, so the collector never sees a partial file — and
only then removes the node's files of that job. A crash at any point leaves the record in the
spool (shipped again next time: the rename makes that idempotent) or in the inbox, never
nowhere.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from slurm_gpu.capture.spool import JOB_DIR_MODE, JobSpool, list_sealed, write_atomic

#: Node-local files of a job that are no longer needed once its record reached the inbox.
#: The live file goes too: ``gpueff`` reads the store for finished jobs.
_LOCAL_SUFFIXES = (".jsonl", ".state", ".live.json", ".record")


@dataclass(frozen=True, slots=True)
class ShipResult:
    """What one pass shipped (``job/host`` names) and what failed, with the reason."""

    shipped: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]


def ship(spool_dir: str, inbox_dir: str) -> ShipResult:
    """Copy every sealed record in ``spool_dir`` to ``inbox_dir``, then tidy the node's files.

    A record whose sampler is still running (a pid file is present) is left alone: the epilog
    has not finished with it. One failing record does not stop the others.
    """
    shipped: list[str] = []
    failed: list[tuple[str, str]] = []
    for sealed in list_sealed(spool_dir):
        name = f"{sealed.job_id}/{sealed.hostname}"
        local = JobSpool(spool_dir, sealed.job_id, sealed.hostname)
        if os.path.exists(local.pid):
            continue
        try:
            with open(sealed.path, "rb") as fh:
                data = fh.read()
            dest_dir = os.path.join(inbox_dir, sealed.job_id)
            with contextlib.suppress(FileExistsError):
                os.mkdir(dest_dir, JOB_DIR_MODE)
            write_atomic(os.path.join(dest_dir, os.path.basename(sealed.path)), data)
        except OSError as exc:
            failed.append((name, exc.strerror or str(exc)))
            continue
        remove_local(local)
        shipped.append(name)
    return ShipResult(tuple(shipped), tuple(failed))


def remove_local(local: JobSpool) -> None:
    """Remove a shipped record's node-local files, and its job directory once empty. Called
    only after the record reached the collector's side (renamed into the inbox, or its INSERT
    committed)."""
    for suffix in _LOCAL_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(local.job_dir, local.hostname + suffix))
    with contextlib.suppress(OSError):
        os.rmdir(local.job_dir)  # only when empty
