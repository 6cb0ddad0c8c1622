"""``slurm-gpu exporter``: serve the node's exposition over HTTP.

The server is ``prometheus_client``'s threaded WSGI server (one thread per connection),
bounded here to ``ExporterOptions.max_threads`` connections at once (beyond that a
connection gets 503 at once), with HTTP/1.0 (one request per connection) and ``GET
/metrics`` only: every other path is 404 and every other method 405.

**Who is served** is decided in the thread that accepts the connection, before a byte of
the request is read: a client whose address is one of this host's own (loopback, or any
address the node holds: ``live.localaddr``) runs on this host, so its socket's owner is
asked of the kernel (``live.peeruid``) and the connection is served only for the accounts
of ``ExporterOptions.local_uids``; anyone else gets 403 at once and never occupies a
handler thread. Remote clients are served: the listen address and the firewall decide who
reaches the exporter from elsewhere (``docs/security.md``).

**Each request has one deadline**, ``ExporterOptions.deadline_s`` from its accept, for the
whole of it: the request line and headers (at most ``MAX_REQUEST_BYTES``, 431 beyond; 408
at the deadline; ``live.requestreader``) and the writing of the answer. So a slow or
bloated client holds one handler thread for the deadline at most, never the exporter.

Each scrape reads the live summaries afresh (no cache: a job's series end at the scrape
after its summary is gone). The exposition itself is ``live.exposition``'s, written by
hand: ``prometheus_client``'s generator takes about 25 times its CPU for the same series
(``docs/performance.md``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler

from prometheus_client.exposition import ThreadingWSGIServer

from slurm_gpu.live.exposition import CONTENT_TYPE, render
from slurm_gpu.live.localaddr import is_local_address
from slurm_gpu.live.peeruid import connection_uid
from slurm_gpu.live.requestreader import DeadlineReader, RequestTimeout, RequestTooLarge
from slurm_gpu.live.snapshot import read_node

log = logging.getLogger("slurm_gpu.live.exporter")

#: Largest request accepted (request line plus headers), bytes.
MAX_REQUEST_BYTES = 8192
#: Seconds a request has, from its accept, to arrive whole and take its answer.
REQUEST_DEADLINE_S = 5.0
#: Connections handled at once (one thread each).
MAX_THREADS = 8
#: Seconds between two log lines about refused connections of the same account.
REFUSAL_LOG_INTERVAL_S = 60.0

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class ExporterOptions:
    """Where the live summaries are, how old one may be, and whom and how the server
    serves."""

    spool_dir: str
    stale_after_s: float
    """A summary whose last reading is older than this is left out, seconds."""
    local_uids: frozenset[int] | None = None
    """Accounts whose connections from this host (from any of its addresses) are served:
    root and the Prometheus account. ``None``: every local connection (tests and
    benchmarks only)."""
    deadline_s: float = REQUEST_DEADLINE_S
    """Time a request has from its accept to arrive whole and take its answer, seconds."""
    max_threads: int = MAX_THREADS
    """Connections handled at once."""


def exposition(opts: ExporterOptions, clock: Callable[[], float] = time.time) -> str:
    """The node's exposition now."""
    return render(read_node(opts.spool_dir, clock(), opts.stale_after_s))


_REASONS = {
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def answer_now(sock: socket.socket, code: int, text: str) -> None:
    """A short HTTP/1.0 answer written without waiting (a fresh connection's send buffer
    takes it whole; a client that does not take it loses it)."""
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.0 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        sock.send(head + body, socket.MSG_DONTWAIT)


def make_app(render_body: Callable[[], str]) -> WsgiApp:
    """The WSGI application: ``GET /metrics`` answers ``render_body()``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        plain = [("Content-Type", "text/plain; charset=utf-8")]
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [*plain, ("Allow", "GET")])
            return [b"Only GET is served\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", plain)
            return [b"Only /metrics is served\n"]
        try:
            data = render_body().encode()
        except Exception:  # one bad scrape must not stop the exporter
            log.exception("exposition failed")
            start_response("500 Internal Server Error", plain)
            return [b"Exposition failed\n"]
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(data)))]
        )
        return [data]

    return app


class _Handler(WSGIRequestHandler):
    """One connection: its request read within the budget and the deadline, then answered
    by the application within what is left of the deadline."""

    server: ExporterServer

    def setup(self) -> None:
        super().setup()
        self._deadline = time.monotonic() + self.server.options.deadline_s
        self.rfile = DeadlineReader(  # type: ignore[assignment]
            self.connection, MAX_REQUEST_BYTES, self._deadline
        )

    def handle(self) -> None:
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_BYTES + 1)
            if not self.raw_requestline or not self.parse_request():
                return
        except RequestTooLarge:
            answer_now(self.connection, 431, "Request too large")
            return
        except RequestTimeout:
            log.info("%s: request not whole within its deadline; closed", self.client_address[0])
            answer_now(self.connection, 408, "Request not whole within its deadline")
            return
        except OSError:
            return  # the client went away
        # The answer is written within what is left (sendall's timeout is its whole time).
        self.connection.settimeout(max(self._deadline - time.monotonic(), 0.001))
        handler = ServerHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]
            self.get_stderr(),
            self.get_environ(),
            multithread=True,
        )
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())  # type: ignore[arg-type]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class ExporterServer(ThreadingWSGIServer):
    """``prometheus_client``'s threaded WSGI server with the local peer check before any
    read and a bound on the connections handled at once."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], options: ExporterOptions) -> None:
        self.options = options
        self._slots = threading.BoundedSemaphore(options.max_threads)
        self._refusals: dict[int | None, tuple[float, int]] = {}
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own asks the resolver for the host's full name (a DNS lookup at
        # start, which can hang on a node without DNS); the address is name enough.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def _local_refusal(
        self, request: socket.socket, client_address: Any
    ) -> tuple[bool, int | None]:
        """Whether the client is refused (a local one whose socket is not an account of
        ``local_uids``, or whose owner cannot be found), and its uid (``None``: a remote
        client, or unknown)."""
        allowed = self.options.local_uids
        if allowed is None or not is_local_address(str(client_address[0])):
            return False, None
        uid = connection_uid(request)
        return uid is None or uid not in allowed, uid

    def _log_refusal(self, uid: int | None, peer: str) -> None:
        """One line per account per ``REFUSAL_LOG_INTERVAL_S`` (a user looping on the port
        cannot fill the log), with the refusals not logged since."""
        now = time.monotonic()
        last, quiet = self._refusals.get(uid, (float("-inf"), 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._refusals[uid] = (last, quiet + 1)
            return
        self._refusals[uid] = (now, 0)
        more = f" ({quiet} more since the last line)" if quiet else ""
        log.info("refused a local client of uid %s from %s%s", uid, peer, more)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        refused, uid = self._local_refusal(request, client_address)
        if not refused:
            return True
        self._log_refusal(uid, str(client_address[0]))
        answer_now(request, 403, "Served to root and the Prometheus account only")
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.info("%s: every handler thread busy; answered 503", client_address[0])
            answer_now(request, 503, "Busy")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address[0], exc_info=True)


def make_server(
    opts: ExporterOptions, address: str, port: int, body: Callable[[], str] | None = None
) -> ExporterServer:
    """Bind ``address:port`` (port 0: any free one) serving ``opts`` (or what ``body``
    returns at each scrape: the lab's test-only shapes, ``live.testshapes``). Raises
    ``OSError``."""
    server = ExporterServer((address, port), opts)
    server.set_app(make_app(body if body is not None else lambda: exposition(opts)))
    return server
