"""Wall time of ``gpueff JOBID`` next to ``seff JOBID`` on the same completed job, same run.

Usage (as root, on the cluster host; ``--user`` names the job's owner)::

    python benchmarks/bench_gpueff.py --job 1234 [--seff /path/to/seff] [--runs 21]
        [--config /var/lib/slurm-gpu-testcluster/slurm-gpu.toml] [--user sgtest1]

``seff`` is Slurm's contribs/seff/seff (Debian: from the slurm-wlm source package; it needs
libslurm-perl and libslurmdb-perl); ``--seff`` defaults to the copy ``share/testcluster/get-seff``
installs in ``$TC_ROOT/bin/seff`` when it is there, else to ``seff`` on the PATH. The commands run
alternately so that all see the same slurmdbd and page-cache conditions; the table gives min /
median / max wall seconds for: ``gpueff JOBID`` as the owner (no sacct: the report file the
collector wrote for the owner alone answers, the store being closed to users),
``seff JOBID``, ``gpueff JOBID`` as root (Slurm shows root every job: the store answers too),
``gpueff JOBID`` as another ordinary user (``--other-user``: asks sacct, the path of every
non-owner; under ``PrivateData=jobs`` the answer is "not found", exit 4), each ``--also`` job
of the owner's that the store does not answer (running: the controller answers, ``squeue``
alone; or ended and not collected yet: accounting answers) next to ``seff`` on it (``--running``
and ``--ended`` submit one of each as ``--user``),
the interpreter floor (``python -c pass``, ``python -S -c pass``), ``gpueff --version``
(interpreter, click and settings), the ``sacct`` call gpueff makes on the sacct path and (with
``--running``) the ``squeue`` call it makes for a running job, each timed alone. It also counts
the sacct processes each run starts (``strace``, when installed) and lists the heavy modules it
imports. Last, ``import_probe.py`` shows where the imports of a running job's report spend
their time (the package, its settings, jinja2, the report's modules; building dataclasses and
compiling regular expressions across them), as the owner, in fresh interpreters.

The package's byte code and its records' generated methods are compiled first (as root,
``python -m slurm_gpu.precompile``): an ordinary user cannot write ``__pycache__`` in a
root-owned checkout, and would otherwise compile them on every run. Each ``gpueff`` form is
also timed with those methods' tables renamed aside (``slurm_gpu.methodcache``), alternating
with the other rows: the same command as it ran before them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
#: Where share/testcluster/get-seff installs seff (of the installed Slurm's version).
TC_SEFF = Path(os.environ.get("TC_ROOT", "/var/lib/slurm-gpu-testcluster")) / "bin" / "seff"


def _timed(argv: list[str], user: str | None) -> tuple[float, int, float]:
    """(wall seconds, exit code, CPU seconds of the command and its children)."""
    full = ["runuser", "-u", user, "--", *argv] if user else argv
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, check=False, cwd="/")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, proc.returncode, cpu


def _stats(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def _sacct_runs(argv: list[str], user: str | None) -> str:
    """How many ``sacct`` processes one run of ``argv`` starts (``strace -f``), or ``n/a``."""
    strace = shutil.which("strace")
    if strace is None:
        return "n/a (no strace)"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o777)
        trace = Path(tmp) / "trace"
        # -ff: one file per process, so that the execve calls of processes started at once
        # (gpueff runs its two sacct queries together) are not split into unfinished and
        # resumed lines.
        cmd = [strace, "-ff", "-qq", "-e", "trace=execve", "-o", str(trace), *argv]
        full = ["runuser", "-u", user, "--", *cmd] if user else cmd
        subprocess.run(full, capture_output=True, check=False, cwd="/")
        lines = [ln for f in Path(tmp).glob("trace.*") for ln in f.read_text().splitlines()]
    started = [ln for ln in lines if "execve(" in ln and ln.rstrip().endswith("= 0")]
    return str(sum(1 for ln in started if '/sacct"' in ln.split(",", 1)[0]))


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


def _import_breakdown(python: str, user: str | None, runs: int) -> None:
    """Print where a running job's report imports spend their time: ``import_probe.py`` in
    ``runs`` fresh interpreters as ``user``, the median of each figure."""
    probe = str(Path(__file__).with_name("import_probe.py"))
    full = ["runuser", "-u", user, "--", python, probe] if user else [python, probe]
    got: list[dict[str, float]] = []
    for _ in range(runs):
        done = subprocess.run(full, capture_output=True, text=True, check=False, cwd="/")
        if done.returncode != 0:
            print(f"import probe failed: {done.stderr.strip()[-300:]}")
            return
        got.append(json.loads(done.stdout))

    def med(key: str) -> float:
        return statistics.median(g[key] for g in got)

    print(
        f"\nWhere a running job's report imports go (`benchmarks/import_probe.py`, {runs} fresh "
        f"interpreters as {user or 'root'}; median ms of wall time)\n"
    )
    print("| stage | ms |")
    print("|---|---:|")
    for stage in ("package", "settings", "jinja2", "report", "total"):
        print(f"| {stage} | {med(stage + '_ms'):.1f} |")
    print(f"| of the total: building {med('classes'):.0f} dataclasses | {med('classes_ms'):.1f} |")
    print(
        f"| of the total: compiling {med('regexes'):.0f} regular expressions "
        f"({med('own_regexes'):.0f} of them the package's) | {med('regex_ms'):.1f} |"
    )
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--seff", default=str(TC_SEFF) if TC_SEFF.is_file() else shutil.which("seff"))
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--config", default=os.environ.get("SLURM_GPU_CONFIG", ""))
    ap.add_argument("--user", default=None, help="the job's owner; both commands run as them")
    ap.add_argument(
        "--other-user", default="sgtest2", help="a user who does not own the job (asks sacct)"
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="JOBID",
        help="another of the owner's jobs that the store does not answer (running, or ended and "
        "not collected yet), timed next to seff on the same job; repeatable",
    )
    ap.add_argument(
        "--running",
        action="store_true",
        help="also submit a one-GPU job as --user that sleeps, time gpueff and seff on it while "
        "it runs (as --also), and cancel it at the end",
    )
    ap.add_argument(
        "--ended",
        action="store_true",
        help="also submit a one-GPU job as --user that ends at once, and time gpueff and seff on "
        "it once accounting shows it ended (as --also): the owner's newest job before the "
        "collector has stored it, which accounting answers",
    )
    args = ap.parse_args()
    if not args.seff:
        ap.error("seff not found: pass --seff PATH")
    running = _submit_running(args.user) if args.running else None
    args.running_id = running
    if running is not None:
        args.also.append(running)
    args.ended_id = _submit_ended(args.user) if args.ended else None
    if args.ended_id is not None:
        args.also.append(args.ended_id)
    try:
        return _bench(args)
    finally:
        if running is not None:
            subprocess.run(["scancel", running], check=False)


#: The rows of gpueff run with the generated methods' tables renamed aside.
UNTABLED = "`gpueff JOBID` without the method tables"
UNTABLED_OWNER = f"{UNTABLED} (owner: from the store)"
UNTABLED_OTHER = f"{UNTABLED} as another user (asks sacct)"
#: The row of a Python interpreter that only runs gpueff's sacct (the refused path's floor).
FLOOR = "`python -S` that only runs that `sacct`, as another user"
#: Its program: run argv[1:] and exit with its status.
_SPAWN = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


#: The rows of the interpreter's teardown that the console script skips.
TEARDOWN = "`python` importing a running job's report modules, then exiting"
NO_TEARDOWN = "the same, ending with `os._exit` (what gpueff's console script does)"
#: Those modules (what ``gpueff`` imports for a running job's report).
_REPORT_IMPORTS = (
    "import slurm_gpu.config, slurm_gpu.jobreport.early, slurm_gpu.jobreport.output, "
    "slurm_gpu.jobreport.service, slurm_gpu.jobreport.terminal, slurm_gpu.jobreport.readers"
)


def _submit(user: str | None, wrap: str, limit_min: int, reached: Callable[[str], bool]) -> str:
    """The id of a one-GPU job of ``user``'s running ``wrap``, once ``reached(job_id)`` says
    it is in the state wanted (asked every second for up to 120 s; else cancelled)."""
    argv = ["sbatch", "--parsable", "--gres=gpu:1", f"--time={limit_min}", f"--wrap={wrap}"]
    full = ["runuser", "-u", user, "--", *argv] if user else argv
    job = subprocess.run(full, capture_output=True, text=True, check=True, cwd="/tmp")
    job_id = job.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if reached(job_id):
            return job_id
        time.sleep(1)
    subprocess.run(["scancel", job_id], check=False)
    raise SystemExit(f"job {job_id} did not reach its state within 120 s")


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def _submit_running(user: str | None) -> str:
    """The id of a job of ``user``'s that sleeps on one GPU, once Slurm says it runs."""

    def running(job_id: str) -> bool:
        if _output(["squeue", "-h", "-o", "%T", "-j", job_id]) != "RUNNING":
            return False
        time.sleep(2)  # its prolog has run: accounting has its start
        return True

    return _submit(user, "sleep 1500", 30, running)


