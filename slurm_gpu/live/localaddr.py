"""Whether an address is one of this host's own: a client connecting from it runs here.

A TCP client on this host may connect to any of the host's addresses, not only loopback: a
user who connects to the node's scrape-network address from a shell on the node arrives
from that same address (or from any other address the node holds, if the client binds one).
The exporter therefore asks, for every connection, whether the peer's address is local, and
identifies every local client by its socket's owner (``live.peeruid``).

The kernel answers with the same lookup it uses to deliver packets: a route lookup for the
address (netlink ``RTM_GETROUTE``) is of type ``RTN_LOCAL`` exactly when the address is one
the host holds (127.0.0.0/8, ::1, every interface's addresses, secondary ones included), at
the moment of the connection. Where netlink cannot be used, the kernel's own tables in
``/proc`` (``net/fib_trie``'s local host routes, ``net/if_inet6``) say the same; and where
neither can be read the address counts as local, so that an unknown client is identified
(and refused when it cannot be) rather than served.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

_RTM_GETROUTE = 26
_RTM_NEWROUTE = 24
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_RTA_DST = 1
_RTN_LOCAL = 2
#: ``rtm_type`` is the eighth byte of ``struct rtmsg``, after the 16-byte ``nlmsghdr``.
_RTM_TYPE_OFFSET = 16 + 7
#: Most of a ``/proc`` table read, bytes.
MAX_TABLE_BYTES = 4 * 1024 * 1024

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def plain_address(ip: str) -> Address:
    """``ip`` without a zone (``%eth0``), an IPv4-mapped IPv6 address (``::ffff:10.0.0.5``,
    a v4 client of a dual-stack listener) as IPv4. Raises ``ValueError``."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def route_is_local(addr: Address) -> bool:
    """Whether the kernel routes ``addr`` to this host (``RTN_LOCAL``). Raises ``OSError``
    when netlink cannot be used; a route lookup the kernel refuses (no route: an address
    the host cannot even reach) is not local."""
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    packed = addr.packed
    body = struct.pack("=BBBBBBBBI", family, len(packed) * 8, 0, 0, 0, 0, 0, 0, 0)
    body += struct.pack("=HH", 4 + len(packed), _RTA_DST) + packed
    msg = struct.pack("=IHHII", 16 + len(body), _RTM_GETROUTE, _NLM_F_REQUEST, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE) as nl:
        nl.settimeout(1.0)
        nl.sendto(msg, (0, 0))
        data = nl.recv(65536)
    if len(data) < 20:
        raise OSError("short netlink answer")
    _length, kind = struct.unpack_from("=IH", data)
    if kind == _NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, 16)
        if -err in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return False
        raise OSError(-err, "the route lookup was refused")
    if kind != _RTM_NEWROUTE or len(data) <= _RTM_TYPE_OFFSET:
        raise OSError("unexpected netlink answer")
    return data[_RTM_TYPE_OFFSET] == _RTN_LOCAL


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read(MAX_TABLE_BYTES).decode("ascii", "replace")


def proc_local_addresses(proc_net: str = "/proc/net") -> frozenset[Address]:
    """This host's addresses from ``/proc``: the IPv4 host routes of type ``LOCAL`` in
    ``fib_trie`` and every line of ``if_inet6``. Raises ``OSError`` when neither can be
    read."""
    found: set[Address] = set()
    readable = False
    try:
        last: str | None = None
        for line in _read(f"{proc_net}/fib_trie").splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "|--":
                last = words[1]
            elif last is not None and words[:1] == ["/32"] and words[-1:] == ["LOCAL"]:
                found.add(ipaddress.IPv4Address(last))
        readable = True
    except (OSError, ValueError):
        pass
    try:
        for line in _read(f"{proc_net}/if_inet6").splitlines():
            words = line.split()
            if words and len(words[0]) == 32:
                found.add(ipaddress.IPv6Address(int(words[0], 16)))
        readable = True
    except (OSError, ValueError):
        pass
    if not readable:
        raise OSError("neither /proc/net/fib_trie nor /proc/net/if_inet6 can be read")
    return frozenset(found)


def is_local_address(ip: str) -> bool:
    """Whether ``ip`` is one of this host's addresses (loopback included). An address
    that cannot be parsed, or a host whose tables cannot be read, counts as local: the
    caller then identifies the client and refuses it when it cannot."""
    try:
        addr = plain_address(ip)
    except ValueError:
        return True
    if addr.is_loopback or addr.is_unspecified:
        return True
    try:
        return route_is_local(addr)
    except (OSError, struct.error):
        pass
    try:
        return addr in proc_local_addresses()
    except OSError:
        return True
