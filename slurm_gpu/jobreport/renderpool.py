"""The collector's side of the report worker (``renderworker``): hands units of stored jobs to
a second process and takes their rendered reports back for the store.

Why a process: the report step costs about as much CPU per job as storing the job (2.8 against
4.4 ms for a 4-GPU job, ``docs/performance.md``), and rendering is Python code that holds the
interpreter lock, so a thread would not overlap it. With a second process the worker renders the
reports of batch k while the collector stores batch k+1, each on one core.

Units: each batch handed over is cut into units of ``UNIT_JOBS`` jobs. The worker has one unit
at a time (the next one is sent when its reports come back); the others wait here, so that at
the end of the pass the collector renders the waiting units itself while the worker renders its
own (``finish``), instead of waiting for the worker to render the whole last batch alone.

Failures: a worker that cannot be started, or that ends before it is told to (a crash, a
kill), is logged; the units it had and those still waiting are rendered in the collector's
process, so nothing handed over is lost without a log line. The worker's own errors (a job that
cannot be rendered) come back as log records and are logged by the collector.

Isolation: the worker runs ``python -I`` (no ``PYTHON*`` variable, no user site directory) in
``/``, with an environment made here (``environment``), and is handed the collector's already
loaded ``Settings``: it reads no configuration of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from slurm_gpu.config import Settings
from slurm_gpu.jobreport.renderworker import BOOT
from slurm_gpu.records import JobRecord
from slurm_gpu.store.rows import CachedReport

log = logging.getLogger("slurm_gpu.prerender")

#: Jobs per unit handed to the worker: large enough that a unit's fixed costs (a read of the
#: store, one ``syncfs``, the hand-over) are a few per cent of it, small enough that the
#: collector's wait for the worker's last unit at the end of a pass is short (about 0.1 s of
#: 4-GPU jobs).
UNIT_JOBS = 32


def worker_command() -> list[str]:
    """The worker's command: this interpreter, isolated, running this installation's code (the
    directory ``slurm_gpu`` was imported from, which ``-I`` would not find otherwise when it
    came from a source tree)."""
    import slurm_gpu

    root = os.path.dirname(os.path.dirname(os.path.abspath(slurm_gpu.__file__ or "")))
    return [sys.executable, "-I", "-c", BOOT, root]


def environment(parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker's whole environment: a fixed ``PATH`` and locale, and the collector's ``TZ``
    when it has one (the reports' times would differ from the collector's otherwise). Nothing
    else of the collector's environment is passed on."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    tz = (os.environ if parent is None else parent).get("TZ")
    if tz is not None:
        env["TZ"] = tz
    return env


class RenderPool:
    """One report worker at a time, started by the first ``submit`` and stopped by ``finish``.

    Used by one thread (the collector's); two threads of its own talk to the worker. ``command``
    replaces the worker's command in tests."""

    def __init__(
        self,
        settings: Settings,
        *,
        command: Sequence[str] | None = None,
        unit_jobs: int = UNIT_JOBS,
    ) -> None:
        self._settings = settings
        self._command = list(command) if command is not None else None
        self._unit_jobs = max(1, unit_jobs)
        self._cond = threading.Condition()
        self._waiting: deque[tuple[int, list[JobRecord]]] = deque()
        self._sent: dict[int, list[JobRecord]] = {}
        self._done: list[CachedReport] = []
        self._units = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._failed = False
        self._stopping = False

    @property
    def running(self) -> bool:
        """Whether a worker was started in this pass and has not failed."""
        with self._cond:
            return self._proc is not None and not self._failed

    def submit(self, jobs: Sequence[JobRecord]) -> bool:
        """Hand these stored jobs' reports to the worker (started now if needed); ``False``
        when there is no worker (it could not start or has ended): render them here."""
        with self._cond:
            if self._failed:
                return False  # no second start in a pass whose worker failed
        if self._proc is None and not self._start():
            return False
        with self._cond:
            if self._failed:
                return False
            for i in range(0, len(jobs), self._unit_jobs):
                self._waiting.append((self._units, list(jobs[i : i + self._unit_jobs])))
                self._units += 1
            self._cond.notify_all()
        return True

    def take_done(self) -> list[CachedReport]:
        """The reports the worker has rendered since the last call (their files are written),
        for the caller to store."""
        with self._cond:
            done, self._done = self._done, []
        return done

    def finish(self, render_here: Callable[[list[JobRecord]], None]) -> None:
        """Render the waiting units with ``render_here`` (from the last one back) while the
        worker renders its own, wait for the worker's, then stop it. After a failure of the
        worker, the units it had go to ``render_here`` too. Reports the worker rendered stay
        for ``take_done``."""
        if self._proc is None:
            with self._cond:
                self._failed = False  # a worker that did not start: try again next pass
            return
        while (jobs := self._take_one()) is not None:
            render_here(jobs)
        with self._cond:
            while self._sent and not self._failed:
                self._cond.wait()
        while (jobs := self._take_one()) is not None:  # the units of a worker that ended
            render_here(jobs)
        self._stop()

    # ------------------------------------------------------------------ internals

    def _take_one(self) -> list[JobRecord] | None:
        with self._cond:
            if self._waiting:
                return self._waiting.pop()[1]
            if self._failed and self._sent:
                return self._sent.pop(min(self._sent))
            return None

    def _start(self) -> bool:
        command = self._command if self._command is not None else worker_command()
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd="/",
                env=environment(),
                close_fds=True,
            )
        except OSError as exc:
            log.error("report worker not started (%s); reports are rendered by the collector", exc)
            with self._cond:
                self._proc, self._failed = None, True
            return False
        assert proc.stdin is not None and proc.stdout is not None
        with self._cond:
            self._proc, self._failed, self._stopping = proc, False, False
        # Daemon threads: a caller that never calls ``finish`` (a bug) must not keep the
        # collector from exiting; its end closes the worker's input, which ends the worker.
        self._threads = [
            threading.Thread(
                target=self._send, args=(proc.stdin,), name="report-worker-in", daemon=True
            ),
            threading.Thread(
                target=self._receive, args=(proc,), name="report-worker-out", daemon=True
            ),
        ]
        for t in self._threads:
            t.start()
        return True

    def _send(self, stdin: IO[bytes]) -> None:
        """The settings, then one unit at a time, each when the worker has returned the one
        before (the others stay here for ``finish``)."""
        try:
            pickle.dump(self._settings, stdin, protocol=pickle.HIGHEST_PROTOCOL)
            stdin.flush()
            while True:
                with self._cond:
                    while not (
                        self._stopping or self._failed or (self._waiting and not self._sent)
                    ):
                        self._cond.wait()
                    if self._stopping or self._failed:
                        return
                    unit, jobs = self._waiting.popleft()
                    self._sent[unit] = jobs
                    self._cond.notify_all()
                pickle.dump((unit, jobs), stdin, protocol=pickle.HIGHEST_PROTOCOL)
                stdin.flush()
        except (OSError, ValueError) as exc:  # a broken pipe: the worker has ended
            self._fail(f"cannot write to it ({exc})")
        finally:
            with contextlib.suppress(OSError):
                stdin.close()  # end of input: the worker ends

    def _receive(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                message = json.loads(line)
                if "log" in message:
                    logging.getLogger(str(message.get("name") or log.name)).log(
                        int(message["log"]), "report worker: %s", message.get("msg")
                    )
                    continue
                unit = int(message["unit"])
                reports = [CachedReport(**r) for r in message["reports"]]
            except (ValueError, TypeError, KeyError) as exc:
                log.error("report worker: message not understood (%s)", exc)
                continue
            with self._cond:
                self._sent.pop(unit, None)
                self._done.extend(reports)
                self._cond.notify_all()
        status = proc.wait()
        with self._cond:
            expected = self._stopping and not self._sent
        if not expected:
            self._fail(f"it ended with exit status {status}")
        elif status != 0:
            log.error("report worker ended with exit status %s", status)

    def _fail(self, why: str) -> None:
        with self._cond:
            if self._failed:
                return
            self._failed = True
            units = len(self._sent) + len(self._waiting)
            self._cond.notify_all()
        log.error(
            "report worker failed: %s; the collector renders its %d unit(s) of reports itself",
            why,
            units,
        )

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        with self._cond:
            self._proc, self._threads, self._failed = None, [], False
            self._sent.clear()
