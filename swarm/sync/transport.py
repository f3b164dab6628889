"""What the outer sync needs of the network: streams, a record store and a loop to run them on.

The sync's rules and its round never name hivemind: they take a :class:`SyncNet`
and call only these protocols. :mod:`swarm.sync.hivemind_transport` implements
them on hivemind's P2P daemon and DHT (what a node runs); a test implements
them in memory, on a virtual clock, with faults as rules of that network
(``tests/simnet.py``), so the composed sync runs thousands of times faster than
over daemons and every fault is one line of a scenario.

Stream handlers and stream ends run on the loop of :class:`Loop`; record-store
calls and :meth:`Loop.run` block the calling (sync) thread, each bounded by
its timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Handler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""A served stream: (the remote peer's id, as the connection authenticated it, its reader, its writer)."""


@dataclass(frozen=True)
class Opened:
    """A stream this peer opened: its two ends, and the remote address of the connection it runs on."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    addr: str | None = None
    """The connection's remote multiaddr (a direct connection's host is dialled for payloads); None if unknown."""


class Streams(Protocol):
    """Authenticated byte streams between peers, by handler name (runs on the loop)."""

    async def serve(self, name: str, handler: Handler) -> None:
        """Answer streams opened to this peer under ``name`` with ``handler``."""
        ...

    async def unserve(self, name: str) -> None:
        """Stop answering ``name`` (streams already open go on)."""
        ...

    async def open(self, peer: str, name: str) -> Opened:
        """A new stream to ``peer``'s handler ``name`` (raises when it cannot be reached)."""
        ...

    async def connect(self, peer: str, addrs: Sequence[str]) -> None:
        """Connect to ``peer`` through ``addrs`` (the multiaddrs it published), so later opens find a route."""
        ...


class RecordStore(Protocol):
    """A shared store of small records: key -> subkey -> value, each value with its own lifetime (blocking)."""

    def get(self, key: str, timeout: float) -> dict[Any, Any]:
        """The live values under ``key``, by subkey ({} if none); raises when the read fails."""
        ...

    def store(self, key: str, subkey: str, value: bytes, ttl: float, timeout: float) -> bool:
        """Store ``value`` under (``key``, ``subkey``) for ``ttl`` s; whether it got out (raises on failure)."""
        ...

    def addresses(self) -> list[str]:
        """This peer's multiaddrs as others can dial them (with ``/p2p/<id>``)."""
        ...


class Loop(Protocol):
    """The loop the streams run on, driven from sync code."""

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait for it; TimeoutError (and ``coro`` cancelled) after ``timeout`` s."""
        ...

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its future (a stopped loop: one that failed already)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread ``seconds`` of the network's time."""
        ...


@dataclass(frozen=True)
class SyncNet:
    """Everything one peer's sync uses of the network."""

    streams: Streams
    records: RecordStore
    loop: Loop
