"""Sync streams through a third peer (swarm.sync.pipe): the bytes arrive as sent, from the peer that signed,
or not at all; the relay's bounds hold; the real outer sync commits between two homes through one.

The unit tests run each peer's streams on real loopback TCP (a peer id routes to a port; a pair listed as
behind two NATs cannot open anything to each other, as two homes cannot); the last runs three real
:class:`OuterSync` members on the simulated network (tests/simnet.py) with two of them in different homes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protocol import SigningKey
from swarm.sync import OuterSync, pipe
from swarm.sync.pipe import MAX_PIPES_PER_PEER, PipedStreams, PipeError, PipeFailure
from swarm.sync.transport import Handler, Opened
from swarm.sync.wire import read_header, write_frame
from tests.simnet import SimNet
from tests.swarm.test_sync_sim import Member, Plan, _key, simulate

A, B, C, D = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3, 4))
NAME = "t.sync.x"
PAYLOAD = bytes(range(256)) * 12_000  # ~3 MB: far past a libp2p circuit's 128 KiB


class LoopNet:
    """Peer id -> a loopback TCP server dispatching by handler name; ``homes``: peers that reach no other home."""

    def __init__(self) -> None:
        self.servers: dict[str, tuple[asyncio.Server, dict[str, Handler]]] = {}
        self.homes: set[str] = set()
        self.tried: list[tuple[str, str, str]] = []
        self.circuit: set[tuple[str, str]] = set()
        """(opener, target) pairs that libp2p would route over a relay circuit."""

    async def add(self, peer: str) -> None:
        handlers: dict[str, Handler] = {}

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await read_header(reader, 5.0)
            handler = handlers.get(head["name"])
            if handler is None:
                writer.close()
                return
            await handler(head["src"], reader, writer)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self.servers[peer] = (server, handlers)

    async def open(self, src: str, dst: str, name: str) -> Opened:
        self.tried.append((src, dst, name))
        if (src in self.homes and dst in self.homes) or dst not in self.servers:
            raise ConnectionError(f"{dst[-6:]} cannot be reached")
        server, handlers = self.servers[dst]
        if name not in handlers:
            raise ConnectionError(f"{dst[-6:]} does not serve {name}")
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await write_frame(writer, {"src": src, "name": name}, b"", 5.0)
        circuit = "/ip4/127.0.0.9/tcp/1/p2p/12D3KooWR/p2p-circuit" if (src, dst) in self.circuit else None
        return Opened(reader, writer, circuit)

    async def close(self) -> None:
        for server, _ in self.servers.values():
            server.close()


class PeerStreams:
    """One peer's view of a :class:`LoopNet` (the :class:`~swarm.sync.transport.Streams` protocol)."""

    def __init__(self, net: LoopNet, me: str) -> None:
        self.net, self.me = net, me
        self.direct: list[str] = []

    async def serve(self, name: str, handler: Handler) -> None:
        self.net.servers[self.me][1][name] = handler

    async def unserve(self, name: str) -> None:
        self.net.servers[self.me][1].pop(name, None)

    async def open(self, peer: str, name: str) -> Opened:
        opened = await self.net.open(self.me, peer, name)
        self.direct.append(name)
        return opened

    async def connect(self, peer: str, addrs: Any) -> None:
        return None


