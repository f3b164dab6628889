"""Serving and fetching sealed payloads over a hivemind binary stream.

Wire format (one request per stream):

* request: the payload's sha256 digest as 64 lowercase hex ASCII bytes;
* response: a 9-byte header ``b"SNP1" | status (1 byte) | length (4 bytes, big endian)``
  followed by ``length`` bytes: the payload when ``status == 0``, or a short
  UTF-8 error message (at most 256 bytes) otherwise.

The client checks the announced length against the descriptor's payload size
and the protocol limit *before* reading the body, reads in chunks, and closes
the stream in every case. A total timeout alone would let a publisher that
dribbles bytes hold a fetch for all of it, so the client also keeps a
:class:`Pace`: the stream must open within ``dial_timeout_s``, the response
header must arrive within ``first_byte_timeout_s``, and after ``grace_s`` the
body must keep up ``min_rate_bps``. Falling behind ends the fetch with
:attr:`FetchFailure.TOO_SLOW`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hivemind.p2p import P2P, PeerID

from protocol import limits

logger = logging.getLogger(__name__)

MAGIC = b"SNP1"
HEADER = struct.Struct(">4sBI")
STATUS_OK, STATUS_ERROR = 0, 1
DIGEST_LEN = 64
MAX_ERROR_BYTES = 256


class FetchFailure(StrEnum):
    """Why a fetch failed; the stable first part of :attr:`FetchError.reason`."""

    UNREACHABLE = "peer unreachable"
    TOO_SLOW = "too slow"
    CLOSED = "stream closed early"
    CONNECTION = "connection failed"
    PEER_ERROR = "peer error"
    BAD_HEADER = "bad response header"
    TOO_LARGE = "payload too large"
    SIZE_MISMATCH = "size mismatch"


class FetchError(Exception):
    """A fetch failed: ``kind`` to act on, ``reason`` (kind and detail, short) to count and log."""

    def __init__(self, kind: FetchFailure, detail: str = "") -> None:
        self.kind = kind
        self.reason = f"{kind.value}: {detail}" if detail else kind.value
        super().__init__(self.reason)


@dataclass(frozen=True)
class Pace:
    """How fast a publisher must answer; see the module docstring."""

    dial_timeout_s: float = 2.0
    first_byte_timeout_s: float = 1.0
    min_rate_bps: float = 64 * 1024
    grace_s: float = 1.0

    def budget_s(self, size: int) -> float:
        """Longest a fetch of ``size`` bytes can take while keeping pace (each phase at its limit).

        >>> Pace(2.0, 1.0, 1000.0, 1.0).budget_s(3000)
        7.0
        """
        return self.dial_timeout_s + self.first_byte_timeout_s + self.grace_s + size / self.min_rate_bps

    def body_deadline(self, header_at: float, received: int) -> float:
        """When the body falls below the minimum rate if no more than ``received`` bytes have arrived.

        The first ``grace_s`` after the header are free (slow start, one
        scheduling hiccup); after that ``received`` must stay at or above
        ``min_rate_bps * (t - header_at - grace_s)``.

        >>> Pace(min_rate_bps=1000.0, grace_s=1.0).body_deadline(10.0, 500)
        11.5
        """
        return header_at + self.grace_s + received / self.min_rate_bps


DEFAULT_PACE = Pace()

Fallback = Callable[[str, str, int, float], Awaitable[bytes]]
"""(publisher, digest, size, seconds left) -> the payload by another way (a relay), or raises FetchError."""


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


async def fetch_one(
    p2p: P2P,
    peer_id: str,
    handler: str,
    digest: str,
    expected_size: int,
    chunk_bytes: int,
    pace: Pace = DEFAULT_PACE,
    request: bytes | None = None,
) -> bytes:
    """Fetch the payload ``digest`` from ``peer_id`` at ``pace`` or better; raise FetchError with a reason.

    A total bound is still the caller's (``asyncio.wait_for``); ``pace`` ends a
    fetch early when its publisher is silent or slow. ``request`` replaces the
    digest as the bytes sent (a relay's request: :mod:`swarm.payload_relay`).
    """
    try:
        call = p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), handler)
        _, reader, writer = await asyncio.wait_for(call, pace.dial_timeout_s)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        raise FetchError(FetchFailure.UNREACHABLE, f"no stream within {pace.dial_timeout_s:g} s") from None
    except Exception as e:
        raise FetchError(FetchFailure.UNREACHABLE, _short(e)) from None
    try:
        writer.write(digest.encode("ascii") if request is None else request)
        await writer.drain()
        return await _read_response(reader, expected_size, chunk_bytes, pace)
    except asyncio.IncompleteReadError as e:
        raise FetchError(FetchFailure.CLOSED, f"{len(e.partial)} bytes of a frame") from None
    except (ConnectionError, OSError) as e:
        raise FetchError(FetchFailure.CONNECTION, _short(e)) from None
    finally:
        writer.close()


async def fetch_many(
    p2p: P2P,
    handler: str,
    wanted: Sequence[tuple[str, str, int]],
    *,
    budget_s: float,
    parallel: int,
    chunk_bytes: int,
    pace: Pace = DEFAULT_PACE,
    cap_s: float = math.inf,
    fallback: Fallback | None = None,
    relay_first: Callable[[str], bool] = lambda _peer: False,
) -> dict[tuple[str, str], bytes | FetchError]:
    """Fetch each ``(peer_id, digest, size)`` in ``wanted``, at most ``parallel`` at once, within ``budget_s``.

    Each fetch ends at ``pace.budget_s(size)`` (at most ``cap_s``) with
    :attr:`FetchFailure.TOO_SLOW`, so no single straggler holds the rest.
    Returns the bytes or the error per ``(peer_id, digest)``: two peers that
    name one digest are two fetches, so neither answer stands for the other's.
    Fetches still running when ``budget_s`` ends are absent (the caller's own
    deadline, no fault of theirs). A publisher that cannot be reached is tried
    once more through ``fallback`` (a relay), in the time its fetch has left; one for
    which ``relay_first`` says so (its last fetch needed the relay) goes there at once,
    and is dialled directly only if the relay fails.
    """
    slots = asyncio.Semaphore(parallel)

    async def one(peer_id: str, digest: str, size: int) -> bytes | FetchError:
        async with slots:
            limit = min(cap_s, pace.budget_s(size))
            end = asyncio.get_running_loop().time() + limit
            if fallback is not None and relay_first(peer_id):
                relayed = await _bounded(fallback(peer_id, digest, size, limit), limit)
                if isinstance(relayed, bytes):
                    return relayed
                limit = end - asyncio.get_running_loop().time()
                if limit <= 0:
                    return relayed
                return await _bounded(fetch_one(p2p, peer_id, handler, digest, size, chunk_bytes, pace), limit)
            result = await _bounded(fetch_one(p2p, peer_id, handler, digest, size, chunk_bytes, pace), limit)
            left = end - asyncio.get_running_loop().time()
            if fallback is None or not isinstance(result, FetchError) or result.kind is not FetchFailure.UNREACHABLE:
                return result
            relayed = await _bounded(fallback(peer_id, digest, size, left), left) if left > 0 else result
            return relayed if isinstance(relayed, bytes) else result

    tasks = {(peer, digest): asyncio.create_task(one(peer, digest, size)) for peer, digest, size in wanted}
    if not tasks:
        return {}
    done, pending = await asyncio.wait(tasks.values(), timeout=budget_s)
    for task in pending:
        task.cancel()
    return {key: task.result() for key, task in tasks.items() if task in done}


async def _bounded(coro: Awaitable[bytes], limit: float) -> bytes | FetchError:
    """``coro``'s bytes, or its failure as a FetchError (never raises: one bad peer never breaks the others)."""
    try:
        return await asyncio.wait_for(coro, limit)
    except TimeoutError:
        return FetchError(FetchFailure.TOO_SLOW, f"no payload within {limit:.1f} s")
    except FetchError as e:
        return e
    except Exception as e:
        return FetchError(FetchFailure.CONNECTION, f"{type(e).__name__}: {_short(e)}")


async def _read_response(reader: asyncio.StreamReader, expected_size: int, chunk_bytes: int, pace: Pace) -> bytes:
    wait = pace.first_byte_timeout_s
    raw = await _within(reader.readexactly(HEADER.size), wait, f"no response within {wait:g} s")
    magic, status, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FetchError(FetchFailure.BAD_HEADER)
    if status != STATUS_OK:
        if length > MAX_ERROR_BYTES:
            raise FetchError(FetchFailure.PEER_ERROR, f"error reply of {length} bytes is too long")
        message = await _within(reader.readexactly(length), pace.grace_s, "error reply cut off")
        raise FetchError(FetchFailure.PEER_ERROR, message.decode(errors="replace"))
    if length > expected_size or length > limits.MAX_PAYLOAD_BYTES:
        raise FetchError(FetchFailure.TOO_LARGE, f"peer announced {length} bytes, descriptor says {expected_size}")
    if length != expected_size:
        raise FetchError(FetchFailure.SIZE_MISMATCH, f"peer announced {length} bytes, descriptor says {expected_size}")
    return await _read_body(reader, length, chunk_bytes, pace)


async def _read_body(reader: asyncio.StreamReader, length: int, chunk_bytes: int, pace: Pace) -> bytes:
    loop = asyncio.get_running_loop()
    header_at = loop.time()
    buf = bytearray()
    try:
        # one timeout, pushed back as bytes arrive: cheaper than a wait_for per read
        async with asyncio.timeout_at(pace.body_deadline(header_at, 0)) as cutoff:
            while len(buf) < length:
                chunk = await reader.read(min(chunk_bytes, length - len(buf)))
                if not chunk:
                    raise FetchError(FetchFailure.CLOSED, f"after {len(buf)} of {length} bytes")
                buf += chunk
                cutoff.reschedule(pace.body_deadline(header_at, len(buf)))
    except TimeoutError:
        took = loop.time() - header_at
        detail = f"{len(buf)} of {length} bytes in {took:.1f} s, below {pace.min_rate_bps:.0f} B/s"
        raise FetchError(FetchFailure.TOO_SLOW, detail) from None
    return bytes(buf)


async def _within(aw: Awaitable[bytes], timeout: float, detail: str) -> bytes:
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise FetchError(FetchFailure.TOO_SLOW, detail) from None


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:160]
