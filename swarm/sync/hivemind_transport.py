"""The sync's network (:mod:`swarm.sync.transport`) on hivemind: P2P daemon streams, the DHT, the node's loop.

The only module of :mod:`swarm.sync` that touches hivemind's networking: the
rest of the sync sees :class:`~swarm.sync.transport.SyncNet` alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.timed_storage import get_dht_time

from swarm.membership import Membership
from swarm.sync.transport import Handler, Opened, SyncNet

T = TypeVar("T")


class HivemindStreams:
    """Streams on hivemind's P2P daemon: libp2p authenticates the remote peer of every stream."""

    def __init__(self, p2p: P2P) -> None:
        self._p2p = p2p

    async def serve(self, name: str, handler: Handler) -> None:
        async def on_stream(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(info.peer_id.to_base58(), reader, writer)
            except asyncio.CancelledError:
                # the loop stops while a stream is served (a node leaving): end quietly. Re-raised, Python
                # 3.11's stream callback calls exception() on the cancelled task and logs a traceback.
                writer.close()

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def unserve(self, name: str) -> None:
        await self._p2p.remove_binary_stream_handler(name)

    async def open(self, peer: str, name: str) -> Opened:
        info, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer), name)
        addr = getattr(info, "addr", None)
        return Opened(reader, writer, None if addr is None else str(addr))

    async def connect(self, peer: str, addrs: Sequence[str]) -> None:
        # hivemind's P2P has no public connect: its daemon client has
        maddrs = [_Encoded(a) for a in addrs]
        client: Any = self._p2p._client
        await client.connect(PeerID.from_base58(peer), maddrs)


class _Encoded:
    """A multiaddr as the daemon parses it. hivemind's Multiaddr writes a ``/p2p/<id>`` component as a CID,
    which go-libp2p refuses ("length greater than remaining number of bytes"); a relayed address
    (``.../p2p/<relay>/p2p-circuit``) needs the relay's id as a multihash, as the multiaddr spec has it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def to_bytes(self) -> bytes:
        if "/p2p/" not in self.text:
            return bytes(Multiaddr(self.text).to_bytes())
        head, rest = self.text.split("/p2p/", 1)
        peer, _, tail = rest.partition("/")
        digest = bytes(PeerID.from_base58(peer).to_bytes())
        out = bytes(Multiaddr(head).to_bytes()) + _uvarint(P2P_CODE) + _uvarint(len(digest)) + digest
        if tail:
            if tail != "p2p-circuit":
                raise ValueError(f"unsupported multiaddr {self.text}")
            out += _uvarint(CIRCUIT_CODE)
        return out

    def __str__(self) -> str:
        return self.text


P2P_CODE, CIRCUIT_CODE = 0x01A5, 0x0122  # multicodec table: p2p, p2p-circuit


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class HivemindRecords:
    """Records in the node's hivemind DHT (every call bounded; none while the membership has no DHT)."""

    def __init__(self, membership: Membership) -> None:
        self._m = membership

    def get(self, key: str, timeout: float) -> dict[Any, Any]:
        dht = self._m.dht
        if dht is None:
            return {}
        found = dht.get(key, latest=True, return_future=True).result(timeout=timeout)
        if found is None or not isinstance(found.value, dict):
            return {}
        return {sk: v.value for sk, v in found.value.items()}

    def store(self, key: str, subkey: str, value: bytes, ttl: float, timeout: float) -> bool:
        dht = self._m.dht
        if dht is None:
            return False
        fut = dht.store(key, value, get_dht_time() + ttl, subkey=subkey, return_future=True)
        return bool(fut.result(timeout=timeout))

    def addresses(self) -> list[str]:
        return self._m.visible_multiaddrs(latest=True)


class MembershipLoop:
    """The membership's private loop thread (:class:`swarm.loop.LoopThread`)."""

    def __init__(self, membership: Membership) -> None:
        self._m = membership

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        got: T = self._m.run(coro, timeout)
        return got

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        loop = self._m.loop
        if loop is None:  # membership stopped: nothing runs
            coro.close()
            done: concurrent.futures.Future[T] = concurrent.futures.Future()
            done.set_exception(RuntimeError("membership is not started"))
            return done
        return asyncio.run_coroutine_threadsafe(coro, loop.loop)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def hivemind_net(membership: Membership) -> SyncNet:
    """The sync's network of a started ``membership``."""
    return SyncNet(HivemindStreams(membership.p2p), HivemindRecords(membership), MembershipLoop(membership))
