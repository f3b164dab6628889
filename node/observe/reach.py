"""Can others reach this node? A pure decision on its addresses, and a plain-words hint.

:func:`reachability_advice` looks only at its inputs (the multiaddrs the node
sees itself on, the announced ones, client mode, the listen host), so it is
unit-tested without a network.
"""

from __future__ import annotations

import ipaddress
import re

from swarm.reach import Reachability, Verdict, local_ips

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
    found = {"127.0.0.1", *local_ips()}
    return sorted(found, key=lambda ip: (address_scope(ip) != "loopback", ip))


def listen_multiaddrs(host: str, port: int, peer_id: str) -> list[str]:
    """The multiaddrs a node listening on ``host:port`` would print (``0.0.0.0`` = every local address)."""
    hosts = local_ipv4_addresses() if host in ("", "0.0.0.0") else [host]
    return [f"/ip4/{h}/tcp/{port}/p2p/{peer_id}" for h in hosts]


def _port_of(addrs: list[str]) -> int | None:
    found = [int(m.group(2)) for m in map(_IP4_TCP.search, addrs) if m]
    return found[0] if found else None


def startup_reach(
    verdict: Verdict, addrs: list[str], joined_through: list[str], peer_id: str
) -> tuple[str, str | None]:
    """(the join command to offer, a note on how this node is reachable or None), from its peers' dial-backs.

    A node behind NAT never offers its own (private) address: whoever tries it from outside waits for a
    connection that cannot open; it offers the peer it joined through, which did answer.
    """
    port = _port_of(addrs)
    if verdict.reachability is Reachability.PUBLIC and verdict.seen_ip:
        at = [a for a in addrs if f"/ip4/{verdict.seen_ip}/" in a]
        return (f"swarm-node join --peer {at[0] if at else _best(addrs)}",
                f"reachable: peers dialled this node back at {verdict.seen_ip}")  # fmt: skip
    if verdict.reachability is Reachability.FORWARDED and verdict.seen_ip and port is not None:
        outside = f"/ip4/{verdict.seen_ip}/tcp/{port}"
        return (f"swarm-node join --peer {outside}/p2p/{peer_id}",
                f"reachable through a forwarded port at {verdict.seen_ip}; pass --announce {outside} so that "
                "peers learn that address")  # fmt: skip
    if verdict.reachability is Reachability.NAT:
        seen = f"{verdict.seen_ip}:{port}" if verdict.seen_ip and port is not None else "this node"
        public = verdict.seen_ip or "<public-ip>"
        offer = (
            f"swarm-node join --peer {joined_through[0]}" if joined_through else "(nobody can join through this node)"
        )
        return (offer,
                f"behind NAT: {verdict.answers} peer(s) could not dial {seen}; this node trains and shares over "
                "the connections it opens, and others join through the peer it joined; to be reachable, forward "
                f"TCP port {port} to this machine and pass --announce /ip4/{public}/tcp/{port}")  # fmt: skip
    return f"swarm-node join --peer {_best(addrs)}" if addrs else "(no listen address)", None


def _best(addrs: list[str]) -> str:
    """A public address first, then a private one, loopback last."""
    order = {"public": 0, "private": 1, "loopback": 2}

    def rank(a: str) -> tuple[int, str]:
        m = _IP4_TCP.search(a)
        return (order[address_scope(m.group(1))] if m else 3, a)

    return sorted(addrs, key=rank)[0]


RELAY_WARN_S = 300.0
"""How long a node behind NAT waits for a relayed address before it warns. libp2p's auto-relay starts looking
after a boot delay of up to 180 s when it knows fewer than four relay candidates (docs/ARCHITECTURE.md,
"Relays and NAT"); slots came 143-213 s after start on the WAN testbed."""


def relayed_via(addrs: list[str]) -> str | None:
    """The relay of the first relayed address among ``addrs`` (``.../p2p/<relay>/p2p-circuit...``), or None.

    >>> relayed_via(["/ip4/10.0.0.2/tcp/1", "/ip4/203.0.114.10/tcp/7100/p2p/12D3KooWR/p2p-circuit"])
    '/ip4/203.0.114.10/tcp/7100/p2p/12D3KooWR'
    >>> relayed_via(["/ip4/10.0.0.2/tcp/1"]) is None
    True
    """
    for addr in addrs:
        head, sep, _ = addr.partition("/p2p-circuit")
        if sep and "/p2p/" in head:
            return head
    return None


def relay_news(addrs: list[str], waited_s: float, warned: bool, warn_after_s: float = RELAY_WARN_S) -> str | None:
    """What a node behind NAT says about its relay slot now: that it has one (once), that none came within
    ``warn_after_s`` (once, ``warned`` says whether it was said), or None (nothing new).

    >>> relay_news(["/ip4/203.0.114.10/tcp/1/p2p/R/p2p-circuit"], 40.0, False)[:29]
    'relayed via /ip4/203.0.114.10'
    >>> relay_news([], 10.0, False) is None, relay_news([], 301.0, True) is None
    (True, True)
    """
    relay = relayed_via(addrs)
    if relay is not None:
        return (f"relayed via {relay} after {waited_s:.0f} s: same-model peers behind other NATs sync with this "
                "node through it")  # fmt: skip
    if waited_s >= warn_after_s and not warned:
        return (f"no relay slot after {waited_s:.0f} s: peers behind other NATs cannot reach this node for the "
                "outer sync (rollouts still go through the peers it joined); join through a peer with a public "
                "address, or forward this node's TCP port and pass --announce")  # fmt: skip
    return None
