"""A request reader with a size budget and one deadline for the whole request.

A socket timeout bounds each read, not the request: a client sending one byte every few
seconds never trips it, and 8 KiB of headers at that pace hold a connection for hours. This
reader takes the request line and headers from the socket itself, giving every ``recv`` only
the time left until the request's deadline, and counts the bytes against a budget; it is the
``rfile`` the HTTP handler parses from.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

#: Bytes asked of the kernel per ``recv``.
CHUNK_BYTES = 4096


class RequestTooLarge(Exception):
    """The client sent more than the budget before the end of its headers."""


class RequestTimeout(Exception):
    """The request did not arrive whole before its deadline."""


class DeadlineReader:
    """``readline`` over ``sock`` within ``limit`` bytes and before ``deadline``
    (a ``clock()`` value, seconds)."""

    def __init__(
        self,
        sock: socket.socket,
        limit: int,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sock = sock
        self._left = limit
        self._deadline = deadline
        self._clock = clock
        self._buf = bytearray()
        self._eof = False

    def _fill(self) -> None:
        """One more ``recv``, within the time left; ``RequestTimeout`` when none is."""
        left = self._deadline - self._clock()
        if left <= 0:
            raise RequestTimeout
        self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(CHUNK_BYTES)
        except TimeoutError:
            raise RequestTimeout from None
        if chunk:
            self._buf += chunk
        else:
            self._eof = True

    def readline(self, size: int = -1) -> bytes:
        """One line (through ``\\n``), at most ``size`` bytes; what is left at the end of
        the stream. Raises ``RequestTooLarge`` once the lines read pass the budget and
        ``RequestTimeout`` at the deadline."""
        while True:
            end = self._buf.find(b"\n") + 1
            if end or self._eof:
                break
            if 0 <= size <= len(self._buf) or len(self._buf) > self._left:
                end = len(self._buf)
                break
            self._fill()
        n = end or len(self._buf)
        if size >= 0:
            n = min(n, size)
        line = bytes(self._buf[:n])
        del self._buf[:n]
        self._left -= len(line)
        if self._left < 0:
            raise RequestTooLarge
        return line

    def read(self, size: int = -1) -> bytes:
        """Nothing: a GET has no body, and nothing beyond the headers is read."""
        return b""

    def close(self) -> None:
        """Nothing to release: the socket is the server's."""
