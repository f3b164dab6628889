"""The shape of a peer's multiaddr, checked with the standard library only (no hivemind, no torch), so
the command line refuses a mistyped ``--peer`` at once; :func:`parse_peer_multiaddr` parses it fully
(with hivemind, imported only when it is called) when the node's membership config is built."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hivemind.utils.multiaddr import Multiaddr

EXAMPLE = "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooW..."
_WITH_VALUE = {"ip4", "ip6", "dns", "dns4", "dns6", "dnsaddr", "tcp", "udp", "p2p", "ipfs"}


def not_a_multiaddr(text: str) -> str:
    return f"{text!r} is not a multiaddr; expected something like {EXAMPLE}"


def no_peer_id(text: str) -> str:
    return f"{text!r} has no /p2p/<peer id> part; copy the full address printed by the first node"


def peer_address_problem(text: str) -> str | None:
    """Why ``text`` cannot be a peer's multiaddr (one sentence), or None if its shape is right.

    >>> peer_address_problem("/ip4/127.0.0.1/tcp/1/p2p/12D3KooWabc") is None
    True
    >>> peer_address_problem("garbage")[:31]
    "'garbage' is not a multiaddr; e"
    """
    parts = text.split("/")
    if not text.startswith("/") or len(parts) < 3 or not all(parts[1:]):
        return not_a_multiaddr(text)
    names, i = [], 1
    while i < len(parts):
        name = parts[i]
        names.append(name)
        if name in _WITH_VALUE:
            if i + 1 >= len(parts) or not _value_ok(name, parts[i + 1]):
                return not_a_multiaddr(text)
            i += 2
        else:  # a protocol without a value (quic, ws, p2p-circuit, ...) or one the full parser judges
            i += 1
    if "p2p" not in names and "ipfs" not in names:
        return no_peer_id(text)
    return None


def _value_ok(protocol: str, value: str) -> bool:
    try:
        if protocol == "ip4":
            ipaddress.IPv4Address(value)
        elif protocol == "ip6":
            ipaddress.IPv6Address(value)
        elif protocol in ("tcp", "udp"):
            return value.isdigit() and 0 <= int(value) <= 65535
    except ValueError:
        return False
    return True


def parse_peer_multiaddr(text: str) -> Multiaddr:
    """Parse an initial-peer multiaddr; it must name the peer (``/p2p/<id>``).

    Raises ValueError with a sentence saying what a valid one looks like.
    """
    from hivemind.utils.multiaddr import Multiaddr  # heavy: only a node that joins needs the full parse

    problem = peer_address_problem(text)
    if problem is not None:
        raise ValueError(problem)
    try:
        maddr = Multiaddr(text)
    except Exception:
        raise ValueError(not_a_multiaddr(text)) from None
    if "p2p" not in [p.name for p in maddr.protocols()]:
        raise ValueError(no_peer_id(text))
    return maddr


def parse_announce(text: str) -> Multiaddr:
    """Parse an address to announce; a ValueError says what a valid one looks like."""
    from hivemind.utils.multiaddr import Multiaddr  # heavy: only a node that joins needs the full parse

    try:
        return Multiaddr(text)
    except Exception:
        raise ValueError(f"announce address {text!r} is not a multiaddr, e.g. /ip4/203.0.113.5/tcp/31337") from None
