"""Where the project's data files are: a checkout's top-level ``templates/`` and ``share/``,
or, for an installed package, ``<prefix>/share/slurm-gpu/`` (setup.cfg ``data_files``)."""

from __future__ import annotations

import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]


def data_dir(name: str) -> Path:
    """``templates`` or ``share``: the checkout's copy when running from one (editable
    install, tests), else the installed copy under ``sys.prefix``."""
    local = _CHECKOUT / name
    if local.is_dir():
        return local
    return Path(sys.prefix) / "share" / "slurm-gpu" / name