async def _swarm(
    relays: Callable[[str], list[str]] | None = None, cls: type[PipedStreams] = PipedStreams
) -> tuple[LoopNet, dict[str, PipedStreams]]:
    """A public relay ``A``, and ``B`` and ``C`` in two homes; every peer's piped streams (``A`` built by ``cls``)."""
    net = LoopNet()
    out: dict[str, PipedStreams] = {}
    for key in (A, B, C):
        await net.add(key.peer_id)
        kind = cls if key is A else PipedStreams
        fallback = [A.peer_id] if relays is None else []
        streams = PeerStreams(net, key.peer_id)
        out[key.peer_id] = kind(streams, key, "t.sync", relays or (lambda p: []), lambda p: p in net.homes, fallback)
    net.homes = {B.peer_id, C.peer_id}

    async def other(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    await out[A.peer_id].serve("t.sync.other-model", other)  # a relay serves pipes beside its own sync
    return net, out


async def _digest_server(streams: PipedStreams, heard: list[str]) -> None:
    """Serve NAME: read a frame, answer with the sha256 of its payload and who sent it."""

    async def handler(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await read_header(reader, 5.0)
            data = await reader.readexactly(head["size"])
            heard.append(peer)
            await write_frame(writer, {"ok": True, "sha256": hashlib.sha256(data).digest()}, b"", 5.0)
        except (ConnectionError, asyncio.IncompleteReadError):
            heard.append("broken")
        finally:
            writer.close()

    await streams.serve(NAME, handler)


async def _send(streams: PipedStreams, to: str, payload: bytes = PAYLOAD) -> bytes:
    opened = await asyncio.wait_for(streams.open(to, NAME), 10.0)
    try:
        await write_frame(opened.writer, {"op": "part"}, payload, 5.0)
        reply = await read_header(opened.reader, 10.0)
        digest: bytes = reply["sha256"]
        return digest
    finally:
        opened.writer.close()


def test_two_homes_exchange_megabytes_through_a_pipe_and_the_target_hears_the_opener() -> None:
    async def main() -> None:
        net, peers = await _swarm()
        heard: list[str] = []
        await _digest_server(peers[C.peer_id], heard)
        try:
            for _ in range(3):  # c sits behind NAT (its record): pipes first after one failed dial
                assert await _send(peers[B.peer_id], C.peer_id) == hashlib.sha256(PAYLOAD).digest()
            assert heard == [B.peer_id] * 3  # the handshake's signer, not the relay that carried it
            assert net.tried.count((B.peer_id, C.peer_id, NAME)) == 1
            assert peers[B.peer_id].opened == 3 and peers[A.peer_id].relayed_bytes > 3 * len(PAYLOAD)
            assert peers[B.peer_id].failures == {} and peers[A.peer_id].failures == {}
            # a public peer reaches a home directly: no pipe
            assert await _send(peers[A.peer_id], C.peer_id) == hashlib.sha256(PAYLOAD).digest()
            assert peers[A.peer_id].opened == 0 and heard[-1] == A.peer_id
        finally:
            await net.close()

    asyncio.run(main())


def test_a_stream_that_libp2p_would_run_over_a_circuit_goes_through_a_pipe() -> None:
    """A circuit is a limited connection (128 KiB each way on hivemind's relays): the sync never uses one."""

    async def main() -> None:
        net, peers = await _swarm()
        net.homes = set()
        net.circuit = {(B.peer_id, C.peer_id)}
        heard: list[str] = []
        await _digest_server(peers[C.peer_id], heard)
        try:
            assert await _send(peers[B.peer_id], C.peer_id) == hashlib.sha256(PAYLOAD).digest()
            assert peers[B.peer_id].opened == 1 and heard == [B.peer_id]
        finally:
            await net.close()

    asyncio.run(main())


class FlippingRelay(PipedStreams):
    """A relay that changes one byte of everything it copies after the handshake."""

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, moved: list[float]) -> None:
        seen = 0
        while data := await reader.read(65_536):
            seen += len(data)
            if seen > 4096:
                data = bytes([data[0] ^ 1]) + data[1:]
            writer.write(data)
            await writer.drain()


class ImpersonatingRelay(PipedStreams):
    """A relay that tells the target the stream comes from ``D``, a peer it never heard from."""

    async def _copy(self, requester: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await super()._copy(D.peer_id, reader, writer)


def test_a_relay_that_changes_bytes_breaks_the_stream_and_delivers_nothing() -> None:
    async def main() -> None:
        net, peers = await _swarm(cls=FlippingRelay)
        heard: list[str] = []
        await _digest_server(peers[C.peer_id], heard)
        try:
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError, KeyError, Exception)):
                await _send(peers[B.peer_id], C.peer_id)
            await asyncio.sleep(0.2)
            assert B.peer_id not in heard  # the handler never read a changed payload as B's
        finally:
            await net.close()

    asyncio.run(main())


def test_a_relay_cannot_claim_the_stream_comes_from_another_peer() -> None:
    async def main() -> None:
        net, peers = await _swarm(cls=ImpersonatingRelay)
        heard: list[str] = []
        await _digest_server(peers[C.peer_id], heard)
        try:
            with pytest.raises(PipeError) as e:
                await _send(peers[B.peer_id], C.peer_id)
            assert e.value.reason is PipeFailure.UNREACHABLE  # the relay heard the target's refusal
            assert peers[C.peer_id].failures[PipeFailure.BAD_HANDSHAKE] == 1 and heard == []
        finally:
            await net.close()

    asyncio.run(main())


