"""Helpers for tests that run against the local Slurm test cluster (share/testcluster/start).

Everything here shells out to the real Slurm commands (sbatch, squeue, sacct, sinfo,
scontrol), as root or, through ``runuser``, as one of the ordinary test users.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_gpu.accounting.base import FINAL_STATES

REPO = Path(__file__).resolve().parents[2]
START_SCRIPT = REPO / "share" / "testcluster" / "start"
STOP_SCRIPT = REPO / "share" / "testcluster" / "stop"
DEFAULT_TC_ROOT = "/var/lib/slurm-gpu-testcluster"
TEST_USERS = ("sgtest1", "sgtest2")

#: Job states after which a job never runs again (sacct's first word of State).
TERMINAL_STATES = FINAL_STATES


class ClusterError(RuntimeError):
    """The test cluster is not usable, or a Slurm command failed."""


def tc_root() -> Path:
    """The test cluster's state directory (``$TC_ROOT`` or the default)."""
    return Path(os.environ.get("TC_ROOT", DEFAULT_TC_ROOT))


def slurm_gpu_config_path() -> Path:
    """The slurm-gpu configuration file the cluster's hooks use."""
    return tc_root() / "slurm-gpu.toml"


def venv_python() -> Path:
    """The interpreter the cluster's hooks run, usable by the test users too."""
    return Path(os.environ.get("VENV", str(REPO / ".venv"))) / "bin" / "python"


