"""Fetching a payload through a third peer, when its publisher cannot be dialled (two homes behind NAT).

A node behind NAT reaches the swarm over connections it opens itself, and a peer it dialled can open
streams back over them, but a node in *another* home can open nothing to it: neither router lets the
other's connection in. Every public peer that the NATed publisher is connected to can: so a fetcher whose
direct fetch found the publisher unreachable asks such a peer to fetch *for* it (:func:`relay_request`),
and the relay streams the publisher's answer back as it comes.

A relay cannot forge anything: the payload's digest is in the descriptor its publisher signed, and the
fetcher checks the bytes against it as it does for a direct fetch (:mod:`swarm.exchange`). All it can do
is fail, which costs the fetcher the relay's time only, within the same pace.

The relay is bounded against a peer with many keys: at most :data:`MAX_RELAYS` relayed fetches at once
and :data:`MAX_RELAYS_PER_PEER` per requester (others refused at once, with an error frame), each at most
the payload size the request names (itself at most the protocol's payload limit, checked before any
dial), each kept to the fetch's :class:`~swarm.payload_stream.Pace` on both legs (a slow publisher or a
slow requester is cut). Wire format of the request: ``b"SNQ1" | id length (1 byte) | size (4 bytes, big
endian)``, then the publisher's peer id (ASCII, at most 64 bytes) and the digest (64 hex bytes). The
answer is the publisher's own response frame, unchanged, or an error frame from the relay.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import replace

from hivemind.p2p import P2P

from protocol import limits
from swarm.payload_stream import DIGEST_LEN, HEADER, MAGIC, MAX_ERROR_BYTES, STATUS_OK, Pace, error_frame, fetch_one
from swarm.slots import Slots

logger = logging.getLogger(__name__)

RELAY_SUFFIX = ".relay"
REQUEST_MAGIC = b"SNQ1"
REQUEST = struct.Struct(">4sBI")
MAX_PEER_ID = 64
MAX_RELAYS = 8
MAX_RELAYS_PER_PEER = 2
READ_TIMEOUT_S = 2.0

OpenTarget = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def relay_request(target: str, digest: str, size: int) -> bytes:
    peer = target.encode("ascii")
    return REQUEST.pack(REQUEST_MAGIC, len(peer), size) + peer + digest.encode("ascii")


def relayed_pace(pace: Pace) -> Pace:
    """The fetcher's pace through a relay: the first byte may wait for the relay's own dial as well."""
    return replace(pace, first_byte_timeout_s=pace.first_byte_timeout_s + pace.dial_timeout_s)


class RelayServer:
    """Relays fetches within the bounds of the module's docstring; counts what it did."""

    def __init__(self, me: str, open_target: OpenTarget, pace: Pace, chunk_bytes: int) -> None:
        self._me = me
        self._open = open_target
        self._pace = pace
        self._chunk = chunk_bytes
        self._slots = Slots(MAX_RELAYS, MAX_RELAYS_PER_PEER)
        self.relayed = 0
        self.refused = 0
        self.bytes = 0

    async def handle(self, requester: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one relay request; never raises (a failure closes the requester's stream)."""
        try:
            parsed = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT_S)
            if parsed is None:
                return
            target, digest, size = parsed
            if target in (requester, self._me) or not self._slots.take(requester):
                self.refused += 1
                writer.write(error_frame("relay refused: busy, or a fetch from yourself or from this relay"))
                await writer.drain()
                return
            try:
                sent = await asyncio.wait_for(self._relay(target, digest, size, writer), self._pace.budget_s(size) + 1)
                self.relayed += int(sent > 0)
                self.bytes += sent
            finally:
                self._slots.give(requester)
        except Exception as e:  # the requester or the publisher went away, was slow, or sent garbage
            logger.debug("[%s] relay for %s ended: %s", self._me[-6:], requester[-6:], type(e).__name__)
        finally:
            writer.close()

    async def _relay(self, target: str, digest: str, size: int, writer: asyncio.StreamWriter) -> int:
        """Fetch ``digest`` from ``target`` and stream its answer to ``writer``; the payload bytes relayed."""
        try:
            t_reader, t_writer = await asyncio.wait_for(self._open(target), self._pace.dial_timeout_s)
        except Exception as e:
            writer.write(error_frame(f"relay could not reach the publisher: {type(e).__name__}"))
            await writer.drain()
            return 0
        try:
            t_writer.write(digest.encode("ascii"))
            await t_writer.drain()
            head = await asyncio.wait_for(t_reader.readexactly(HEADER.size), self._pace.first_byte_timeout_s)
            magic, status, length = HEADER.unpack(head)
            if magic != MAGIC:
                return 0
            if status != STATUS_OK:
                length = min(length, MAX_ERROR_BYTES)
                message = await asyncio.wait_for(t_reader.readexactly(length), self._pace.grace_s)
                writer.write(HEADER.pack(MAGIC, status, len(message)) + message)
                await writer.drain()
                return 0
            if length > size:
                writer.write(error_frame(f"publisher announced {length} bytes, more than the {size} asked"))
                await writer.drain()
                return 0
            writer.write(head)
            return await self._pipe(t_reader, writer, length)
        finally:
            t_writer.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, length: int) -> int:
        """Copy ``length`` bytes at the pace's minimum rate or better, in both legs (a drain waits on the sink)."""
        loop = asyncio.get_running_loop()
        start, moved = loop.time(), 0
        async with asyncio.timeout_at(self._pace.body_deadline(start, 0)) as cutoff:
            while moved < length:
                chunk = await source.read(min(self._chunk, length - moved))
                if not chunk:
                    raise ConnectionError(f"publisher closed after {moved} of {length} bytes")
                sink.write(chunk)
                await sink.drain()
                moved += len(chunk)
                cutoff.reschedule(self._pace.body_deadline(start, moved))
        return moved


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, int] | None:
    """(publisher, digest, size) of a well-formed request within the limits; None otherwise."""
    magic, id_len, size = REQUEST.unpack(await reader.readexactly(REQUEST.size))
    if magic != REQUEST_MAGIC or not 0 < id_len <= MAX_PEER_ID or not 0 < size <= limits.MAX_PAYLOAD_BYTES:
        return None
    target = (await reader.readexactly(id_len)).decode("ascii", errors="replace")
    digest = (await reader.readexactly(DIGEST_LEN)).decode("ascii", errors="replace")
    if not target.isalnum() or not all(c in "0123456789abcdef" for c in digest):
        return None
    return target, digest, size


async def fetch_via(
    p2p: P2P, relay: str, handler: str, target: str, digest: str, size: int, chunk_bytes: int, pace: Pace
) -> bytes:
    """Fetch ``digest`` of publisher ``target`` through ``relay``'s relay handler (raises FetchError)."""
    request = relay_request(target, digest, size)
    return await fetch_one(p2p, relay, handler + RELAY_SUFFIX, digest, size, chunk_bytes, relayed_pace(pace), request)
