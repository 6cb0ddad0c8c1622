"""JSON parsing of sealed records, with orjson where it is installed.

The collector parses every sealed record it stores; for a 4-GPU hour the standard library's
parser took about 1 ms of the collector's 5 ms per job, orjson about a fifth of that. orjson is
optional (the ``fast`` extra, for the collector host): without it, or for a text orjson refuses
(``NaN``, lone surrogates, deep nesting), the standard library parses, so the result is the one
``json.loads`` gives, with one exception: orjson reads an integer beyond 64 bits (signed or
unsigned) as a float. No record may hold one (``recordcodec.INT_MAX``): it is refused either
way. Imported on
first use: the hooks, which import the spool code, never load it.
"""

from __future__ import annotations

import json
from typing import Any

from slurm_gpu.lazy import optional_module


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``; ``ValueError`` (``json.JSONDecodeError``) when it is not JSON."""
    fast = optional_module("orjson")
    if fast is not None:
        try:
            return fast.loads(data)
        except fast.JSONDecodeError:
            pass  # what orjson refuses, the standard library decides, as before
    return json.loads(data)
