"""All-reduce payloads on direct TCP connections, set up and checked over the authenticated P2P stream.

Why: every byte on a P2P stream crosses two Unix sockets and two p2pd daemons
(yamux, Noise encryption) and is copied several times in Python on the way;
measured on 127.0.0.1 that path cost ~3 ms of CPU per MB, ~70% of an
uncompressed round's CPU (bench/RESULTS.md, "Outer sync"). Here the bytes go
from the sender's array into the socket and from the socket into the
receiver's array, with no copy in Python.

Trust: the P2P stream still carries everything that matters. The owner hands
out a single-use random ticket on it; the sender's TCP connection must open
with that ticket; the size and sha256 of every payload travel on the stream,
and the receiver refuses bytes that do not hash to them. So an on-path
attacker can delay or cut the TCP connection (as it can a P2P one) but cannot
change a byte unnoticed. The bytes are not encrypted (pseudo-gradients of an
open swarm; see SECURITY.md). The sender dials only the IP address of its own
libp2p connection to the owner, never an address the owner names, so a hostile
owner cannot aim honest senders at a third party. The listener keeps at most
``MAX_GREETING`` unidentified connections, each for ``GREETING_TIMEOUT_S``.
A sender that cannot connect (the owner behind NAT, a relayed connection)
sends on the P2P stream instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from typing import Any

from swarm.sync.errors import PeerLost
from swarm.sync.tensors import Buffer

logger = logging.getLogger(__name__)

TICKET_BYTES = 16
ACK = b"\x01"
"""The owner's answer to a ticket it will read a payload for (before it, a sender can still fall back)."""
MAX_GREETING = 32
"""Connections that may wait at once for their ticket to arrive (a flood of them costs only this)."""
GREETING_TIMEOUT_S = 2.0
"""How long a new connection has to present its ticket."""
CONNECT_TIMEOUT_S = 2.0
"""How long a sender tries to reach an owner directly before it sends on the P2P stream instead."""
CHUNK_BYTES = 1 << 20


def host_of(maddr: Any) -> str | None:
    """The IP address in a libp2p multiaddr of a direct connection; None for a relayed or unparsable one.

    >>> host_of("/ip4/127.0.0.1/tcp/4001"), host_of("/ip4/1.2.3.4/tcp/1/p2p/Qm/p2p-circuit"), host_of(None)
    ('127.0.0.1', None, None)
    """
    parts = str(maddr).split("/") if maddr is not None else []
    if "p2p-circuit" in parts or len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    return parts[2]


class Listener:
    """The owner's side: a TCP listener whose connections are handed to whoever issued their ticket."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._tickets: dict[bytes, asyncio.Future[socket.socket]] = {}
        self._greeting: set[asyncio.Task[None]] = set()
        self.refused = 0
        """Connections closed unidentified (no slot, no ticket in time, or an unknown one)."""
        self.delivered = 0
        """Connections handed to the owner of their ticket."""

    @property
    def greeting(self) -> int:
        """Connections accepted and still waiting for their ticket."""
        return len(self._greeting)

    @property
    def port(self) -> int:
        assert self._sock is not None, "Listener.start() first"
        return int(self._sock.getsockname()[1])

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, 0))
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._greeting) if t is not None]
        for task in tasks:
            task.cancel()
        # wait for them before closing: a cancelled sock_accept unregisters its fd a loop turn later,
        # and by then a closed fd may belong to someone else's transport
        await asyncio.gather(*tasks, return_exceptions=True)
        for fut in self._tickets.values():
            fut.cancel()
        self._tickets.clear()
        if self._sock is not None:
            self._sock.close()

    def issue(self) -> tuple[bytes, asyncio.Future[socket.socket]]:
        """A fresh ticket and the future that gets its connection (call :meth:`revoke` when done)."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        fut: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()
        self._tickets[ticket] = fut
        return ticket, fut

    def take(self, ticket: bytes) -> socket.socket:
        """The connection that arrived for ``ticket`` (its future is done), now the caller's to close."""
        fut = self._tickets.pop(ticket)
        return fut.result()

    def revoke(self, ticket: bytes) -> None:
        """Forget ``ticket``; a connection that arrived for it and was never taken is closed."""
        fut = self._tickets.pop(ticket, None)
        if fut is not None and fut.done() and not fut.cancelled():
            fut.result().close()
        elif fut is not None:
            fut.cancel()

    async def _accept_loop(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as e:  # out of descriptors, say: keep serving, do not spin
                logger.debug("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if len(self._greeting) >= MAX_GREETING:
                self.refused += 1
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._greet(conn))
            self._greeting.add(task)
            task.add_done_callback(self._greeting.discard)

    async def _greet(self, conn: socket.socket) -> None:
        try:
            ticket = bytearray(TICKET_BYTES)
            await asyncio.wait_for(recv_into(conn, memoryview(ticket), GREETING_TIMEOUT_S), GREETING_TIMEOUT_S)
            fut = self._tickets.get(bytes(ticket))
            if fut is None or fut.done():
                raise PeerLost("unknown ticket")
            await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(conn, ACK), GREETING_TIMEOUT_S)
            fut.set_result(conn)
            self.delivered += 1
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception as e:  # silent, closed, an unknown ticket: nobody awaits this task, so no raise
            logger.debug("turned a connection away: %s", type(e).__name__)
            self.refused += 1
            conn.close()


async def connect(host: str, port: int, ticket: bytes, timeout: float) -> socket.socket:
    """Open a connection to an owner, present ``ticket`` and wait for its :data:`ACK` (OSError or
    TimeoutError if it cannot): only after the ACK is the owner reading this connection, so until then
    a sender may still send on the stream instead without the owner waiting for bytes that never come."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        await asyncio.wait_for(loop.sock_sendall(sock, ticket), timeout)
        ack = bytearray(len(ACK))
        await asyncio.wait_for(recv_into(sock, memoryview(ack), timeout), timeout)
        if bytes(ack) != ACK:
            raise ConnectionError("no ticket acknowledgement")
    except PeerLost as e:  # closed before the ACK: turned away (no slot, an unknown ticket)
        sock.close()
        raise ConnectionError(e.reason) from None
    except BaseException:
        sock.close()
        raise
    return sock


async def send(sock: socket.socket, payload: Buffer, chunk_timeout: float) -> None:
    """Write ``payload`` straight from its memory, each 1 MiB chunk under ``chunk_timeout``."""
    loop = asyncio.get_running_loop()
    view = memoryview(payload).cast("B")
    for start in range(0, len(view), CHUNK_BYTES):
        await asyncio.wait_for(loop.sock_sendall(sock, view[start : start + CHUNK_BYTES]), chunk_timeout)


async def recv_into(sock: socket.socket, dest: memoryview, chunk_timeout: float, hasher: Any | None = None) -> None:
    """Fill ``dest`` from the socket (each read under ``chunk_timeout``), feeding ``hasher`` as bytes land."""
    loop = asyncio.get_running_loop()
    got, size = 0, len(dest)
    while got < size:
        n = await asyncio.wait_for(loop.sock_recv_into(sock, dest[got : min(size, got + CHUNK_BYTES)]), chunk_timeout)
        if n == 0:
            raise PeerLost(f"connection closed after {got} of {size} payload bytes")
        if hasher is not None:
            hasher.update(dest[got : got + n])
        got += n


def close(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()
