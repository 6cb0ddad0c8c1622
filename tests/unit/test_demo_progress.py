"""The demo's long wait says how far it is: jobs done of the total and the time elapsed."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from slurm_gpu.demo.submit import wait_for


def test_waiting_prints_jobs_done_and_elapsed_time() -> None:
    queued = [["1", "2", "3"], ["1", "2", "3"], ["2", "3"], ["3"], ["3"], []]
    now = [0.0]

    def squeue(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        listed = queued.pop(0) if queued else []
        return subprocess.CompletedProcess(list(argv), 0, "\n".join(listed), "")

    def sleep(s: float) -> None:
        now[0] += s

    lines: list[str] = []
    left = wait_for(
        ["1", "2", "3"],
        timeout_s=600,
        poll_s=10,
        runner=squeue,
        sleep=sleep,
        clock=lambda: now[0],
        progress=lines.append,
    )
    assert left == set()
    # One line each time a job ends (and at least every progress interval while none does).
    assert lines == [
        "  0 of 3 jobs done, 0 s",
        "  1 of 3 jobs done, 20 s",
        "  2 of 3 jobs done, 30 s",
        "  3 of 3 jobs done, 50 s",
    ]


def test_a_long_stretch_without_an_ending_job_still_says_so() -> None:
    now = [0.0]

    def squeue(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 0, "1" if now[0] < 100 else "", "")

    def sleep(s: float) -> None:
        now[0] += s

    lines: list[str] = []
    wait_for(
        ["1"],
        timeout_s=600,
        poll_s=10,
        runner=squeue,
        sleep=sleep,
        clock=lambda: now[0],
        progress=lines.append,
    )
    assert lines == [
        "  0 of 1 jobs done, 0 s",
        "  0 of 1 jobs done, 30 s",
        "  0 of 1 jobs done, 60 s",
        "  0 of 1 jobs done, 90 s",
        "  1 of 1 jobs done, 100 s",
    ]
