"""One slice reduced piece by piece while its members' parts stream in: the owner's side of a round.

Why: a reducer that waits for every whole part, and members that wait for the whole reduced slice,
leave a link idle at two barriers (the slowest sender's last byte, then the reduction): on a
100 Mbit/s link, half again the time the bytes need (bench/RESULTS.md, "Outer sync on a limited
link"). Here the owner reduces piece ``k`` (``PIECE_ELEMS`` values) as soon as every contributing
member's piece ``k`` has landed and sends it back at once, so the reduce-scatter and the all-gather
overlap. A sender's piece waits in one of
``WINDOW`` slots until it is reduced; the TCP window holds back the rest. So the owner holds a few
MiB per sender, not a slice each.

The rule is a whole slice's (:mod:`swarm.sync.robust`): every part's header claims its norm, and
each part is clipped by the bound those claims give. The owner recomputes each norm as the pieces
land, block by block as :func:`swarm.sync.robust.norm` does, so an honest claim matches to the bit.
A false claim, or a direct payload that does not match its sha256, fails the round before the last
piece is reduced: no member completes a slice built on it. Coordinate-wise rules give the same bits
as on the whole slice; ``centered_clip`` runs per piece (its radius is a piece's).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.errors import BadBytes, GroupMismatch
from swarm.sync.robust import NORM_BLOCK, Suspicion, aggregate, clamp_weights, clip_plan, norm, square_sum
from swarm.sync.tensors import LITTLE_ENDIAN, Buffer, decode_into, encode_view, encoded_size

logger = logging.getLogger(__name__)

PIECE_ELEMS = NORM_BLOCK
"""Values per piece (1 MiB of float32; a multiple of int8's scale chunk, and the norm's block, so a norm
summed piece by piece is the whole part's to the bit)."""
WINDOW = 4
"""Pieces of one sender held at once, waiting for the others' pieces of the same range."""


def piece_bounds(n: int) -> list[tuple[int, int]]:
    """Ranges of ``PIECE_ELEMS`` values covering ``n`` (one empty range for ``n == 0``).

    >>> piece_bounds(PIECE_ELEMS + 1)[-1] == (PIECE_ELEMS, PIECE_ELEMS + 1), len(piece_bounds(0))
    (True, 1)
    """
    return [(a, min(n, a + PIECE_ELEMS)) for a in range(0, max(n, 1), PIECE_ELEMS)]


@dataclass(frozen=True)
class Part:
    """A member's part of one slice as it goes out, encoded piece by piece as it is sent (a compressed part is
    never held whole), with the sha256 of its bytes and the norm its owner will compute of it (the header's
    claim). ``source`` must not change until it is sent."""

    source: torch.Tensor | None
    """The part's values (None: no part, weight 0)."""
    compression: str
    digest: bytes
    claim: float | None

    @classmethod
    def of(cls, source: torch.Tensor | None, compression: str, digest: bool) -> Part:
        """The part of ``source``: one pass over its encoded pieces for the claim and (if ``digest``) the sha256."""
        hasher = hashlib.sha256()
        if source is None:
            return cls(None, compression, hasher.digest(), None)
        part = cls(source, compression, b"", None)
        if compression == "none" and LITTLE_ENDIAN:  # the pieces are views of the values themselves
            claim = norm(source)
            for data in part.pieces() if digest else ():
                hasher.update(data)
        else:
            scratch, squares = np.empty(min(source.numel(), PIECE_ELEMS), dtype=np.float32), 0.0
            for (a, b), data in zip(piece_bounds(source.numel()), part.pieces(), strict=True):
                hasher.update(data)
                decode_into(data, scratch[: b - a], compression)
                squares += square_sum(scratch[: b - a])
            claim = math.sqrt(squares)
        return cls(source, compression, hasher.digest() if digest else b"", claim)

    def pieces(self) -> Iterator[Buffer]:
        """The part's bytes on the wire, one encoded piece at a time."""
        if self.source is not None:
            for a, b in piece_bounds(self.source.numel()):
                yield encode_view(self.source[a:b], self.compression)

    @property
    def size(self) -> int:
        return 0 if self.source is None else encoded_size(self.source.numel(), self.compression)


@dataclass
class _Part:
    weight: int
    claim: float
    rows: list[np.ndarray]
    """``WINDOW`` slots of one piece each (piece ``k`` in slot ``k % WINDOW``)."""
    arrived: int = 0
    squares: float = 0.0
    verified: bool = False


class SliceReduction:
    """The owner's reduction of slice ``index``: parts join, pieces land, reduced pieces come out in order.

    ``dest`` receives the reduced slice as every member decodes it (the owner's own share of the average).
    All methods run on one event loop; the arithmetic runs in its default executor.
    """

    def __init__(
        self,
        members: Sequence[str],
        me: str,
        n: int,
        compression: str,
        rule: tuple[str, float, float, float],
        dest: np.ndarray,
        remaining: Callable[[], float],
        log_prefix: str = "",
    ) -> None:
        self.members, self.me, self.n, self.compression = tuple(members), me, n, compression
        self.aggregator, self.trim_fraction, self.clip_factor, self.max_weight_ratio = rule
        self.pieces = piece_bounds(n)
        self._dest, self._remaining, self._log = dest, remaining, log_prefix
        self._parts: dict[str, _Part | None] = {}
        self._scales: dict[str, float] | None = None
        self._capped: list[float] = []
        self.flagged: dict[str, Suspicion] = {}
        self.bound: float | None = None
        self.produced = 0
        self.digest = b""
        """sha256 of the whole reduced slice's bytes (set once the last piece is out)."""
        self._hasher = hashlib.sha256()
        # uncompressed, the reduced bytes are the owner's share of the average itself
        self._inplace = compression == "none" and LITTLE_ENDIAN
        room = dest.data if self._inplace else memoryview(bytearray(encoded_size(n, compression)))
        self._result = room.cast("B")
        self._error: SyncAborted | None = None
        self._changed = asyncio.Event()
        """Set (and replaced) whenever anything a waiter may wait for changed."""

    # ---- what the stream handlers call ---------------------------------------------------------

    def join(self, peer: str, weight: int, claim: float | None) -> None:
        """Register ``peer``'s part: its weight (0: no part) and its claimed norm."""
        if peer not in self.members:
            raise GroupMismatch(f"{peer[-6:]} is not a member")
        if peer in self._parts:
            raise GroupMismatch(f"second part from {peer[-6:]}")
        if weight and (claim is None or not np.isfinite(claim) or claim < 0):
            raise BadBytes("a part without a finite norm")
        slots = [np.empty(b - a, dtype=np.float32) for a, b in self.pieces[:WINDOW]] if weight else []
        self._parts[peer] = _Part(weight, float(claim or 0.0), slots) if weight else None
        self._notify()

    async def slot(self, peer: str, k: int) -> np.ndarray:
        """The array piece ``k`` of ``peer``'s part lands in, once its slot is free."""
        await self._wait(lambda: k < self.produced + WINDOW)
        part = self._parts[peer]
        assert part is not None
        return part.rows[k % WINDOW][: self.pieces[k][1] - self.pieces[k][0]]

    def landed(self, peer: str, k: int) -> None:
        """Piece ``k`` of ``peer``'s part is in its slot (decoded and finite)."""
        part = self._parts[peer]
        assert part is not None and part.arrived == k
        part.squares += square_sum(part.rows[k % WINDOW][: self.pieces[k][1] - self.pieces[k][0]])
        part.arrived = k + 1
        self._notify()

    def complete(self, peer: str) -> None:
        """Every piece of ``peer``'s part landed and its bytes checked out: its claimed norm is checked now."""
        part = self._parts[peer]
        if part is None:
            return
        sent = math.sqrt(part.squares)
        if sent != part.claim:
            self.flagged[peer] = Suspicion.GARBAGE_PART
            logger.warning("%s %s claimed norm %.6g, sent %.6g", self._log, peer[-6:], part.claim, sent)
            self.fail(f"{peer[-6:]} claimed a false norm", AbortCause.BAD_BYTES)
            return
        part.verified = True
        self._notify()

    async def piece(self, k: int) -> Buffer:
        """The bytes of reduced piece ``k`` (waits for it; SyncAborted if the round failed)."""
        await self._wait(lambda: self.produced > k)
        a, b = self._encoded_range(k)
        return self._result[a:b]

    async def done(self) -> None:
        await self._wait(lambda: self.produced == len(self.pieces))

    def fail(self, reason: str, cause: AbortCause = AbortCause.ALLREDUCE_FAILED) -> None:
        if self._error is None:
            self._error = SyncAborted(reason, cause)
        self._notify()

    @property
    def failed(self) -> SyncAborted | None:
        return self._error

    # ---- the reducer ---------------------------------------------------------------------------

    async def run(self, on_done: Callable[[], object] | None = None) -> None:
        """Reduce every piece in order as its parts land (fails the reduction on any error)."""
        loop = asyncio.get_running_loop()
        try:
            await self._wait(lambda: len(self._parts) == len(self.members))
            self._plan_clipping()
            for k in range(len(self.pieces)):
                last = k == len(self.pieces) - 1
                await self._wait(lambda k=k, last=last: self._ready(k, last))  # type: ignore[misc]
                await loop.run_in_executor(None, self._reduce, k)
                if last:
                    self.digest = self._hasher.digest()
                self.produced = k + 1
                self._notify()
            if on_done is not None:
                on_done()
        except SyncAborted as e:
            self.fail(e.reason, e.cause)
        except Exception as e:  # the arithmetic of a peer's values must never crash the service
            self.fail(f"reduction failed: {type(e).__name__}")

    def _ready(self, k: int, last: bool) -> bool:
        parts = [p for p in self._parts.values() if p is not None]
        return all(p.arrived > k for p in parts) and (not last or all(p.verified for p in parts))

    def _contributing(self) -> list[tuple[str, _Part]]:
        return [(peer, part) for peer in self.members if (part := self._parts.get(peer)) is not None]

    def _plan_clipping(self) -> None:
        given = self._contributing()
        own = next((p.claim for peer, p in given if peer == self.me), None)
        self.bound, self._scales, self.flagged = clip_plan(
            [(peer, p.claim) for peer, p in given], own, self.clip_factor
        )
        weights = [p.weight for _, p in given]
        self._capped = clamp_weights(weights, self.max_weight_ratio)
        for (peer, p), kept in zip(given, self._capped, strict=True):
            if kept < p.weight:  # may be honest (a much faster peer): logged, not a suspicion
                logger.info("%s %s claims %d inner steps, counted as %.4g", self._log, peer[-6:], p.weight, kept)
        for peer, why in self.flagged.items():
            part = self._parts[peer]
            claimed = part.claim if part else 0.0
            bound = self.bound
            logger.warning("%s %s from %s (norm %.3g > bound %.3g)", self._log, why.value, peer[-6:], claimed, bound)

    def _reduce(self, k: int) -> None:
        a, b = self.pieces[k]
        given = self._contributing()
        scales = self._scales or {}
        rows = [_scaled(p.rows[k % WINDOW][: b - a], scales.get(peer)) for peer, p in given]
        value = reduce_piece(rows, b - a, self.aggregator, self.trim_fraction, self._capped)
        out = self._dest[a:b]
        lo, hi = self._encoded_range(k)
        if self._inplace:
            np.copyto(out, value)
            if not bool(np.isfinite(out).all()):
                raise BadBytes("reduced piece not finite")
        else:
            data = encode_view(torch.from_numpy(value), self.compression)
            self._result[lo:hi] = memoryview(data).cast("B")
            decode_into(self._result[lo:hi], out, self.compression)
        self._hasher.update(self._result[lo:hi])

    # ---- plumbing --------------------------------------------------------------------------------

    def _encoded_range(self, k: int) -> tuple[int, int]:
        a, b = self.pieces[k]
        start = (a // PIECE_ELEMS) * encoded_size(PIECE_ELEMS, self.compression)
        return start, start + encoded_size(b - a, self.compression)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while self._error is None and not ready():
            changed = self._changed
            try:
                # asyncio.timeout, not wait_for: no task per wake-up, and a cancel is never lost (Python 3.11's
                # wait_for returns normally when the event is set as its waiter is cancelled, and this loop would
                # then wait on to the deadline: channel.both awaits it)
                async with asyncio.timeout(self._remaining()):
                    await changed.wait()
            except TimeoutError:
                self.fail("all-reduce timeout", AbortCause.ALLREDUCE_TIMEOUT)
        if self._error is not None:
            raise self._error


def _scaled(row: np.ndarray, scale: float | None) -> np.ndarray:
    """A part's piece clipped as :func:`swarm.sync.robust.clip_to` clips the whole part (the same float32 multiply)."""
    return row if scale is None else np.multiply(row, np.float32(scale))


def reduce_piece(rows: list[np.ndarray], n: int, rule: str, trim_fraction: float, weights: list[float]) -> np.ndarray:
    """One piece of the clipped parts combined with ``rule`` (member order)."""
    parts = [torch.from_numpy(r) for r in rows]
    out = aggregate(parts, n, rule, trim_fraction, weights if rows else None)
    return out.numpy()
