"""Where a round's payload bytes travel: a P2P stream or a direct TCP connection, piece by piece.

A part and the reduced slice that answers it move on the same channel in opposite directions at
once (:mod:`swarm.sync.pieces`), so both sides send and receive concurrently: :func:`both`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import numpy as np

from swarm.sync import direct
from swarm.sync.errors import BadBytes
from swarm.sync.pieces import PIECE_ELEMS, piece_bounds
from swarm.sync.tensors import LITTLE_ENDIAN, Buffer, decode_into, encoded_size
from swarm.sync.wire import CHUNK_BYTES, read_into

T = TypeVar("T")


class Channel(Protocol):
    async def send(self, data: Buffer) -> None: ...

    async def recv_into(self, dest: memoryview, hasher: Any | None) -> None: ...


class StreamChannel:
    """Raw payload bytes on a P2P stream (after a frame header that gave their size)."""

    def __init__(self, reader: asyncio.StreamReader | None, writer: asyncio.StreamWriter, chunk_timeout: float) -> None:
        self._reader, self._writer, self._timeout = reader, writer, chunk_timeout

    async def send(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK_BYTES):
            self._writer.write(view[start : start + CHUNK_BYTES])
            async with asyncio.timeout(self._timeout):  # not wait_for: no task per chunk (swarm.sync.wire)
                await self._writer.drain()

    async def recv_into(self, dest: memoryview, hasher: Any | None) -> None:
        assert self._reader is not None, "a send-only channel"
        await read_into(self._reader, dest, self._timeout, hasher)


class SocketChannel:
    """Payload bytes on a direct TCP connection (:mod:`swarm.sync.direct`)."""

    def __init__(self, sock: socket.socket, chunk_timeout: float) -> None:
        self._sock, self._timeout = sock, chunk_timeout

    async def send(self, data: Buffer) -> None:
        await direct.send(self._sock, data, self._timeout)

    async def recv_into(self, dest: memoryview, hasher: Any | None) -> None:
        await direct.recv_into(self._sock, dest, self._timeout, hasher)


async def recv_piece(
    channel: Channel, out: np.ndarray, compression: str, hasher: Any | None, raw: bytearray | None
) -> None:
    """One encoded piece of ``out.size`` values into ``out`` (BadBytes if any is not finite).

    Uncompressed bytes land in ``out`` itself; compressed ones in ``raw`` (room for a whole piece), then
    are decoded once into ``out``.
    """
    if compression == "none" and LITTLE_ENDIAN:
        await channel.recv_into(out.data.cast("B"), hasher)
        if not bool(np.isfinite(out).all()):
            raise BadBytes("non-finite values received")
        return
    assert raw is not None
    view = memoryview(raw)[: encoded_size(out.size, compression)]
    await channel.recv_into(view, hasher)
    decode_into(view, out, compression)


def piece_buffer(compression: str) -> bytearray | None:
    """Room for one encoded piece as it lands (None: uncompressed pieces land in place)."""
    return None if compression == "none" and LITTLE_ENDIAN else bytearray(encoded_size(PIECE_ELEMS, compression))


async def recv_pieces(channel: Channel, dest: np.ndarray, compression: str, hasher: Any | None) -> None:
    """A whole encoded vector into ``dest``, piece by piece as it streams in."""
    raw = piece_buffer(compression)
    for a, b in piece_bounds(dest.size):
        await recv_piece(channel, dest[a:b], compression, hasher, raw)


async def both(first: Awaitable[T], second: Awaitable[Any]) -> T:
    """Run two coroutines at once; the first's result, or the first error of either (the other cancelled)."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    for t in tasks:  # an error after the other one's must not log "never retrieved"
        t.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and (e := t.exception()) is not None:
                raise e
        await asyncio.gather(*tasks)
        result: T = tasks[0].result()
        return result
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            # wait for them to end: a cancelled socket read unregisters its fd only when it ends, and callers
            # close the socket next; closed first, the fd can belong to a new connection when it does, and
            # asyncio logs "File descriptor N is used by transport" (seen at 100 ms round trips)
            await asyncio.wait(pending)
