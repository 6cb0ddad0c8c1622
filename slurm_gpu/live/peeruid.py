"""Who owns the other end of a local TCP connection, as the kernel's socket tables say.

TCP has no ``SO_PEERCRED``. For a connection from this same host, the kernel knows the
client's socket by its local address and port and its remote address and port (ours), and
the uid of the account that created it; it tells that through its socket diagnostics
(netlink ``SOCK_DIAG_BY_FAMILY``, an exact lookup) and the ``/proc/net/tcp`` (``tcp6``)
table. The kernel writes both, so a client cannot choose what they say. The exporter uses
it to serve local clients (any connection whose peer address is one of this host's,
``live.localaddr``, loopback or not) to root and the Prometheus account only
(``docs/security.md``). A remote client has no entry here: the network's binding and
firewall decide who reaches the exporter from elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from slurm_gpu.live.localaddr import plain_address

#: The kernel's TCP socket tables, by address family.
TABLES = {4: "/proc/net/tcp", 6: "/proc/net/tcp6"}
#: Most of a table read, bytes (a line is 150 bytes: about 100,000 sockets).
MAX_TABLE_BYTES = 16 * 1024 * 1024


# An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as IPv4: a client that connected to
# a dual-stack listener with IPv4 sits in the IPv4 table.
_plain = plain_address


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
    try:
        return _plain(ip).is_loopback
    except ValueError:
        return False


def _hex(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """``ADDR:PORT`` as the tables print it: each 32-bit word of the address in host byte
    order, in upper-case hex, then the port."""
    packed = addr.packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def peer_uid(peer: tuple[str, int], local: tuple[str, int], *, proc_net: str = "") -> int | None:
    """The uid owning the client socket of the connection ``peer`` -> ``local`` (both
    ``(ip, port)`` as ``getpeername``/``getsockname`` give them), or ``None`` when the
    table has no such socket (a remote client, or the client already closed)."""
    p_addr, l_addr = _plain(peer[0]), _plain(local[0])
    family = 4 if isinstance(p_addr, ipaddress.IPv4Address) else 6
    if (4 if isinstance(l_addr, ipaddress.IPv4Address) else 6) != family:
        return None
    want_local, want_remote = _hex(p_addr, peer[1]), _hex(l_addr, local[1])
    path = TABLES[family] if not proc_net else f"{proc_net}/tcp{'' if family == 4 else '6'}"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TABLE_BYTES)
    except OSError:
        return None
    for line in data.decode("ascii", "replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[1] == want_local and fields[2] == want_remote:
            try:
                return int(fields[7])
            except ValueError:
                return None
    return None


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
#: ``inet_diag_msg``: family, state, timer, retrans (4 x u8), ``inet_diag_sockid`` (48 bytes),
#: expires, rqueue, wqueue, uid, inode (5 x u32): the uid is at byte 64.
_UID_OFFSET = 4 + 48 + 12


def diag_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The same answer as ``peer_uid``, from the kernel's socket diagnostics over netlink
    (``SOCK_DIAG_BY_FAMILY``, one exact lookup of the client socket by its four-tuple): about
    a hundred times cheaper than reading ``/proc/net/tcp`` on a host with many sockets.
    ``None`` when the kernel has no such socket; raises ``OSError`` when netlink cannot be
    used (the caller then reads the table)."""
    p_addr, l_addr = _plain(peer[0]), _plain(local[0])
    if type(p_addr) is not type(l_addr):
        return None
    family = socket.AF_INET if isinstance(p_addr, ipaddress.IPv4Address) else socket.AF_INET6
    sockid = struct.pack(
        "!HH16s16s",
        peer[1],
        local[1],
        p_addr.packed.ljust(16, b"\0"),
        l_addr.packed.ljust(16, b"\0"),
    ) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)  # any interface, no cookie
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    msg = struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(msg, (0, 0))
        data = nl.recv(8192)
    if len(data) < 16:
        raise OSError("short netlink answer")
    _length, kind = struct.unpack_from("=IH", data)
    if kind == _NLMSG_ERROR:
        (errno,) = struct.unpack_from("=i", data, 16)
        if errno == 0 or -errno == 2:  # ENOENT: no such socket
            return None
        raise OSError(-errno, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(data) < 16 + _UID_OFFSET + 4:
        raise OSError("unexpected netlink answer")
    (uid,) = struct.unpack_from("=I", data, 16 + _UID_OFFSET)
    return int(uid)


def connection_uid(conn: socket.socket) -> int | None:
    """The uid owning the client socket of an accepted local connection (netlink's socket
    diagnostics, else the ``/proc`` table); ``None`` when it cannot be told."""
    try:
        peer = conn.getpeername()
        local = conn.getsockname()
    except OSError:
        return None
    ends = ((peer[0], peer[1]), (local[0], local[1]))
    try:
        return diag_uid(*ends)
    except (OSError, ValueError, struct.error):
        return peer_uid(*ends)
