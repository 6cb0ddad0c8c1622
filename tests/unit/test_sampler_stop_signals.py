"""The sampler's wait: only SIGTERM, SIGINT or SIGHUP stop it, never a stop and a continue.

Seen on the test cluster: a sampler stopped with SIGSTOP for longer than its wait and then
continued (a suspended job's processes, a debugger, gang scheduling) sealed its record at
once and exited, though its job ran on: the rest of the job went unrecorded and the epilog
found the record "already sealed". CPython's ``signal.sigtimedwait``, interrupted (EINTR, by
the SIGCONT) after its deadline has passed, returns an uninitialised siginfo rather than
``None``, which the wait took for a stop request. Real processes and real signals here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: A process that waits as the sampler does and prints "stop" when its wait says so.
_PROGRAM = """
import sys
from slurm_gpu.capture.sampler import _signal_waiter
wait = _signal_waiter()
print("ready", flush=True)
while not wait(0.2):
    pass
print("stop", flush=True)
"""


def _waiter() -> subprocess.Popen[str]:
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(repo),
        start_new_session=True,  # as the sampler: a session of its own
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_stop_and_continue_past_the_wait_is_not_a_stop_request() -> None:
    proc = _waiter()
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(1.0)  # five times the wait's timeout
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(1.0)  # several waits after the continue
        assert proc.poll() is None, "the wait took SIGCONT for a stop request"
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert out == "stop\n" and proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_each_stop_signal_still_stops_it() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        proc = _waiter()
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=10)
        assert out == "stop\n" and proc.returncode == 0, sig
