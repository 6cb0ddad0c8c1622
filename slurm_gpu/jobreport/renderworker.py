"""The report worker: a second process that renders stored jobs' ``gpueff`` reports for the
collector (``renderpool`` starts it and talks to it).

It renders exactly as the collector's own report step does (``storedreports``, the same code
with the same settings), writes the owners' report files itself
(``reportwriter``, which opens every name relative to a directory descriptor and follows no
symlink) and hands the rendered reports back for the collector to store: the collector stays
the store's only writer.

The channel is the worker's standard input and output, nothing else:

- in: pickles from the collector (its own code, run by the same account): first the
  ``Settings`` the collector loaded (the worker reads no configuration file and no
  environment), then one ``(unit, jobs)`` per unit of stored jobs; end of input ends the
  worker;
- out: one JSON object per line: ``{"unit": n, "reports": [...]}`` once a unit's reports are
  rendered and its files written, ``{"log": level, "name": logger, "msg": text}`` for each of
  its log records.

Anything it prints by mistake goes to standard error, never into the channel.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import sys
import threading
from typing import IO, Any

#: The command the collector runs (``python -I -c BOOT <directory of slurm_gpu>``): ``-I``
#: ignores the environment's ``PYTHON*`` variables and the user's site directory, so the code
#: run is the collector's own, found under the directory it hands over.
BOOT = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1]) if sys.argv[1] not in sys.path else None\n"
    "from slurm_gpu.jobreport.renderworker import main\n"
    "sys.exit(main())\n"
)


class _Channel:
    """The worker's output: one JSON object per line, written whole under a lock (log records
    may come from any thread)."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message).encode() + b"\n"
        with self._lock:
            self._out.write(line)
            self._out.flush()


class _ToChannel(logging.Handler):
    """Log records to the collector, which logs them as its own."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__(logging.INFO)
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            self._channel.send({"log": record.levelno, "name": record.name, "msg": msg})
        except Exception:  # the channel is gone: the collector notices the end of input
            self.handleError(record)


def serve(stdin: IO[bytes], channel: _Channel) -> int:
    """Render the units read from ``stdin`` until its end; returns the exit status."""
    from slurm_gpu.config import Settings
    from slurm_gpu.gcpace import fewer_collections
    from slurm_gpu.jobreport.storedreports import StoredReportRenderer

    settings = pickle.load(stdin)
    if not isinstance(settings, Settings):
        raise TypeError(f"expected Settings first, got {type(settings).__name__}")
    renderer = StoredReportRenderer(settings, store=None)
    # Paced as the collector's pass is (``gcpace``): each unit reads its jobs' timelines.
    with fewer_collections():
        while True:
            try:
                unit, jobs = pickle.load(stdin)
            except EOFError:
                return 0
            try:
                reports, files = renderer.render(jobs)
                renderer.files.write(files)
            except Exception:  # as in the collector's process: logged, gpueff renders them
                logging.getLogger("slurm_gpu.prerender").exception(
                    "rendering gpueff reports failed; gpueff will render them itself"
                )
                reports = []
            channel.send({"unit": unit, "reports": [dataclasses.asdict(r) for r in reports]})


def main() -> int:
    """The worker's entry point (``BOOT``)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdin = None
    sys.stdout = sys.stderr  # a stray print must not corrupt the channel
    channel = _Channel(stdout)
    root = logging.getLogger()
    root.handlers[:] = [_ToChannel(channel)]
    root.setLevel(logging.INFO)
    return serve(stdin, channel)
