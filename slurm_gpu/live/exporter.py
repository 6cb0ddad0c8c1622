"""``slurm-gpu exporter``: serve the node's exposition over HTTP, or write it for
node_exporter's textfile collector.

One thread, one request per connection (HTTP/1.0), ``GET /metrics`` only: every other path is
404 and every other method 405. A request may be at most ``MAX_REQUEST_BYTES`` (request line
and headers together) and must arrive within ``REQUEST_TIMEOUT_S``; anything larger gets 431
and the connection closed, so one slow or bloated client cannot hold the exporter or its
memory. Each scrape reads the live summaries afresh (no cache: a job's series end at the
scrape after its summary is gone).
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import socketserver
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_gpu.live.exposition import CONTENT_TYPE, render
from slurm_gpu.live.peeruid import connection_uid, is_loopback
from slurm_gpu.live.snapshot import read_node

log = logging.getLogger("slurm_gpu.live.exporter")

#: Largest request accepted (request line plus headers), bytes.
MAX_REQUEST_BYTES = 8192
#: Seconds a client has to send its request and take the answer.
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ExporterOptions:
    """Where the live summaries are and how old one may be."""

    spool_dir: str
    stale_after_s: float
    """A summary whose last reading is older than this is left out, seconds."""
    loopback_uids: frozenset[int] | None = None
    """Accounts whose connections from this host (loopback) are served: root and the
    Prometheus account. ``None``: every local connection (tests and benchmarks only)."""


def exposition(opts: ExporterOptions, clock: Callable[[], float] = time.time) -> str:
    """The node's exposition now."""
    return render(read_node(opts.spool_dir, clock(), opts.stale_after_s))


class RequestTooLarge(Exception):
    """The client sent more than ``MAX_REQUEST_BYTES`` before the end of its headers."""


class _BoundedReader:
    """``rfile`` that raises ``RequestTooLarge`` once more than ``limit`` bytes were read."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readline(self, size: int = -1) -> bytes:
        want = self._left + 1 if size < 0 else min(size, self._left + 1)
        line: bytes = self._raw.readline(want)
        self._left -= len(line)
        if self._left < 0:
            raise RequestTooLarge
        return line

    def read(self, size: int = -1) -> bytes:
        return b""  # a GET has no body; nothing more is read

    def close(self) -> None:
        self._raw.close()


def make_handler(opts: ExporterOptions) -> type[http.server.BaseHTTPRequestHandler]:
    """The request handler class serving ``opts``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        server_version = "slurm-gpu-exporter"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S

        def setup(self) -> None:
            super().setup()
            self.rfile = _BoundedReader(self.rfile, MAX_REQUEST_BYTES)  # type: ignore[assignment]

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except RequestTooLarge:
                self.close_connection = True
                self.requestline, self.request_version = "", "HTTP/1.0"
                self.command = ""
                self.send_error(431, "Request too large")

        def _local_peer_refused(self) -> bool:
            """A loopback client of an account not in ``loopback_uids``: any local user can
            reach a loopback port, and the exposition names every job of the node."""
            if opts.loopback_uids is None or not is_loopback(str(self.client_address[0])):
                return False
            uid = connection_uid(self.connection)
            if uid is not None and uid in opts.loopback_uids:
                return False
            log.info("refused a local client of uid %s", uid)
            return True

        def do_GET(self) -> None:
            if self._local_peer_refused():
                self.send_error(403, "Served to root and the Prometheus account only")
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "Only /metrics is served")
                return
            try:
                body = exposition(opts).encode()
            except Exception:  # one bad scrape must not stop the exporter
                log.exception("exposition failed")
                self.send_error(500, "Exposition failed")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _not_allowed(self) -> None:
            self.send_error(405, "Only GET is served")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


class ExporterServer(socketserver.TCPServer):
    """A single-threaded HTTP server (requests are served one after the other)."""

    allow_reuse_address = True


def make_server(opts: ExporterOptions, address: str, port: int) -> ExporterServer:
    """Bind ``address:port`` (port 0: any free one). Raises ``OSError``."""
    return ExporterServer((address, port), make_handler(opts))


def write_textfile(opts: ExporterOptions, path: str) -> None:
    """Write the exposition to ``path`` atomically (a temporary file in the same directory,
    then a rename), mode 0644, for node_exporter's textfile collector. Raises ``OSError``."""
    data = exposition(opts).encode()
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".slurm-gpu-", suffix=".prom.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
