"""Where the project's data files are: a checkout's top-level ``templates/`` and ``share/``,
or, for an installed package, ``<prefix>/share/slurm-gpu/`` (setup.cfg ``data_files``).

Standard library ``os.path`` only: ``gpueff``'s fast path locates the templates through
``data_path`` without importing ``pathlib``."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def data_path(name: str) -> str:
    """``templates`` or ``share``: the checkout's copy when running from one (editable
    install, tests), else the installed copy under ``sys.prefix``."""
    local = os.path.join(_CHECKOUT, name)
    if os.path.isdir(local):
        return local
    return os.path.join(sys.prefix, "share", "slurm-gpu", name)


def data_dir(name: str) -> Path:
    """``data_path`` as a ``Path``."""
    from pathlib import Path

    return Path(data_path(name))
