"""All-reduce payloads on direct TCP connections (swarm/sync/direct.py): same bits as on P2P streams,
checked against the sha256 sent on the stream, a fallback to the stream, a listener a flood cannot hold.

Two real hivemind P2P daemons on 127.0.0.1 each serve a real :class:`SyncService`; both run one round of
a 2-member group against each other. The man in the middle is a real TCP relay that flips one bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import torch
from hivemind.p2p import P2P

from swarm.sync import direct
from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot, SyncService
from swarm.sync.config import SyncAborted
from swarm.sync.hivemind_transport import HivemindStreams

pytestmark = pytest.mark.process  # real p2pd daemons and TCP listeners

N = 300_000
"""Elements: several 1 MiB chunks per slice, so the relay sees a stream, not one packet."""


def _snapshot() -> Snapshot:
    zero = torch.zeros(N)
    return Snapshot(0, "0" * 64, zero, zero)


@contextlib.asynccontextmanager
async def _pair(
    host_a: str | None, host_b: str | None, before_start: Callable[[SyncService], None] | None = None
) -> AsyncIterator[tuple[SyncService, SyncService]]:
    """Two connected daemons, each with a service whose direct listener (if any) binds the given host
    (``before_start`` may change the second service before it registers its handler)."""
    a = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    b = await P2P.create(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[str(m) for m in await a.get_visible_maddrs()]
    )
    # a service without a listener still sends directly (a node in client mode); both None: streams only
    send = host_a is not None or host_b is not None
    services = [
        SyncService(
            HivemindStreams(p2p),
            "test.sync",
            p2p.peer_id.to_base58(),
            5.0,
            _snapshot,
            direct_host=host,
            direct_send=send,
        )
        for p2p, host in ((a, host_a), (b, host_b))
    ]
    if before_start is not None:
        before_start(services[1])
    try:
        for s in services:
            await s.start()
        yield services[0], services[1]
    finally:
        for s in services:
            await s.stop()
        for p2p in (b, a):
            await p2p.shutdown()
            # hivemind leaves the daemon's subprocess transport open: close it on this running loop, not
            # in a finalizer at some later garbage collection (in CPython 3.11.7 one that runs during
            # ast.parse, as pytest imports a module late, fails it: "AST constructor recursion depth")
            child = getattr(p2p, "_child", None)
            if child is not None:
                child._transport.close()


async def _round(
    sa: SyncService, sb: SyncService, flats: tuple[torch.Tensor, torch.Tensor], in_place: bool = False
) -> list[Any]:
    """Both members run one round of the same plan; their results (or the SyncAborted each raised)."""
    members = tuple(sorted([sa._me, sb._me]))
    plan = RoundPlan("g" * 32, 0, members, N, "none", "mean", 0.2, time.time() + 20.0)
    for s, other in ((sa, sb), (sb, sa)):
        s.expect(0, [other._me])
    rounds = (sa.allreduce(plan, flats[0], 3, in_place), sb.allreduce(plan, flats[1], 3, in_place))
    return list(await asyncio.gather(*rounds, return_exceptions=True))


def _flats() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, generator=g), torch.randn(N, generator=g)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60.0))


def test_direct_payloads_give_the_same_bits_as_the_stream() -> None:
    flats = _flats()
    expected = ((flats[0] + flats[1]) / 2.0).numpy()

    async def body() -> None:
        async with _pair("127.0.0.1", "127.0.0.1") as (sa, sb):
            on_direct = await _round(sa, sb, flats)
            assert sa._listener is not None and sa._listener.delivered == 1, "a's part of b's slice came directly"
        async with _pair(None, None) as (sa, sb):
            on_streams = await _round(sa, sb, flats)
        results: list[AllReduceResult] = [*on_direct, *on_streams]
        assert all(isinstance(r, AllReduceResult) for r in results), results
        for r in results:
            assert np.array_equal(r.average, results[0].average)
            assert r.digests == results[0].digests  # the vote digests do not depend on the path
        assert np.allclose(results[0].average, expected, atol=1e-6)

    _run(body)


@pytest.mark.parametrize("hosts", [("127.0.0.1", "127.0.0.1"), (None, None)])
def test_an_average_written_over_the_part_is_the_same_average(hosts: tuple[str | None, str | None]) -> None:
    """A blocking sync's round writes the average into the part's own memory: the same bits as into a buffer
    of its own (every byte it overwrites was sent before), on either path."""

    async def body() -> None:
        async with _pair(*hosts) as (sa, sb):
            apart = await _round(sa, sb, _flats())
            flats = _flats()
            over = await _round(sa, sb, flats, in_place=True)
        assert all(isinstance(r, AllReduceResult) for r in [*apart, *over]), [*apart, *over]
        for i in range(2):
            assert over[i].average.tobytes() == apart[i].average.tobytes() == flats[i].numpy().tobytes()
            assert over[i].digests == apart[i].digests and over[i].own_norms == apart[i].own_norms

    _run(body)


def test_an_owner_without_a_listener_asks_for_the_stream() -> None:
    """b listens for no payloads (as a node in client mode, behind NAT): a, which would send directly, is
    told so in b's answer and sends on the stream at once; b still sends its part to a directly."""
    flats = _flats()

    async def body() -> None:
        async with _pair("127.0.0.1", None) as (sa, sb):
            results = await _round(sa, sb, flats)
            assert all(isinstance(r, AllReduceResult) for r in results), results
            assert np.array_equal(results[0].average, results[1].average)
            assert sa._listener is not None and sa._listener.delivered == 1  # b's part, sent directly
            assert not sa._indirect  # told, not a failed connection: nothing to wait out next time

    _run(body)


