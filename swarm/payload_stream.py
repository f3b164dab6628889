"""Serving and fetching sealed payloads over a hivemind binary stream.

Wire format (one request per stream):

* request: the payload's sha256 digest as 64 lowercase hex ASCII bytes;
* response: a 9-byte header ``b"SNP1" | status (1 byte) | length (4 bytes, big endian)``
  followed by ``length`` bytes: the payload when ``status == 0``, or a short
  UTF-8 error message (at most 256 bytes) otherwise.

The client checks the announced length against the descriptor's payload size
and the protocol limit *before* reading the body, reads in chunks, and closes
the stream in every case. Timeouts are the caller's (``asyncio.wait_for``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

from hivemind.p2p import P2P, PeerID

from protocol import limits

logger = logging.getLogger(__name__)

MAGIC = b"SNP1"
HEADER = struct.Struct(">4sBI")
STATUS_OK, STATUS_ERROR = 0, 1
DIGEST_LEN = 64
MAX_ERROR_BYTES = 256


class FetchError(Exception):
    """A fetch failed; ``reason`` is short and stable (used as the rejection reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def error_frame(message: str) -> bytes:
    body = message.encode()[:MAX_ERROR_BYTES]
    return HEADER.pack(MAGIC, STATUS_ERROR, len(body)) + body


async def serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    lookup: Callable[[str], bytes | None],
    chunk_bytes: int,
) -> int:
    """Answer one request on an accepted stream; return the payload bytes sent (0 on error reply)."""
    request = await reader.readexactly(DIGEST_LEN)
    digest = request.decode("ascii", errors="replace")
    payload = lookup(digest)
    if payload is None:
        writer.write(error_frame(f"unknown digest {digest[:12]}"))
        await writer.drain()
        return 0
    writer.write(HEADER.pack(MAGIC, STATUS_OK, len(payload)))
    view = memoryview(payload)
    for start in range(0, len(payload), chunk_bytes):
        writer.write(view[start : start + chunk_bytes])
        await writer.drain()
    return len(payload)


async def fetch_one(p2p: P2P, peer_id: str, handler: str, digest: str, expected_size: int, chunk_bytes: int) -> bytes:
    """Fetch the payload ``digest`` from ``peer_id``; raise FetchError with a reason."""
    try:
        _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), handler)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        raise FetchError(f"peer unreachable: {_short(e)}") from None
    try:
        writer.write(digest.encode("ascii"))
        await writer.drain()
        return await _read_response(reader, expected_size, chunk_bytes)
    except asyncio.IncompleteReadError as e:
        raise FetchError(f"stream closed early ({len(e.partial)} bytes of a frame)") from None
    except (ConnectionError, OSError) as e:
        raise FetchError(f"connection failed: {_short(e)}") from None
    finally:
        writer.close()


async def _read_response(reader: asyncio.StreamReader, expected_size: int, chunk_bytes: int) -> bytes:
    magic, status, length = HEADER.unpack(await reader.readexactly(HEADER.size))
    if magic != MAGIC:
        raise FetchError("bad response header")
    if status != STATUS_OK:
        if length > MAX_ERROR_BYTES:
            raise FetchError(f"peer error reply of {length} bytes is too long")
        message = (await reader.readexactly(length)).decode(errors="replace")
        raise FetchError(f"peer error: {message}")
    if length > expected_size or length > limits.MAX_PAYLOAD_BYTES:
        raise FetchError(f"payload too large: peer announced {length} bytes, descriptor says {expected_size}")
    if length != expected_size:
        raise FetchError(f"size mismatch: peer announced {length} bytes, descriptor says {expected_size}")
    buf = bytearray()
    while len(buf) < length:
        chunk = await reader.read(min(chunk_bytes, length - len(buf)))
        if not chunk:
            raise FetchError(f"stream closed after {len(buf)} of {length} bytes")
        buf += chunk
    return bytes(buf)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:160]
