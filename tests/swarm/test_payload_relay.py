"""Fetching through a relay: the publisher's bytes unchanged, within the relay's bounds, and only as a fallback.

Streams are real loopback TCP connections; the "P2P" objects only route a peer id to a port, as
tests/swarm/test_exchange_unit.py does for direct fetches.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hivemind.p2p import PeerID

from protocol import SigningKey, limits
from protocol.messages import payload_digest
from swarm import payload_relay
from swarm.payload_relay import RELAY_SUFFIX, REQUEST, REQUEST_MAGIC, RelayServer, fetch_via
from swarm.payload_stream import FetchError, FetchFailure, Pace, fetch_many, serve_one

A, B, C = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3))
QUICK = Pace(dial_timeout_s=0.5, first_byte_timeout_s=0.5, min_rate_bps=64 * 1024, grace_s=0.3)
PAYLOAD = bytes(range(256)) * 400
DIGEST = payload_digest(PAYLOAD)


class _Net:
    """Peer id -> (handler name -> loopback port); a peer not listed, or a name it does not serve, is unreachable."""

    def __init__(self) -> None:
        self.ports: dict[tuple[str, str], int] = {}
        self.opened: list[tuple[str, str]] = []

    async def call_binary_stream_handler(self, peer: PeerID, name: str) -> tuple[None, Any, Any]:
        key = (peer.to_base58(), name)
        self.opened.append(key)
        if key not in self.ports:
            raise ConnectionRefusedError(f"no route to {key[0][-6:]}")
        reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[key])
        return None, reader, writer


async def _serve(handler: Any) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _publisher(served: dict[str, bytes]) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_one(reader, writer, served.get, 4096)
        writer.close()

    return await _serve(handle)


async def _relay_setup(net: _Net, relay: RelayServer, requester: str) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay.handle(requester, reader, writer)

    server, port = await _serve(handle)
    net.ports[(B.peer_id, "h" + RELAY_SUFFIX)] = port
    return server


def _relay_for(net: _Net) -> RelayServer:
    async def open_target(peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        _, reader, writer = await net.call_binary_stream_handler(PeerID.from_base58(peer), "h")
        return reader, writer

    return RelayServer(B.peer_id, open_target, QUICK, 4096)


async def _fetch_through_relay(served: dict[str, bytes], size: int = len(PAYLOAD)) -> bytes:
    net = _Net()
    pub, port = await _publisher(served)
    net.ports[(C.peer_id, "h")] = port  # only the relay B can reach the publisher C
    relay = _relay_for(net)
    server = await _relay_setup(net, relay, A.peer_id)
    try:
        return await asyncio.wait_for(fetch_via(net, B.peer_id, "h", C.peer_id, DIGEST, size, 4096, QUICK), 5.0)
    finally:
        server.close()
        pub.close()


def test_a_relay_passes_the_publishers_bytes_unchanged_and_its_refusals() -> None:
    assert asyncio.run(_fetch_through_relay({DIGEST: PAYLOAD})) == PAYLOAD
    with pytest.raises(FetchError, match="unknown digest"):  # the publisher's own error frame, relayed
        asyncio.run(_fetch_through_relay({}))
    with pytest.raises(FetchError, match="more than the"):  # the relay will not carry more than was asked
        asyncio.run(_fetch_through_relay({DIGEST: PAYLOAD}, size=len(PAYLOAD) - 1))


def _raw_request(target: str, size: int, digest: str = DIGEST) -> bytes:
    return REQUEST.pack(REQUEST_MAGIC, len(target), size) + target.encode() + digest.encode()


async def _ask_raw(relay: RelayServer, requester: str, request: bytes) -> bytes:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay.handle(requester, reader, writer)

    server, port = await _serve(handle)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        return data
    finally:
        server.close()


def test_a_request_over_the_payload_limit_or_for_itself_is_refused_before_any_dial() -> None:
    net = _Net()
    relay = _relay_for(net)
    too_big = asyncio.run(_ask_raw(relay, A.peer_id, _raw_request(C.peer_id, limits.MAX_PAYLOAD_BYTES + 1)))
    assert too_big == b""  # closed without a dial
    own = asyncio.run(_ask_raw(relay, A.peer_id, _raw_request(A.peer_id, 100)))
    assert b"relay refused" in own
    assert net.opened == []


def test_a_requester_gets_at_most_its_share_of_the_relays_slots() -> None:
    """Slow publishers hold the relay; the requester's third concurrent fetch is refused at once."""

    async def run() -> list[bytes]:
        net = _Net()
        release = asyncio.Event()

        async def stalling(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(64)
            await release.wait()
            writer.close()

        stall, port = await _serve(stalling)
        net.ports[(C.peer_id, "h")] = port
        relay = _relay_for(net)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await relay.handle(A.peer_id, reader, writer)

        server, rport = await _serve(handle)
        streams = []
        for _ in range(payload_relay.MAX_RELAYS_PER_PEER):
            reader, writer = await asyncio.open_connection("127.0.0.1", rport)
            writer.write(_raw_request(C.peer_id, 100))
            streams.append((reader, writer))
        for _ in range(100):  # until the relay holds both slots
            if relay._slots.held[A.peer_id] == payload_relay.MAX_RELAYS_PER_PEER:
                break
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", rport)
        writer.write(_raw_request(C.peer_id, 100))
        third = await asyncio.wait_for(reader.read(), 2.0)
        release.set()
        for _, w in [*streams, (reader, writer)]:
            w.close()
        server.close()
        stall.close()
        return [third]

    (third,) = asyncio.run(run())
    assert b"relay refused" in third


def test_fetch_many_tries_the_fallback_only_for_an_unreachable_publisher() -> None:
    async def run() -> tuple[dict[tuple[str, str], bytes | FetchError], list[str]]:
        net = _Net()
        pub, port = await _publisher({DIGEST: PAYLOAD})
        net.ports[(B.peer_id, "h")] = port  # B is reachable; C is not
        asked: list[str] = []

        async def fallback(peer: str, digest: str, size: int, left: float) -> bytes:
            asked.append(peer)
            assert left > 0
            return PAYLOAD

        wanted = [(B.peer_id, DIGEST, len(PAYLOAD)), (C.peer_id, DIGEST, len(PAYLOAD))]
        got = await fetch_many(
            net, "h", wanted, budget_s=5.0, parallel=4, chunk_bytes=4096, pace=QUICK, fallback=fallback
        )
        pub.close()
        return got, asked

    got, asked = asyncio.run(run())
    assert asked == [C.peer_id]
    assert got[(B.peer_id, DIGEST)] == PAYLOAD and got[(C.peer_id, DIGEST)] == PAYLOAD


def test_a_failed_fallback_keeps_the_direct_failure() -> None:
    async def run() -> bytes | FetchError:
        async def fallback(peer: str, digest: str, size: int, left: float) -> bytes:
            raise FetchError(FetchFailure.CLOSED, "relay gave up")

        got = await fetch_many(_Net(), "h", [(C.peer_id, DIGEST, 10)], budget_s=2.0, parallel=1, chunk_bytes=4096,
                               pace=QUICK, fallback=fallback)  # fmt: skip
        return got[(C.peer_id, DIGEST)]

    result = asyncio.run(run())
    assert isinstance(result, FetchError) and result.kind is FetchFailure.UNREACHABLE


def test_a_publisher_that_needed_the_relay_goes_to_it_first_and_is_dialled_only_if_it_fails() -> None:
    async def run(relay_ok: bool) -> tuple[bytes | FetchError, list[tuple[str, str]]]:
        net = _Net()

        async def fallback(peer: str, digest: str, size: int, left: float) -> bytes:
            if not relay_ok:
                raise FetchError(FetchFailure.CLOSED, "relay gave up")
            return PAYLOAD

        wanted = [(C.peer_id, DIGEST, len(PAYLOAD))]
        got = await fetch_many(net, "h", wanted, budget_s=2.0, parallel=1, chunk_bytes=4096, pace=QUICK,
                               fallback=fallback, relay_first=lambda p: p == C.peer_id)  # fmt: skip
        return got[(C.peer_id, DIGEST)], net.opened

    got, opened = asyncio.run(run(relay_ok=True))
    assert got == PAYLOAD and opened == []  # no direct dial waited out
    got, opened = asyncio.run(run(relay_ok=False))
    assert isinstance(got, FetchError) and opened == [(C.peer_id, "h")]  # then the direct dial, once
