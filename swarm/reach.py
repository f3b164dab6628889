"""Is this node reachable? Peers dial it back and say so: public, forwarded, or behind NAT.

A node's own addresses cannot tell a home behind a router (10.20.0.10, not reachable) from a LAN
with a forwarded port (10.20.0.10, reachable at the router's address) or from a cloud machine with a
private interface and a public address in front of it. Only a dial from outside can. So every node
serves a *dial-back*: a peer asks "dial me at port P"; the node opens a TCP connection to P **at the
IP address the asking connection comes from** (never an address the asker names, so nobody can aim
these dials at a third machine) and answers whether it connected, with the IP it saw.

The server is bounded against a peer with many keys: at most :data:`MAX_DIALS_AT_ONCE` dial-backs at
once (others are refused at once), :data:`PER_IP_DIALS` per asking IP every :data:`PER_IP_S` seconds (a
key is free, an IP is not; a few, because the nodes of one home share their router's IP), each dial at
most :data:`DIAL_TIMEOUT_S`. Requests and answers are a few bytes of fixed layout, read with a deadline.

:func:`verdict` turns the answers into a :class:`Reachability` by majority, so one lying peer among
three cannot flip it (answers from peers that saw this node at a public address outvote those that saw
it at a private one: a peer in the same home dials it across the LAN, which says nothing of the
internet's view); the verdict only changes what the node says (the start-up line, the join
address it offers), never a bound.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

logger = logging.getLogger(__name__)

HANDLER = "swarm-node/reach/1"
MAGIC = b"SNR1"
REQUEST = struct.Struct(">4sH")  # magic, port to dial back
ANSWER = struct.Struct(">4sBB")  # magic, status, length of the seen IP (ASCII, at most 15 bytes)
MAX_IP_BYTES = 15
DIAL_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0
MAX_DIALS_AT_ONCE = 4
PER_IP_S = 30.0
PER_IP_DIALS = 4
REMEMBERED_IPS = 4096  # asking IPs remembered for the per-IP rate (oldest forgotten)


class DialStatus(StrEnum):
    REACHABLE = "reachable"
    UNREACHABLE = "unreachable"
    REFUSED = "refused"  # the server would not dial now (busy, asked too often, or no IP to dial)


_STATUS_CODE = {DialStatus.REACHABLE: 1, DialStatus.UNREACHABLE: 0, DialStatus.REFUSED: 2}
_CODE_STATUS = {code: status for status, code in _STATUS_CODE.items()}


class Reachability(StrEnum):
    PUBLIC = "public"  # dialled back at an address this node listens on
    FORWARDED = "forwarded"  # dialled back at another address (a router forwards the port to this node)
    NAT = "behind NAT"  # peers could not dial it: it reaches the swarm only over connections it opens
    UNKNOWN = "unknown"  # no peer answered, or answers disagree


@dataclass(frozen=True)
class DialBack:
    """One peer's answer: whether it connected, and the IP it saw this node's connection come from."""

    status: DialStatus
    seen_ip: str


@dataclass(frozen=True)
class Verdict:
    reachability: Reachability
    seen_ip: str | None  # the IP most peers saw (a NATed node's router), or None
    answers: int  # peers that answered with a dial (refusals and silence not counted)


def verdict(answers: Sequence[DialBack | None], listen_ips: Sequence[str]) -> Verdict:
    """The majority of the peers' dial-backs; refusals and silence do not vote.

    >>> v = verdict([DialBack(DialStatus.UNREACHABLE, "203.0.114.100")] * 2, ["10.20.0.10"])
    >>> v.reachability.value, v.seen_ip
    ('behind NAT', '203.0.114.100')
    """
    votes = [a for a in answers if a is not None and a.status is not DialStatus.REFUSED]
    outside = [a for a in votes if _is_public(a.seen_ip)]
    votes = outside or votes  # a peer on this node's own LAN says nothing of the internet's view
    if not votes:
        return Verdict(Reachability.UNKNOWN, None, 0)
    reached = [a for a in votes if a.status is DialStatus.REACHABLE]
    ips = [a.seen_ip for a in votes]
    seen = max(set(ips), key=ips.count)
    if 2 * len(reached) == len(votes):
        return Verdict(Reachability.UNKNOWN, seen, len(votes))
    if 2 * len(reached) < len(votes):
        return Verdict(Reachability.NAT, seen, len(votes))
    reached_ips = [a.seen_ip for a in reached]
    at = max(set(reached_ips), key=reached_ips.count)
    where = Reachability.PUBLIC if at in set(listen_ips) else Reachability.FORWARDED
    return Verdict(where, at, len(votes))


def _is_public(ip: str) -> bool:
    try:
        return ipaddress.IPv4Address(ip).is_global
    except ValueError:
        return False


def p2p_reachability(
    host: str, announce: Sequence[str], client_mode: bool, initial_peers: Sequence[str], ips: Sequence[str]
) -> str | None:
    """What to tell libp2p about this node's reachability before anyone could dial it back, or None to let
    its AutoNAT find out (loopback swarms, client mode).

    libp2p serves as a relay only when it believes itself public, and reserves a relay slot only when it
    believes itself private; its own probes need several public peers and minutes. A node announcing an
    address, or listening on a public one, is public; one that joins through peers with only private
    addresses of its own is taken to be behind NAT (on a LAN where peers can dial it anyway, the relayed
    address it gains is never used: libp2p prefers direct connections).

    >>> p2p_reachability("0.0.0.0", (), False, ("/ip4/203.0.114.10/tcp/1/p2p/X",), ["127.0.0.1", "10.20.0.10"])
    'private'
    >>> p2p_reachability("203.0.114.10", (), False, (), []), p2p_reachability("127.0.0.1", (), False, ("x",), [])
    ('public', None)
    """
    if client_mode:
        return None
    if announce:
        return "public"
    candidates = list(ips) if host in ("", "0.0.0.0") else [host]
    parsed = []
    for ip in candidates:
        try:
            parsed.append(ipaddress.IPv4Address(ip))
        except ValueError:
            continue
    if any(a.is_global for a in parsed):
        return "public"
    if initial_peers and any(not a.is_loopback for a in parsed):
        return "private"
    return None


def local_ips() -> list[str]:
    """This machine's IPv4 addresses as the OS tells without sending anything (see node.observe.reach too)."""
    found: set[str] = set()
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
    return sorted(found)


