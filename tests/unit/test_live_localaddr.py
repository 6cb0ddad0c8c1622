"""Whether an address is one of this host's own (``live.localaddr``): the kernel's route
lookup on this host's real addresses, the ``/proc`` tables where netlink is not allowed, and
an unknown answer counted as local."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from slurm_gpu.live import localaddr
from slurm_gpu.live.localaddr import is_local_address, proc_local_addresses, route_is_local

#: Documentation ranges (RFC 5737, RFC 3849): never a host's own address.
NOT_OURS_V4 = "198.51.100.7"
NOT_OURS_V6 = "2001:db8::7"


def own_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("this host has no address but loopback")
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this host has no address but loopback")
    return address


def test_loopback_and_the_hosts_own_address_are_local_others_are_not() -> None:
    own = own_address()
    assert is_local_address("127.0.0.1") and is_local_address("127.0.0.2")
    assert is_local_address("::1") and is_local_address(f"::ffff:{own}")
    assert is_local_address(own)
    assert not is_local_address(NOT_OURS_V4) and not is_local_address(NOT_OURS_V6)


def test_the_kernels_route_lookup_says_local_for_the_hosts_address() -> None:
    own = ipaddress.ip_address(own_address())
    assert route_is_local(own)
    assert not route_is_local(ipaddress.ip_address(NOT_OURS_V4))


def test_the_proc_tables_of_this_host_hold_its_address() -> None:
    assert ipaddress.ip_address(own_address()) in proc_local_addresses()


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     |-- 10.1.0.0
        /24 link UNICAST
     |-- 10.1.0.5
        /32 host LOCAL
     |-- 10.1.0.255
        /32 link BROADCAST
     |-- 172.16.0.9
        /32 host LOCAL
"""
IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "fd000000000000000000000000000002 02 40 00 80     eth0\n"
)


def test_the_proc_tables_are_read_as_the_kernel_writes_them(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text(IF_INET6)
    found = {str(a) for a in proc_local_addresses(str(tmp_path))}
    assert found == {"10.1.0.5", "172.16.0.9", "::1", "fd00::2"}
    with pytest.raises(OSError):
        proc_local_addresses(str(tmp_path / "missing"))


def _no_netlink(_addr: object) -> bool:
    raise OSError("netlink not allowed")


def test_without_netlink_the_proc_tables_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    own = own_address()
    monkeypatch.setattr(localaddr, "route_is_local", _no_netlink)
    assert is_local_address(own)
    assert not is_local_address(NOT_OURS_V4)


def test_an_address_nothing_can_place_counts_as_local(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither netlink nor /proc: the client is then identified (and refused if it cannot
    # be), never served unchecked.
    def no_proc(_proc_net: str = "") -> frozenset[ipaddress.IPv4Address]:
        raise OSError("no /proc")

    monkeypatch.setattr(localaddr, "route_is_local", _no_netlink)
    monkeypatch.setattr(localaddr, "proc_local_addresses", no_proc)
    assert is_local_address(NOT_OURS_V4)
    assert is_local_address("not an address")