def run_as(
    user: str | None,
    argv: Sequence[str],
    *,
    input_text: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (``None`` or ``"root"``: as the caller) and capture its output.

    Commands of an ordinary user run through ``runuser -u USER --`` in that user's home
    directory unless ``cwd`` says otherwise. With ``check``, a non-zero exit raises
    ``ClusterError`` carrying the command's stderr.
    """
    full = list(argv)
    if user not in (None, "root"):
        assert user is not None
        full = ["runuser", "-u", user, "--", *full]
        if cwd is None:
            cwd = pwd.getpwnam(user).pw_dir
    proc = subprocess.run(
        full,
        input=input_text,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        timeout=timeout_s,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ClusterError(
            f"{' '.join(full)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
        )
    return proc


def submit(
    script: str | os.PathLike[str],
    user: str = "sgtest1",
    args: Sequence[str] = (),
) -> str:
    """Submit a batch job as ``user`` and return its job id.

    ``script`` is either a path to a batch script (readable by ``user``) or the text of one
    (anything containing a newline, e.g. starting with ``#!/bin/bash``); ``args`` are extra
    ``sbatch`` options such as ``("--gres=gpu:2",)``.
    """
    text: str | None = None
    argv = ["sbatch", "--parsable", *args]
    if isinstance(script, str) and "\n" in script:
        text = script
    else:
        argv.append(os.fspath(script))
    out = run_as(user, argv, input_text=text).stdout.strip()
    # --parsable prints "jobid" or "jobid;cluster".
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise ClusterError(f"sbatch printed {out!r}, not a job id")
    return job_id


def squeue_state(job_id: str) -> str | None:
    """The job's state as squeue shows it (e.g. ``RUNNING``, ``COMPLETING``); ``None`` when
    slurmctld no longer knows the job. For an array job, a task that has not finished wins."""
    proc = run_as(None, ["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
    return _least_done(proc.stdout.split())


def sacct_state(job_id: str) -> str | None:
    """The job's state in accounting (first word: ``CANCELLED by 0`` -> ``CANCELLED``);
    ``None`` while slurmdbd has no record of it yet."""
    proc = run_as(None, ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False)
    return _least_done([line.split()[0] for line in proc.stdout.splitlines() if line.strip()])


def _least_done(states: Sequence[str]) -> str | None:
    """One state for a job that may have several lines (an array job's tasks): the first
    state that is not final if there is one, else the first; ``None`` for no lines."""
    for state in states:
        if state not in TERMINAL_STATES:
            return state
    return states[0] if states else None


def _controller_states(job_id: str) -> dict[str, str] | None:
    """Every job id slurmctld holds for ``job_id`` (an array's tasks each apart), with its
    state, ended ones included; ``{}`` once slurmctld has forgotten the job (MinJobAge after
    its end); ``None`` when squeue failed (slurmctld busy or restarting): unknown, which must
    never read as "the job is gone"."""
    try:
        proc = run_as(
            None, ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%i|%T"], check=False
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return {} if "Invalid job id" in proc.stderr else None
    states: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid:
            states[jid] = state
    return states


def _accounted_states(job_id: str) -> dict[str, str]:
    """Every allocation accounting holds for ``job_id``, as {JobID: first word of State}."""
    try:
        proc = run_as(
            None, ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State"], check=False
        )
    except subprocess.TimeoutExpired:
        return {}
    states: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid and state:
            states[jid] = state.split()[0]
    return states


def wait_done(job_id: str, timeout_s: float = 120.0) -> str:
    """Wait until the job has ended, its epilog has run and accounting has its final state;
    return that state (``COMPLETED``, ``FAILED``, ``TIMEOUT``, ...).

    Done means: slurmctld shows every job id of it ended (COMPLETING, the epilog still
    running, is not), and accounting holds each of those ids in a final state too. Accounting
    lags the controller, by seconds on a loaded machine, so a job whose tasks slurmdbd has
    not all heard of yet is not done. For an array job the state returned is that of the first
    task that did not complete, else ``COMPLETED``.

    Raises ``TimeoutError`` when that takes longer than ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last: tuple[object, object] = (None, None)
    while time.monotonic() < deadline:
        queued = _controller_states(job_id)
        if queued is not None and all(s in TERMINAL_STATES for s in queued.values()):
            accounted = _accounted_states(job_id)
            settled = all(s in TERMINAL_STATES for s in accounted.values()) and all(
                accounted.get(jid) in TERMINAL_STATES for jid in queued
            )
            if accounted and settled:
                done = _least_done([s for s in accounted.values() if s != "COMPLETED"])
                return done or "COMPLETED"
            last = (queued, accounted)
        else:
            last = (queued, None)
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} not done after {timeout_s} s (squeue, sacct: {last})")


def sacct_fields(job_id: str, fields: Sequence[str]) -> dict[str, str]:
    """The job's allocation line in sacct, as {field: value} for the given field names."""
    proc = run_as(
        None,
        ["sacct", "-n", "-X", "-P", "--delimiter=\x1f", "-j", job_id, "-o", ",".join(fields)],
    )
    lines = [line for line in proc.stdout.splitlines() if line]
    if not lines:
        raise ClusterError(f"sacct has no record of job {job_id}")
    return dict(zip(fields, lines[0].split("\x1f"), strict=True))


def node_name() -> str:
    """The name of the cluster's only node."""
    proc = run_as(None, ["sinfo", "-h", "-N", "-o", "%N"])
    names = proc.stdout.split()
    if not names:
        raise ClusterError("sinfo lists no node")
    return names[0]


def node_state() -> str:
    """The node's state in lower case, as sinfo's %T prints it (``idle``, ``mixed``,
    ``drained``, ``down*``, ...)."""
    proc = run_as(None, ["sinfo", "-h", "-N", "-n", node_name(), "-o", "%T"])
    return proc.stdout.split()[0]


def controller_up() -> bool:
    """Whether slurmctld answers."""
    try:
        proc = run_as(None, ["scontrol", "ping"], check=False, timeout_s=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


def ensure_cluster() -> None:
    """Make sure the cluster runs and is up to date; raise ``ClusterError`` when it cannot.

    As root, this runs the idempotent start script every time (about a second when all runs),
    so that configuration or hook changes made since the cluster started are picked up.
    Otherwise, or with ``SLURM_GPU_TC_NO_START=1`` (the cluster runs from another checkout,
    whose start script and virtualenv it must keep: set ``VENV`` to that virtualenv), it
    only checks that slurmctld answers.
    """
    if os.geteuid() == 0 and os.environ.get("SLURM_GPU_TC_NO_START") != "1":
        proc = subprocess.run(
            [str(START_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"{START_SCRIPT} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
    if not controller_up():
        raise ClusterError(f"slurmctld does not answer `scontrol ping`; run {START_SCRIPT}")


def user_dir(user: str, base: Path | None = None) -> Path:
    """A fresh directory owned by ``user``, for job scripts and output files.

    It lies under ``base`` (default ``$TC_ROOT/test-output``), which every user can traverse;
    pytest's own ``tmp_path`` is private to root, so jobs could not write there.
    """
    entry = pwd.getpwnam(user)
    base = base or tc_root() / "test-output"
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = base / f"{user}-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir(mode=0o755)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path