def ip_of_multiaddr(addr: str | None) -> str | None:
    """The IPv4 address of a direct connection's multiaddr; None for a relayed, IPv6 or unparsable one."""
    if not addr or "p2p-circuit" in addr:
        return None
    parts = addr.split("/")
    if len(parts) < 3 or parts[1] != "ip4":
        return None
    try:
        return str(ipaddress.IPv4Address(parts[2]))
    except ValueError:
        return None


async def tcp_dial(ip: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to ``ip:port`` opens within ``timeout`` s (closed at once)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


Dial = Callable[[str, int, float], Awaitable[bool]]


class DialBackServer:
    """Serves dial-backs within the bounds of the module's docstring; ``now`` is the caller's clock."""

    def __init__(self, now: Callable[[], float], dial: Dial = tcp_dial) -> None:
        self._now = now
        self._dial = dial
        self._busy = 0
        self._last: OrderedDict[str, list[float]] = OrderedDict()  # asking IP -> its dials within PER_IP_S
        self.served = 0
        self.refused = 0

    def admit(self, ip: str | None) -> bool:
        """Whether to dial ``ip`` now (taking its slot): an IP, a free slot, and fewer than PER_IP_DIALS dials
        to it within PER_IP_S."""
        if ip is None or self._busy >= MAX_DIALS_AT_ONCE:
            return False
        now = self._now()
        recent = [t for t in self._last.get(ip, []) if now - t < PER_IP_S]
        if len(recent) >= PER_IP_DIALS:
            return False
        self._last[ip] = [*recent, now]
        self._last.move_to_end(ip)
        while len(self._last) > REMEMBERED_IPS:
            self._last.popitem(last=False)
        return True

    async def handle(self, remote_addr: str | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request; every failure is an answer or a closed stream, never a raise."""
        ip = ip_of_multiaddr(remote_addr)
        try:
            raw = await asyncio.wait_for(reader.readexactly(REQUEST.size), READ_TIMEOUT_S)
            magic, port = REQUEST.unpack(raw)
            if magic != MAGIC or port == 0:
                return
            if not self.admit(ip):
                self.refused += 1
                status = DialStatus.REFUSED
            else:
                assert ip is not None
                self._busy += 1
                try:
                    reached = await self._dial(ip, port, DIAL_TIMEOUT_S)
                    status = DialStatus.REACHABLE if reached else DialStatus.UNREACHABLE
                finally:
                    self._busy -= 1
                self.served += 1
            writer.write(encode_answer(status, ip or ""))
            await writer.drain()
        except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError) as e:
            logger.debug("dial-back request from %s ended: %s", ip, type(e).__name__)
        finally:
            writer.close()


def encode_answer(status: DialStatus, seen_ip: str) -> bytes:
    ip = seen_ip.encode("ascii")[:MAX_IP_BYTES]
    return ANSWER.pack(MAGIC, _STATUS_CODE[status], len(ip)) + ip


async def read_answer(reader: asyncio.StreamReader, timeout: float) -> DialBack | None:
    """The answer on ``reader``, or None when it is late, malformed or names no IP address."""
    try:
        raw = await asyncio.wait_for(reader.readexactly(ANSWER.size), timeout)
        magic, code, length = ANSWER.unpack(raw)
        if magic != MAGIC or code not in _CODE_STATUS or length > MAX_IP_BYTES:
            return None
        text = (await asyncio.wait_for(reader.readexactly(length), timeout)).decode("ascii")
        ip = str(ipaddress.IPv4Address(text)) if text else ""
    except (OSError, EOFError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return None
    status = _CODE_STATUS[code]
    if status is not DialStatus.REFUSED and not ip:
        return None
    return DialBack(status, ip)


def encode_request(port: int) -> bytes:
    return REQUEST.pack(MAGIC, port)


async def ask(
    open_stream: Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
    peer: str,
    port: int,
    timeout: float,
) -> DialBack | None:
    """Ask ``peer`` to dial this node back at ``port``; its answer, or None when it did not answer in time."""
    try:
        reader, writer = await asyncio.wait_for(open_stream(peer), timeout)
    except Exception as e:  # unreachable, refused, timed out: no answer from this peer
        logger.debug("dial-back: no stream to %s: %s", peer[-6:], type(e).__name__)
        return None
    try:
        writer.write(encode_request(port))
        await writer.drain()
        return await read_answer(reader, timeout)
    except (OSError, EOFError) as e:
        logger.debug("dial-back: %s closed the stream: %s", peer[-6:], type(e).__name__)
        return None
    finally:
        writer.close()


async def check(
    open_stream: Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
    peers: Sequence[str],
    port: int,
    listen_ips: Sequence[str],
    timeout: float,
) -> Verdict:
    """Ask up to three of ``peers`` at once (the first ones: the caller puts the ones it trusts most first)."""
    answers = await asyncio.gather(*(ask(open_stream, p, port, timeout) for p in list(peers)[:3]))
    return verdict(answers, listen_ips)
