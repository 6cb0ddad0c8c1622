"""The exporter's request reader: lines across reads, a byte budget, and one deadline for the
whole request whatever the pace of the bytes (a clock the test moves, a real socket pair)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from slurm_gpu.live.requestreader import DeadlineReader, RequestTimeout, RequestTooLarge


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_are_read_across_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    reader = DeadlineReader(server, 8192, 110.0, Clock())
    client.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
    assert reader.readline(65537) == b"GET /metrics HTTP/1.0\r\n"
    assert reader.readline() == b"Host: x\r\n"
    assert reader.readline() == b"\r\n"
    client.close()
    assert reader.readline() == b""
    assert reader.read() == b""


def test_a_request_over_the_budget_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    reader = DeadlineReader(server, 64, 110.0, Clock())
    client.sendall(b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * 100)
    reader.readline()
    with pytest.raises(RequestTooLarge):
        reader.readline()


def test_bytes_that_keep_coming_do_not_extend_the_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # Every read gets a byte (a per-read timeout would never trip); the clock passes the
    # deadline between two of them, and the next read is refused.
    client, server = pair
    clock = Clock()
    reader = DeadlineReader(server, 8192, 105.0, clock)
    client.sendall(b"GET /metrics HTTP/1.0\r\nX-Slow: a")

    real_fill = reader._fill

    def fill_then_age() -> None:
        real_fill()
        clock.now += 1.0
        client.send(b"a")

    reader._fill = fill_then_age  # type: ignore[method-assign]
    assert reader.readline() == b"GET /metrics HTTP/1.0\r\n"
    with pytest.raises(RequestTimeout):
        reader.readline()
    assert clock.now >= 105.0


def test_a_silent_client_times_out_at_the_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    _client, server = pair
    clock = Clock()
    reader = DeadlineReader(server, 8192, clock.now + 0.2, clock)
    with pytest.raises(RequestTimeout):
        reader.readline()  # the socket's timeout is what is left: 0.2 s
    clock.now += 1.0
    with pytest.raises(RequestTimeout):
        reader.readline()  # past the deadline: no read at all
