"""Slurm accounting adapters: ``sacct`` (default) and ``pyslurm`` (optional extra).

Only the composition roots call ``open_accounting``; everything else takes an
``AccountingSource``.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_gpu.accounting.base import AccountingSource, is_settled
from slurm_gpu.config import Settings
from slurm_gpu.errors import ConfigError


def open_accounting(
    settings: Settings,
    *,
    omit: Iterable[str] = (),
    overlap_text: bool = False,
    batch_scripts: bool = False,
) -> AccountingSource:
    """The accounting source named by ``accounting.backend``. ``omit``: fields the caller does
    not need (``sacct.OMITTABLE``), left out of ``sacct`` queries because they cost time;
    ``overlap_text``: ``sacct``'s two queries run at once (``SacctSource``), for a caller a
    person waits on; ``batch_scripts``: also read the batch scripts' ``#SBATCH`` lines, one
    more ``sacct`` call per user (the collector passes ``accounting.batch_scripts``). The
    pyslurm backend asks in one call and ignores all three.

    Raises ``AccountingError`` when the pyslurm backend is chosen but pyslurm is missing.
    """
    acc = settings.accounting
    if acc.backend == "sacct":
        from slurm_gpu.accounting.sacct import SacctSource

        return SacctSource(
            sacct_path=acc.sacct_path,
            timeout_s=acc.timeout_s,
            batch_size=acc.batch_size,
            omit=omit,
            overlap_text=overlap_text,
            batch_scripts=batch_scripts,
        )
    if acc.backend == "pyslurm":
        from slurm_gpu.accounting.pyslurm_source import PyslurmSource

        return PyslurmSource(batch_size=acc.batch_size)
    raise ConfigError(  # pragma: no cover - config validation rejects other values first
        f"unknown accounting backend {acc.backend!r}", key="accounting.backend"
    )


__all__ = ["AccountingSource", "is_settled", "open_accounting"]
