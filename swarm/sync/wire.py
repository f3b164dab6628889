"""Framing on P2P binary streams: a small msgpack header, then a raw payload moved in 1 MiB chunks.

Frame: 4-byte big-endian header length, msgpack header map (<= 4 KiB) with a
``size`` field, then exactly ``size`` payload bytes. Every header and every
chunk is read and written under a timeout, so a silent or stalled peer costs
at most ``chunk_timeout`` per chunk (and callers bound the whole exchange).
Each timeout is an ``asyncio.timeout`` around the await itself, not a
``wait_for``: no task, waiter and callbacks per chunk, and a read whose bytes
are buffered already does not wait for a loop iteration.
"""

from __future__ import annotations

import asyncio
from typing import Any

from protocol import codec
from protocol.errors import MessageRejected
from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.errors import BadBytes, PeerLost
from swarm.sync.tensors import Buffer

MAX_HEADER_BYTES = 4096
CHUNK_BYTES = 1 << 20
MAX_WEIGHT = (1 << 31) - 1
"""Largest inner-step count a part may claim (reducers cap claims far lower: ``max_weight_ratio``)."""


async def write_frame(
    writer: asyncio.StreamWriter, header: dict[str, Any], payload: Buffer, chunk_timeout: float
) -> int:
    """Write one frame; return the number of bytes written."""
    head_bytes = await write_head(writer, header, len(payload), chunk_timeout)
    view = memoryview(payload)
    for start in range(0, len(view), CHUNK_BYTES):
        writer.write(view[start : start + CHUNK_BYTES])
        async with asyncio.timeout(chunk_timeout):
            await writer.drain()
    return head_bytes + len(payload)


async def write_head(writer: asyncio.StreamWriter, header: dict[str, Any], size: int, chunk_timeout: float) -> int:
    """Write a frame's header alone, announcing ``size`` payload bytes that the caller writes next."""
    head = codec.pack({**header, "size": size})
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    writer.write(len(head).to_bytes(4, "big") + head)
    async with asyncio.timeout(chunk_timeout):
        await writer.drain()
    return 4 + len(head)


async def read_header(reader: asyncio.StreamReader, timeout: float) -> dict[str, Any]:
    """Read one frame header (BadBytes if malformed or oversized)."""
    try:
        async with asyncio.timeout(timeout):
            raw_len = await reader.readexactly(4)
        n = int.from_bytes(raw_len, "big")
        if n > MAX_HEADER_BYTES:
            raise BadBytes(f"frame header of {n} bytes exceeds {MAX_HEADER_BYTES}")
        async with asyncio.timeout(timeout):
            raw = await reader.readexactly(n)
        header = codec.unpack(raw, MAX_HEADER_BYTES)
    except asyncio.IncompleteReadError:
        raise PeerLost("stream closed before a frame header") from None
    except MessageRejected as e:
        raise BadBytes(e.reason) from None
    if not isinstance(header, dict) or not isinstance(header.get("size"), int) or header["size"] < 0:
        raise BadBytes("frame header is not a map with a size")
    return header


async def read_payload(reader: asyncio.StreamReader, size: int, chunk_timeout: float) -> bytes:
    """Read exactly ``size`` payload bytes, chunk by chunk, each under ``chunk_timeout``."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    try:
        while got < size:
            n = min(CHUNK_BYTES, size - got)
            async with asyncio.timeout(chunk_timeout):
                view[got : got + n] = await reader.readexactly(n)
            got += n
    except asyncio.IncompleteReadError:
        raise PeerLost(f"stream closed after {got} of {size} payload bytes") from None
    return bytes(buf)


async def read_into(
    reader: asyncio.StreamReader, dest: memoryview, chunk_timeout: float, hasher: Any | None = None
) -> None:
    """Read exactly ``len(dest)`` payload bytes into ``dest`` (no intermediate buffer), chunk by chunk,
    each under ``chunk_timeout``, feeding each chunk to ``hasher.update`` as it arrives."""
    size, got = len(dest), 0
    try:
        while got < size:
            async with asyncio.timeout(chunk_timeout):
                chunk = await reader.readexactly(min(CHUNK_BYTES, size - got))
            dest[got : got + len(chunk)] = chunk
            if hasher is not None:
                hasher.update(chunk)
            got += len(chunk)
    except asyncio.IncompleteReadError:
        raise PeerLost(f"stream closed after {got} of {size} payload bytes") from None


def check_weight(value: Any) -> int:
    """A part header's ``weight``: the sender's inner steps since its anchor, 0 for no part (BadBytes if not).

    >>> check_weight(12), check_weight(0)
    (12, 0)
    """
    # bool is an int in Python (and msgpack keeps it apart): refused, as is anything unbounded
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WEIGHT:
        raise BadBytes(f"weight must be an int in [0, {MAX_WEIGHT}]")
    return value


async def send_error(writer: asyncio.StreamWriter, reason: str, chunk_timeout: float) -> None:
    """Best effort: tell the other side why, then give up quietly."""
    try:
        await write_frame(writer, {"ok": False, "error": reason[:200]}, b"", chunk_timeout)
    except Exception:
        pass


def check_ok(header: dict[str, Any]) -> None:
    """Raise the remote side's error if its reply header says it failed."""
    if header.get("ok") is not True:
        raise SyncAborted(f"peer refused: {str(header.get('error', 'no reason'))[:200]}", AbortCause.PEER_REFUSED)
