"""Can others reach this node? A pure decision on its addresses, and a plain-words hint.

:func:`reachability_advice` looks only at its inputs (the multiaddrs the node
sees itself on, the announced ones, client mode, the listen host), so it is
unit-tested without a network.
"""

from __future__ import annotations

import ipaddress
import re
import socket

_IP4_TCP = re.compile(r"/ip4/([0-9.]+)/tcp/(\d+)")


def address_scope(ip: str) -> str:
    """``loopback``, ``private`` (LAN, CGNAT, link-local) or ``public``.

    >>> [address_scope(a) for a in ("127.0.0.1", "192.168.1.5", "100.64.0.1", "203.0.114.7")]
    ['loopback', 'private', 'private', 'public']
    """
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback:
        return "loopback"
    if addr.is_private or addr.is_link_local or addr in ipaddress.ip_network("100.64.0.0/10"):
        return "private"
    return "public"


def reachability_advice(visible: list[str], announce: list[str], client_mode: bool, host: str) -> str | None:
    """What to do so that peers outside this network can connect, or None if nothing is needed.

    None when the node announces addresses, runs in client mode (it only dials
    out), was deliberately bound to loopback, or already sees a public address.
    """
    if announce or client_mode:
        return None
    if host and address_scope_or_none(host) == "loopback":
        return None
    found = [(m.group(1), int(m.group(2))) for m in map(_IP4_TCP.search, visible) if m]
    if not found:
        return "this node has no TCP/IPv4 listen address; pass --host-port PORT, or use --client-mode"
    if any(address_scope(ip) == "public" for ip, _ in found):
        return None
    port = found[0][1]
    return (
        f"others outside this network cannot reach you: forward TCP port {port} to this machine and pass "
        f"--announce /ip4/<public-ip>/tcp/{port}, or use --client-mode"
    )


def address_scope_or_none(host: str) -> str | None:
    """:func:`address_scope` of an IP literal; None for a hostname or the wildcard address."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if addr.is_unspecified else address_scope(host)


def local_ipv4_addresses() -> list[str]:
    """This machine's IPv4 addresses as far as the OS tells without sending anything (loopback first)."""
    found = {"127.0.0.1"}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    try:  # the source address the OS would use for the internet; a UDP connect sends no packet
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(found, key=lambda ip: (address_scope(ip) != "loopback", ip))


def listen_multiaddrs(host: str, port: int, peer_id: str) -> list[str]:
    """The multiaddrs a node listening on ``host:port`` would print (``0.0.0.0`` = every local address)."""
    hosts = local_ipv4_addresses() if host in ("", "0.0.0.0") else [host]
    return [f"/ip4/{h}/tcp/{port}/p2p/{peer_id}" for h in hosts]
