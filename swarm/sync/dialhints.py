"""Addresses peers publish with their state records, dialled when a peer cannot be reached otherwise.

libp2p dials a peer id through the addresses its daemon knows: from a
connection, or found by its own routing. A peer known only second-hand (two
islands that met through one bridge peer) may have none for minutes, and a
failed dial is then refused at once for a while (dial backoff). Members of one
history that can reach a joiner and members that cannot compute different
groups, and nothing commits. So every state record carries its signer's
transport addresses (at most :data:`MAX_ADDRS`), and a ping or a state
download that fails to dial a peer first connects through them, then tries
once more.

Bounded: at most one connect per peer per :data:`RECONNECT_S`, and hints for at
most :data:`MAX_HINTS` peers. An address that does not belong to the record's
signer fails libp2p's handshake (it checks the peer id), so a record naming
another host's address costs one refused dial. Keys are free, though: ghost
join records from a thousand fresh keys, each naming a third party's address,
would have every member dial that host once per key and round (up to 1,024 x
4 dials). So one address is dialled at most once per :data:`RECONNECT_S`,
whichever peers name it, and all hint-driven connects together at most
:data:`MAX_CONNECTS` times per :data:`RECONNECT_S`: a third party named by any
number of keys sees at most one dial per member per 30 s.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

MAX_ADDRS = 4
MAX_ADDR_CHARS = 128
RECONNECT_S = 30.0
"""Seconds between two connects to one peer through its published addresses."""
MAX_HINTS = 4096
MAX_CONNECTS = 32
"""Hint-driven connects per :data:`RECONNECT_S`, all peers together (a round pings at most 64 peers, most of them
reachable without a hint)."""


class _Addressed(Protocol):
    @property
    def addrs(self) -> tuple[str, ...]: ...


CIRCUIT = "/p2p-circuit"


def relays_in(addrs: Iterable[str]) -> list[str]:
    """The relays of ``addrs``' relayed addresses (``.../p2p/<relay>/p2p-circuit``), in order.

    >>> relays_in(["/ip4/1.2.3.4/tcp/5", "/ip4/1.2.3.4/tcp/5/p2p/12D3KooWR/p2p-circuit"])
    ['12D3KooWR']
    """
    out: list[str] = []
    for addr in addrs:
        head, sep, _ = addr.partition(CIRCUIT)
        if sep and "/p2p/" in head:
            relay = head.rsplit("/p2p/", 1)[1]
            if relay and relay not in out:
                out.append(relay)
    return out


def transport_addrs(maddrs: Iterable[str]) -> tuple[str, ...]:
    """The first :data:`MAX_ADDRS` distinct addresses of ``maddrs`` without their own ``/p2p/<id>`` part.

    A relayed address keeps its relay (``/ip4/R/tcp/P/p2p/<relay>/p2p-circuit``): behind NAT it is the only
    way in. Direct addresses come first, so a record that can name only four names those.

    >>> transport_addrs(["/ip4/127.0.0.1/tcp/5/p2p/12D3KooWA", "/ip4/127.0.0.1/tcp/5"])
    ('/ip4/127.0.0.1/tcp/5',)
    >>> transport_addrs(["/ip4/1.2.3.4/tcp/5/p2p/12D3KooWR/p2p-circuit/p2p/12D3KooWA"])
    ('/ip4/1.2.3.4/tcp/5/p2p/12D3KooWR/p2p-circuit',)
    """
    out: list[str] = []
    for m in sorted(maddrs, key=lambda a: CIRCUIT in a):
        addr = m.split(CIRCUIT)[0] + CIRCUIT if CIRCUIT in m else m.split("/p2p/")[0]
        if valid_addr(addr) and addr not in out:
            out.append(addr)
    return tuple(out[:MAX_ADDRS])


def behind_nat(addrs: Iterable[str]) -> bool:
    """Whether these published addresses are a NATed peer's: a relayed one, or IPv4 ones all private.

    >>> behind_nat(["/ip4/10.20.0.10/tcp/7100"]), behind_nat(["/ip4/203.0.114.10/tcp/7100"])
    (True, False)
    >>> behind_nat(["/ip4/127.0.0.1/tcp/5"]), behind_nat([]), behind_nat(["/ip4/1.2.3.4/tcp/5/p2p/R/p2p-circuit"])
    (False, False, True)
    """
    ips: list[ipaddress.IPv4Address] = []
    for addr in addrs:
        if CIRCUIT in addr:
            return True
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] == "ip4":
            try:
                ips.append(ipaddress.IPv4Address(parts[2]))
            except ValueError:
                continue
    return bool(ips) and all(ip.is_private and not ip.is_loopback for ip in ips)


def valid_addr(value: object) -> bool:
    """A transport multiaddr's text: ``/``-led printable ASCII, at most :data:`MAX_ADDR_CHARS`, no peer id but a
    relay's (``.../p2p/<relay>/p2p-circuit``)."""
    if not (
        isinstance(value, str)
        and 1 < len(value) <= MAX_ADDR_CHARS
        and value.startswith("/")
        and value.isascii()
        and value.isprintable()
    ):
        return False
    if value.endswith(CIRCUIT):
        head = value[: -len(CIRCUIT)]
        return head.count("/p2p/") == 1 and "/p2p/" in head and CIRCUIT not in head
    return "/p2p/" not in value


class DialHints:
    """Peer -> the addresses its own record published, handed out for a connect at most every RECONNECT_S."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._addrs: dict[str, tuple[str, ...]] = {}
        self._tried: dict[str, float] = {}
        self._dialled: dict[str, float] = {}
        """Address -> when it was last handed out: one dial per address per RECONNECT_S, whoever names it."""

    def learn(self, records: Mapping[str, _Addressed]) -> None:
        """Take every record's addresses (the newest win; the oldest peers are forgotten past MAX_HINTS)."""
        for peer, record in records.items():
            if record.addrs:
                self._addrs.pop(peer, None)
                self._addrs[peer] = record.addrs
        while len(self._addrs) > MAX_HINTS:
            del self._addrs[next(iter(self._addrs))]
        while len(self._tried) > MAX_HINTS:
            del self._tried[next(iter(self._tried))]

    def behind_nat(self, peer: str) -> bool:
        """Whether ``peer``'s record says it sits behind NAT: a relayed address, or only private ones."""
        return behind_nat(self._addrs.get(peer, ()))

    def relays(self, peer: str) -> list[str]:
        """The relays named in ``peer``'s published relayed addresses: peers it holds a connection to."""
        return relays_in(self._addrs.get(peer, ()))

    def take(self, peer: str) -> tuple[str, ...]:
        """``peer``'s addresses to connect through now, or none: unknown, tried within RECONNECT_S, every
        address it names dialled within RECONNECT_S, or MAX_CONNECTS connects made within RECONNECT_S."""
        now = self._clock()
        if peer not in self._addrs or now - self._tried.get(peer, -RECONNECT_S) < RECONNECT_S:
            return ()
        self._dialled = {a: t for a, t in self._dialled.items() if now - t < RECONNECT_S}
        fresh = tuple(a for a in self._addrs[peer] if a not in self._dialled)
        recent = sum(now - t < RECONNECT_S for t in self._tried.values())
        if not fresh or recent >= MAX_CONNECTS:
            return ()
        self._tried[peer] = now
        self._dialled.update(dict.fromkeys(fresh, now))
        return fresh
