"""Wall time of ``gpueff JOBID`` next to ``seff JOBID`` on the same completed job, same run.

Usage (as the job's owner, or root)::

    python benchmarks/bench_gpueff.py --job 1234 [--seff /path/to/seff] [--runs 15]
        [--config /var/lib/slurm-gpu-testcluster/slurm-gpu.toml] [--user sgtest1]

``seff`` is Slurm's contribs/seff/seff (Debian: from the slurm-wlm source package; it needs
libslurm-perl and libslurmdb-perl). The two commands run alternately so that both see the same
slurmdbd and page-cache conditions; the table gives min / median / max wall seconds, plus the
startup floor of ``gpueff --version``, the ``sacct`` call gpueff makes timed alone (its lower
bound: gpueff waits for it), and the heavy modules ``gpueff`` imports for the job.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def _timed(argv: list[str], user: str | None) -> tuple[float, int]:
    full = ["runuser", "-u", user, "--", *argv] if user else argv
    start = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, check=False, cwd="/")
    return time.perf_counter() - start, proc.returncode


def _stats(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def _heavy_imports(argv: list[str], user: str | None) -> list[str]:
    """Top-level packages imported by one gpueff run, from ``python -X importtime``."""
    cmd = [sys.executable, "-X", "importtime", str(VENV_BIN / "gpueff"), *argv[1:]]
    full = ["runuser", "-u", user, "--", *cmd] if user else cmd
    err = subprocess.run(full, capture_output=True, text=True, check=False, cwd="/").stderr
    tops = set()
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if not name.startswith(" "):
                tops.add(name.split(".")[0])
    heavy = {"sqlalchemy", "pandas", "matplotlib", "pynvml", "jinja2", "click"}
    return sorted(t for t in tops if t in heavy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--seff", default=shutil.which("seff"))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--config", default=os.environ.get("SLURM_GPU_CONFIG", ""))
    ap.add_argument("--user", default=None, help="run both commands as this user")
    args = ap.parse_args()
    if not args.seff:
        ap.error("seff not found: pass --seff PATH")
    gpueff = [str(VENV_BIN / "gpueff")]
    if args.config:
        gpueff += ["--config", args.config]
    g_argv = [*gpueff, args.job]
    s_argv = ["perl", args.seff, args.job]
    for argv in (g_argv, s_argv):  # warm the page cache and check both work
        _, rc = _timed(argv, args.user)
        if rc != 0:
            print(f"{' '.join(argv)} exited {rc}", file=sys.stderr)
            return 1
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from slurm_gpu.accounting.sacct import SACCT_ENV, build_argv

    env_argv = ["env", *(f"{k}={v}" for k, v in SACCT_ENV.items())]
    a_argv = [*env_argv, *build_argv(shutil.which("sacct") or "sacct", job_ids=[args.job])]
    g_times, s_times, v_times, a_times = [], [], [], []
    for _ in range(args.runs):
        g_times.append(_timed(g_argv, args.user)[0])
        s_times.append(_timed(s_argv, args.user)[0])
        v_times.append(_timed([*gpueff, "--version"], args.user)[0])
        a_times.append(_timed(a_argv, args.user)[0])
    print(f"job {args.job}, {args.runs} runs each, alternating; wall seconds min / median / max")
    print("| command | wall s (min / median / max) |")
    print("|---|---|")
    print(f"| `gpueff JOBID` | {_stats(g_times)} |")
    print(f"| `seff JOBID` | {_stats(s_times)} |")
    print(f"| `gpueff --version` (startup floor) | {_stats(v_times)} |")
    print(f"| `sacct` as gpueff calls it, alone | {_stats(a_times)} |")
    ratio = statistics.median(g_times) / statistics.median(s_times)
    print(f"median ratio gpueff/seff: {ratio:.2f}")
    print(
        f"heavy packages imported by gpueff JOBID: {', '.join(_heavy_imports(g_argv, args.user))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
