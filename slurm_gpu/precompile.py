"""``python -m slurm_gpu.precompile``: byte code and generated dataclass methods, kept.

Run once after installing or upgrading, as the account that owns the installed package (root
on a cluster). Users cannot write the package's ``__pycache__``, so whatever is not compiled
there is compiled again at every run of theirs: the modules' byte code (``compileall``) and the
methods ``dataclasses`` generates for the package's records (``methodcache``). Exit codes:
0 done, 1 a file could not be written (the message says which), 2 a usage error.
"""

from __future__ import annotations

import compileall
import os
import sys

from slurm_gpu import methodcache


def main(argv: list[str] | None = None) -> int:
    """Compile the installed package's byte code, then write its method tables."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        sys.stderr.write("usage: python -m slurm_gpu.precompile\n")
        return 2
    package = os.path.dirname(os.path.abspath(methodcache.__file__))
    try:
        if not compileall.compile_dir(package, quiet=1):
            sys.stderr.write("slurm_gpu.precompile: some modules did not compile\n")
            return 1
        written, methods = methodcache.build()
    except OSError as exc:
        sys.stderr.write(f"slurm_gpu.precompile: cannot write: {exc}\n")
        sys.stderr.write("hint: run it as the account that owns the installed package\n")
        return 1
    sys.stdout.write(f"byte code compiled; {methods} generated methods of {written} modules kept\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
