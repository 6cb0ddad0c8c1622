"""Per-job work on the controller is coalesced (issue class 7).

EpilogSlurmctld runs once per ended job. It used to start a root collector per job that waited
up to 300 s, so a job array of trivial tasks put hundreds of waiting processes on the
controller. The real ``share/slurm/epilog-slurmctld.sh`` is run here 200 times, all at once,
with ``SLURM_GPU_BIN`` pointing at a small stand-in for ``slurm-gpu`` that drains the queue as
the real ``collect --queue`` does and records any moment at which two of it were alive.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "share" / "slurm" / "epilog-slurmctld.sh"
JOBS = 200

# The stand-in: refuses to be two (mkdir is atomic), drains decimal names from the queue
# until it is empty, and lingers a little so that overlapping starts would be caught.
FAKE = """#!/bin/sh
d=$FAKE_STATE
if ! mkdir "$d/running" 2>/dev/null; then
    echo "$$ $*" >>"$d/overlap"
    exit 0
fi
echo "$*" >>"$d/argv"
while :; do
    took=0
    for f in "$SLURM_GPU_QUEUE_DIR"/[0-9]*; do
        [ -f "$f" ] || continue
        rm -f "$f" && echo "${f##*/}" >>"$d/handled" && took=1
    done
    [ "$took" -eq 1 ] || break
    sleep 0.02
done
sleep 0.05
rmdir "$d/running"
"""


def _quiet(queue: Path, state: Path, deadline_s: float) -> None:
    """Wait (bounded) until no drainer holds the lock and nothing is queued."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        idle = (
            subprocess.run(
                ["flock", "-n", str(queue / ".drain.lock"), "true"], check=False
            ).returncode
            == 0
        )
        if idle and not (state / "running").exists() and not _queued(queue):
            return
        time.sleep(0.1)


def _queued(queue: Path) -> list[str]:
    return sorted(p.name for p in queue.iterdir() if p.name.isdigit())


def test_a_burst_of_job_ends_leaves_at_most_one_collector(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir(mode=0o700)
    state = tmp_path / "fake"
    state.mkdir()
    fake = tmp_path / "slurm-gpu"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_GPU_BIN": str(fake),
        "SLURM_GPU_CONFIG": str(tmp_path / "config.toml"),
        "SLURM_GPU_QUEUE_DIR": str(queue),
        "SLURM_GPU_COLLECT_LOG": str(tmp_path / "collect.log"),
        "FAKE_STATE": str(state),
    }
    ids = [str(7000 + i) for i in range(JOBS)]

    procs = [
        subprocess.Popen(["/bin/sh", str(SCRIPT)], env={**env, "SLURM_JOB_ID": jid}) for jid in ids
    ]
    codes = [p.wait() for p in procs]
    _quiet(queue, state, deadline_s=60)

    assert codes == [0] * JOBS  # EpilogSlurmctld never fails a job
    assert not (state / "overlap").exists(), (state / "overlap").read_text()
    handled = (state / "handled").read_text().split()
    assert sorted(handled) == sorted(ids)  # every job once, none lost
    assert _queued(queue) == []
    argv = (state / "argv").read_text().splitlines()
    assert 1 <= len(argv) < JOBS
    assert all(a.endswith("collect --queue") for a in argv), argv
