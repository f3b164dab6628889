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
            await handler(info.peer_id.to_base58(), reader, writer)

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def unserve(self, name: str) -> None:
        await self._p2p.remove_binary_stream_handler(name)

    async def open(self, peer: str, name: str) -> Opened:
        info, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer), name)
        addr = getattr(info, "addr", None)
        return Opened(reader, writer, None if addr is None else str(addr))

    async def connect(self, peer: str, addrs: Sequence[str]) -> None:
        # hivemind's P2P has no public connect: its daemon client has
        maddrs = [Multiaddr(a) for a in addrs]
        client: Any = self._p2p._client
        await client.connect(PeerID.from_base58(peer), maddrs)


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
        return self._m.visible_multiaddrs()


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