async def _relay(target: tuple[str, int], flip_to: int | None, flip_back: int | None) -> tuple[asyncio.Server, int]:
    """A TCP relay to ``target`` that flips the lowest bit of byte ``flip_to`` going towards it (or of byte
    ``flip_back`` coming from it)."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, flip: int | None) -> None:
        seen = 0
        with contextlib.suppress(ConnectionError):
            while data := await r.read(1 << 16):
                if flip is not None and seen <= flip < seen + len(data):
                    buf = bytearray(data)
                    buf[flip - seen] ^= 0x01
                    data = bytes(buf)
                seen += len(data)
                w.write(data)
                await w.drain()
        w.close()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(r, tw, flip_to), pipe(tr, w, flip_back))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


@pytest.mark.parametrize("towards", ["owner", "sender"])
def test_a_bit_flipped_on_the_direct_path_fails_the_round(monkeypatch: pytest.MonkeyPatch, towards: str) -> None:
    """An on-path attacker changes one bit of a part, or of a reduced slice (still a finite float): the
    receiver refuses it, and the round fails instead of averaging it."""
    real_connect = direct.connect
    servers: list[asyncio.Server] = []
    flips = (direct.TICKET_BYTES + 4096, None) if towards == "owner" else (None, len(direct.ACK) + 4096)

    async def through_the_middle(host: str, port: int, ticket: bytes, timeout: float) -> socket.socket:
        server, relay_port = await _relay((host, port), *flips)
        servers.append(server)
        return await real_connect("127.0.0.1", relay_port, ticket, timeout)

    monkeypatch.setattr(direct, "connect", through_the_middle)

    async def body() -> None:
        async with _pair("127.0.0.1", "127.0.0.1") as (sa, sb):
            outcome = await _round(sa, sb, _flats())
        for server in servers:
            server.close()
        assert servers, "the parts went through the relay"
        assert all(isinstance(r, SyncAborted) for r in outcome), outcome  # defence off: both commit tampered bytes
        assert any("sha256" in r.reason for r in outcome), [r.reason for r in outcome]

    _run(body)


def test_an_owner_out_of_reach_gets_the_part_on_the_stream() -> None:
    """Each listener binds 127.0.0.2 while the libp2p connection is on 127.0.0.1: nothing answers the
    address a sender may dial, so every part goes on the stream, and the round ends as it would."""
    flats = _flats()

    async def body() -> None:
        async with _pair("127.0.0.2", "127.0.0.2") as (sa, sb):
            results = await _round(sa, sb, flats)
            assert all(isinstance(r, AllReduceResult) for r in results), results
            assert np.array_equal(results[0].average, results[1].average)
            assert sb._me in sa._indirect and sa._me in sb._indirect  # not tried again for a while
            again = await _round(sa, sb, flats)  # no connection attempt now: straight to the stream
            assert np.array_equal(again[0].average, results[0].average)

    _run(body)


def test_a_flood_of_silent_connections_costs_only_the_greeting_slots() -> None:
    """An attacker holds every greeting slot of a's listener and sends a wrong ticket on one more: those
    are closed; the round still ends with the same bits (b's part to a goes on the stream instead)."""
    flats = _flats()

    async def body() -> None:
        async with _pair("127.0.0.1", "127.0.0.1") as (sa, sb):
            listener = sa._listener
            assert listener is not None
            flood = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(direct.MAX_GREETING + 8)]
            liar = socket.create_connection(("127.0.0.1", listener.port))
            try:
                liar.sendall(b"\x00" * direct.TICKET_BYTES)
                end = time.monotonic() + 10.0
                while listener.refused < 9 and time.monotonic() < end:  # 8 over the slots, then the liar
                    await asyncio.sleep(0.02)
                assert listener.refused >= 9, listener.refused
                results = await _round(sa, sb, flats)
                assert all(isinstance(r, AllReduceResult) for r in results), results
                assert np.array_equal(results[0].average, results[1].average)
            finally:
                for s in [*flood, liar]:
                    s.close()
            # the silent ones are dropped after GREETING_TIMEOUT_S: the slots come back
            end = time.monotonic() + 3 * direct.GREETING_TIMEOUT_S
            while listener.greeting and time.monotonic() < end:
                await asyncio.sleep(0.05)
            assert not listener.greeting

    _run(body)


def test_a_ping_whose_stream_closes_before_an_answer_is_asked_again() -> None:
    """A live peer's first ping stream is closed without an answer (as a daemon under full CPU load
    sometimes does): the ping asks again and the peer counts as live, not as gone."""
    closed: list[int] = []

    def flaky(service: SyncService) -> None:
        real = service._handle

        async def handle(sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if not closed:
                closed.append(1)
                writer.close()
                return
            await real(sender, reader, writer)

        service._handle = handle  # type: ignore[method-assign]

    async def body() -> None:
        async with _pair("127.0.0.1", "127.0.0.1", flaky) as (sa, sb):
            assert await sa.ping(sb._me, 5.0)  # defence off (one try): False
            assert closed == [1]

    _run(body)