def test_a_relay_copies_at_most_its_bound_of_pipes_for_one_requester() -> None:
    async def main() -> None:
        net, peers = await _swarm()
        release = asyncio.Event()

        async def slow(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await release.wait()
            writer.close()

        await peers[C.peer_id].serve(NAME, slow)
        try:
            held = [await peers[B.peer_id].open(C.peer_id, NAME) for _ in range(MAX_PIPES_PER_PEER)]
            with pytest.raises(PipeError):
                await peers[B.peer_id].open(C.peer_id, NAME)
            assert peers[A.peer_id].failures[PipeFailure.BUSY] == 1
            release.set()
            for opened in held:
                opened.writer.close()
        finally:
            await net.close()

    asyncio.run(main())


def test_no_relay_to_try_is_the_direct_error() -> None:
    async def main() -> None:
        net, peers = await _swarm(relays=lambda p: [])
        await _digest_server(peers[C.peer_id], [])
        try:
            with pytest.raises(ConnectionError, match="cannot be reached"):
                await peers[B.peer_id].open(C.peer_id, NAME)
        finally:
            await net.close()

    asyncio.run(main())


def test_two_homes_of_one_model_commit_through_a_public_peer(tmp_path: Path) -> None:
    """a is public; b and c joined through it from two homes, so b and c can open nothing to each other
    (the simulated network refuses); every round still commits as three, bit-identical, through pipes."""
    syncs: dict[str, OuterSync] = {}
    home = {_key("b").peer_id, _key("c").peer_id}

    def keep(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:
            syncs[m.name] = sync
            # the homes' records name private addresses (swarm.sync.dialhints.behind_nat); the simulation's none
            sync._records.hints.behind_nat = lambda peer: peer in home  # type: ignore[method-assign]

        return setup

    async def homes(net: SimNet, members: dict[str, Member]) -> None:
        inner = net.open

        async def open(src: str, dst: str, name: str) -> Opened:
            if src in home and dst in home:
                raise ConnectionError(f"{dst[-6:]} cannot be reached (another home)")
            return await inner(src, dst, name)

        net.open = open  # type: ignore[method-assign]

    members, _, _ = simulate(tmp_path, ["a", "b", "c"], Plan(rounds=4), faults=homes,
                               setups={n: keep for n in "abc"})  # fmt: skip
    for m in members.values():
        assert [r.group_size for r in m.reports if r.committed] == [3, 3, 3, 3], m.reports
    assert len({m.states[-1] for m in members.values()}) == 1
    pipes = [syncs[n]._pipes for n in "bc"]
    assert all(p is not None and p.opened > 0 for p in pipes)


def test_with_its_named_relays_gone_a_peer_reached_directly_carries_the_pipe() -> None:
    """The bootstrap is gone: a public peer b reached directly before (as members of one round do) relays."""

    async def main() -> None:
        net, peers = await _swarm(relays=lambda p: [])
        heard: list[str] = []
        await _digest_server(peers[C.peer_id], heard)
        await _digest_server(peers[A.peer_id], [])
        try:
            assert await _send(peers[B.peer_id], A.peer_id, b"x") == hashlib.sha256(b"x").digest()
            assert await _send(peers[B.peer_id], C.peer_id) == hashlib.sha256(PAYLOAD).digest()
            assert heard == [B.peer_id] and peers[B.peer_id].opened == 1
        finally:
            await net.close()

    asyncio.run(main())


def test_a_pipe_is_idle_only_when_neither_way_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender streams its part while the reducer says nothing until it has them all: one way silent for
    longer than the idle bound is a live pipe; both ways silent past it is not."""
    monkeypatch.setattr(pipe, "IDLE_S", 0.3)

    async def main() -> None:
        net, peers = await _swarm()

        async def quiet_until_done(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got = 0
            while got < 10:
                got += len(await reader.readexactly(1))
            writer.write(b"done")
            await writer.drain()
            writer.close()

        await peers[C.peer_id].serve(NAME, quiet_until_done)
        try:
            opened = await peers[B.peer_id].open(C.peer_id, NAME)
            for _ in range(10):  # 1 s of trickle one way, nothing back
                opened.writer.write(b"x")
                await opened.writer.drain()
                await asyncio.sleep(0.1)
            assert await asyncio.wait_for(opened.reader.readexactly(4), 2.0) == b"done"
            opened.writer.close()
            silent = await peers[B.peer_id].open(C.peer_id, NAME)
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await asyncio.wait_for(silent.reader.readexactly(4), 3.0)
            assert peers[A.peer_id].failures[PipeFailure.IDLE] == 1
        finally:
            await net.close()

    asyncio.run(main())


def test_a_public_peer_that_cannot_be_dialled_is_down_and_no_relay_is_asked() -> None:
    """A relay would not reach it either: asking one would only lengthen a ping to a dead or restarting peer."""

    async def main() -> None:
        net, peers = await _swarm()
        await net.add(D.peer_id)  # public (no home), serving nothing: as a peer whose process is restarting
        try:
            with pytest.raises(ConnectionError, match="does not serve"):
                await peers[B.peer_id].open(D.peer_id, NAME)
            assert not any(name.endswith(".pipe") for _, _, name in net.tried)
        finally:
            await net.close()

    asyncio.run(main())
