"""Where the imports of a running job's ``gpueff`` report spend their time (one process).

Run by ``bench_gpueff.py`` as the job's owner, in a fresh interpreter, once per round::

    python benchmarks/import_probe.py

It imports, in the order ``gpueff``'s console script does, the package, its settings, jinja2,
then the rest of the report's modules (``bench_gpueff._REPORT_IMPORTS``), and prints one JSON
object: each stage's wall milliseconds, and across all stages the milliseconds ``dataclasses``
spent building classes (with how many) and ``re`` spent compiling patterns first seen (with
how many, and how many of those the package's own modules compiled). Timing hooks wrap
``dataclasses._process_class`` and ``re._compile`` once the package (which imports both) is
in; their own cost is inside the figures. The package's own stage is timed before them, so
its classes and patterns (few) are not in the counts.
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

#: The stages, in the order gpueff imports them.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("package", ("slurm_gpu",)),
    ("settings", ("slurm_gpu.config",)),
    ("jinja2", ("jinja2",)),
    (
        "report",
        (
            "slurm_gpu.jobreport.early",
            "slurm_gpu.jobreport.output",
            "slurm_gpu.jobreport.service",
            "slurm_gpu.jobreport.terminal",
            "slurm_gpu.jobreport.readers",
        ),
    ),
)


def _in_re(module: str) -> bool:
    return module == "re" or module.startswith("re.")


def main() -> None:
    out: dict[str, Any] = {}
    total = time.perf_counter()
    (first, modules), *rest = STAGES
    for module in modules:
        importlib.import_module(module)
    out[f"{first}_ms"] = (time.perf_counter() - total) * 1e3
    # Loaded by the package already: hooking them now adds nothing to its stage.
    import dataclasses
    import json
    import re

    spent = {"classes_ms": 0.0, "classes": 0, "regex_ms": 0.0, "regexes": 0, "own_regexes": 0}
    seen: set[tuple[Any, ...]] = set()
    process_class = dataclasses._process_class  # type: ignore[attr-defined]
    compile_ = re._compile  # type: ignore[attr-defined]

    def timed_class(*args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return process_class(*args, **kw)
        finally:
            spent["classes_ms"] += (time.perf_counter() - start) * 1e3
            spent["classes"] += 1

    def timed_compile(pattern: Any, flags: Any) -> Any:
        key = (type(pattern), pattern, flags)
        start = time.perf_counter()
        try:
            return compile_(pattern, flags)
        finally:
            if key not in seen:
                seen.add(key)
                spent["regex_ms"] += (time.perf_counter() - start) * 1e3
                spent["regexes"] += 1
                caller = sys._getframe(1)
                while caller is not None and _in_re(caller.f_globals.get("__name__", "")):
                    caller = caller.f_back  # type: ignore[assignment]
                if caller is not None and caller.f_globals.get("__name__", "").startswith(
                    "slurm_gpu"
                ):
                    spent["own_regexes"] += 1

    dataclasses._process_class = timed_class  # type: ignore[attr-defined]
    re._compile = timed_compile  # type: ignore[attr-defined]
    for name, modules in rest:
        start = time.perf_counter()
        for module in modules:
            importlib.import_module(module)
        out[f"{name}_ms"] = (time.perf_counter() - start) * 1e3
    out["total_ms"] = (time.perf_counter() - total) * 1e3
    out.update(spent)
    out["modules"] = len(sys.modules)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
