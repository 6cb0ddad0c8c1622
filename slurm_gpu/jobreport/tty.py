"""Whether ``gpueff`` writes colour: standard library only, for its fast entry point."""

from __future__ import annotations

import os
import sys


def use_colour(flag: bool | None) -> bool:
    """Colour when asked, else on a terminal unless ``NO_COLOR`` is set or ``TERM=dumb``."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