def _submit_ended(user: str | None) -> str:
    """The id of a job of ``user``'s on one GPU that has ended, once accounting says so (the
    collector has not stored it: the test cluster runs it only when asked)."""

    def ended(job_id: str) -> bool:
        state = _output(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id])
        return bool(state) and state not in ("PENDING", "RUNNING", "COMPLETING")

    return _submit(user, "sleep 1", 5, ended)


@contextlib.contextmanager
def _tables_hidden(repo: Path) -> Iterator[None]:
    """The generated methods' tables (``slurm_gpu.methodcache``) renamed aside for a while:
    gpueff then runs as it did before them, on the same files."""
    tables = sorted((repo / "slurm_gpu").rglob("__pycache__/*.methods"))
    for table in tables:
        table.rename(table.with_name(table.name + ".hidden"))
    try:
        yield
    finally:
        for table in tables:
            table.with_name(table.name + ".hidden").rename(table)


def _bench(args: argparse.Namespace) -> int:
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "slurm_gpu.precompile"], check=True, cwd=repo)
    if args.config and os.geteuid() == 0:
        # Reports rendered under another release (the code or templates changed since the
        # job was collected) are not used, and gpueff takes its full path: render them under
        # this one, as after an upgrade, so that the collected job's row times its own path.
        subprocess.run(
            [str(VENV_BIN / "slurm-gpu"), "--config", args.config, "store", "reports"],
            check=False,
            cwd="/",
        )
    gpueff = [str(VENV_BIN / "gpueff")]
    if args.config:
        gpueff += ["--config", args.config]
    g_argv = [*gpueff, args.job]
    s_argv = ["perl", args.seff, args.job]
    checks = ((g_argv, args.user, 0), (s_argv, args.user, 0), (g_argv, None, 0))
    for argv, user, expected in (*checks, (g_argv, args.other_user, None)):
        _, rc, _ = _timed(argv, user)  # warm the caches and check that each works
        if rc not in ((0, 4) if expected is None else (expected,)):
            print(f"{' '.join(argv)} exited {rc}", file=sys.stderr)
            return 1
    sys.path.insert(0, str(repo))
    from slurm_gpu.accounting.sacct import SACCT_ENV, build_argv, fields_without

    env_argv = ["env", *(f"{k}={v}" for k, v in SACCT_ENV.items())]
    sacct = shutil.which("sacct") or "sacct"
    lean = fields_without(("QOS",))
    a_argv = [*env_argv, *build_argv(sacct, job_ids=[args.job], fields=lean)]
    python = str(VENV_BIN / "python")
    rows: dict[str, tuple[list[str], str | None]] = {
        "`gpueff JOBID` (owner: from the store)": (g_argv, args.user),
        "`seff JOBID`": (s_argv, args.user),
        "`gpueff JOBID` as root (from the store: Slurm shows root every job)": (g_argv, None),
        "`gpueff JOBID` as another user (asks sacct)": (g_argv, args.other_user),
        "`python -c pass`": ([python, "-c", "pass"], args.user),
        "`python -S -c pass`": ([python, "-S", "-c", "pass"], args.user),
        "`gpueff --version`": ([*gpueff, "--version"], args.user),
        "`sacct` as gpueff calls it (no QOS), alone": (a_argv, args.user),
        # The refused path's own peers: what another user's seff and sacct cost (sacct
        # returns no line to them under PrivateData=jobs, so it skips the TRES table request
        # its AllocTRES and ReqTRES fields cost the owner).
        "`seff JOBID` as another user (refused)": (s_argv, args.other_user),
        "`sacct` as gpueff calls it, as another user (no line returned)": (
            a_argv,
            args.other_user,
        ),
        # The least any Python tool that asks accounting once can cost the refused user: an
        # interpreter without site-packages that starts that sacct and exits.
        FLOOR: ([python, "-S", "-c", _SPAWN, *a_argv], args.other_user),
        # What the console script's exit skips: an interpreter importing the modules a
        # running job's report imports, ended normally and by ``os._exit``.
        TEARDOWN: ([python, "-c", _REPORT_IMPORTS], args.user),
        NO_TEARDOWN: ([python, "-c", _REPORT_IMPORTS + "; import os; os._exit(0)"], args.user),
        # The same console script with the method tables renamed aside (as before them).
        UNTABLED_OWNER: (g_argv, args.user),
        UNTABLED_OTHER: (g_argv, args.other_user),
    }
    untabled_pairs = [
        ("`gpueff JOBID` (owner: from the store)", UNTABLED_OWNER),
        ("`gpueff JOBID` as another user (asks sacct)", UNTABLED_OTHER),
    ]
    if args.running_id is not None:
        from slurm_gpu.accounting.controller import SqueueView, query_delimiter

        q_argv = SqueueView(squeue_path=shutil.which("squeue") or "squeue").argv(
            [args.running_id], query_delimiter()
        )
        rows["`squeue` as gpueff calls it for a running job, alone"] = (
            ["env", "SLURM_TIME_FORMAT=%s", *q_argv],
            args.user,
        )
    pairs: list[tuple[str, str]] = []
    for extra in args.also:
        g_name = f"`gpueff JOBID` (owner, job {extra}: not answered by the store)"
        s_name = f"`seff JOBID` (job {extra})"
        rows[g_name] = ([*gpueff, extra], args.user)
        rows[s_name] = (["perl", args.seff, extra], args.user)
        rows[f"{UNTABLED} (owner, job {extra})"] = ([*gpueff, extra], args.user)
        untabled_pairs.append((g_name, f"{UNTABLED} (owner, job {extra})"))
        pairs.append((g_name, s_name))
    load_start = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in rows}
    cpus: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.runs):
        for name, (argv, user) in rows.items():
            hidden = name.startswith(UNTABLED)
            with _tables_hidden(repo) if hidden else contextlib.nullcontext():
                wall, _, cpu = _timed(argv, user)
            times[name].append(wall)
            cpus[name].append(cpu)
    print(
        f"job {args.job}, {args.runs} runs each, alternating; load average (1 min) "
        f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print("| command | wall s (min / median / max) | CPU s (median) |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {_stats(values)} | {statistics.median(cpus[name]):.3f} |")
    owner = statistics.median(times["`gpueff JOBID` (owner: from the store)"])
    ratio = owner / statistics.median(times["`seff JOBID`"])
    print(f"median ratio gpueff (owner) / seff: {ratio:.2f}")
    for g_name, s_name in pairs:
        each = statistics.median(times[g_name]) / statistics.median(times[s_name])
        print(f"median ratio {g_name} / {s_name}: {each:.2f}")
    other_ratio = statistics.median(
        times["`gpueff JOBID` as another user (asks sacct)"]
    ) / statistics.median(times["`seff JOBID`"])
    print(f"median ratio gpueff (another user) / seff (owner): {other_ratio:.2f}")
    refused_seff_s = statistics.median(times["`seff JOBID` as another user (refused)"])
    refused_ratio = (
        statistics.median(times["`gpueff JOBID` as another user (asks sacct)"]) / refused_seff_s
    )
    print(f"median ratio gpueff (another user) / seff (another user): {refused_ratio:.2f}")
    floor_ratio = statistics.median(times[FLOOR]) / refused_seff_s
    print(f"median ratio {FLOOR} / seff (another user): {floor_ratio:.2f}")
    for with_name, without_name in untabled_pairs:
        print(
            f"method tables, {with_name}: {statistics.median(times[with_name]):.3f} s with, "
            f"{statistics.median(times[without_name]):.3f} s without (median)"
        )
    teardown_s = statistics.median(times[TEARDOWN]) - statistics.median(times[NO_TEARDOWN])
    print(
        f"the interpreter's teardown after the report's imports (median difference): "
        f"{teardown_s * 1e3:.0f} ms"
    )
    _import_breakdown(python, args.user, args.runs)
    owner_sacct = _sacct_runs(g_argv, args.user)
    print(f"sacct processes started by the owner's gpueff JOBID: {owner_sacct}")
    print(f"sacct processes started by root's gpueff JOBID: {_sacct_runs(g_argv, None)}")
    other = _sacct_runs(g_argv, args.other_user)
    print(f"sacct processes started by {args.other_user}'s gpueff JOBID: {other}")
    for extra in args.also:
        runs = _sacct_runs([*gpueff, extra], args.user)
        print(f"sacct processes started by the owner's gpueff {extra}: {runs}")
    print(
        f"heavy packages imported by gpueff JOBID: {', '.join(_heavy_imports(g_argv, args.user))}"
    )
    from results import target_line

    seff_s = statistics.median(times["`seff JOBID`"])
    # The figure is the report-file path's only if the owner's gpueff asked no accounting; a
    # report rendered under another release (a job collected before an upgrade) times the
    # full path, and is said so rather than passed off as the collected job's.
    other_path = owner_sacct not in ("0", "n/a (no strace)")
    print(
        target_line(
            f"`gpueff` as owner, collected job {args.job} (median wall)",
            f"{owner:.3f} s = {ratio:.2f}× seff"
            + (" (NOT the report-file path: the owner's gpueff asked sacct)" if other_path else ""),
            "≤ 0.5× seff",
            ratio <= 0.5 and not other_path,
            peer=f"`seff` {seff_s:.3f} s",
        )
    )
    for g_name, s_name in pairs:
        each = statistics.median(times[g_name]) / statistics.median(times[s_name])
        job = g_name.split("job ", 1)[1].split(":", 1)[0]
        if job == args.running_id:
            kind = "running: the controller answers"
        elif job == args.ended_id:
            kind = "ended, not collected yet: accounting answers"
        else:
            kind = "not answered by the store"
        print(
            target_line(
                f"`gpueff` as owner, job {job} ({kind}; median wall)",
                f"{statistics.median(times[g_name]):.3f} s = {each:.2f}× seff",
                "≤ 1× seff",
                each <= 1.0,
                peer=f"`seff` {statistics.median(times[s_name]):.3f} s",
            )
        )
    print(
        target_line(
            f"`gpueff` on another user's job (refused; median wall), as {args.other_user}",
            f"{statistics.median(times['`gpueff JOBID` as another user (asks sacct)']):.3f} s"
            f" = {other_ratio:.2f}× seff",
            "≤ 1× seff",
            other_ratio <= 1.0,
            peer=f"`seff` as owner {seff_s:.3f} s; as {args.other_user} (refused) "
            f"{refused_seff_s:.3f} s = {refused_ratio:.2f}×; a bare Python that only runs "
            f"that sacct {floor_ratio:.2f}×",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
