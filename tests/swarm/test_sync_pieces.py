"""A slice reduced piece by piece (swarm/sync/pieces.py): the whole slice's bits and flags, a bounded
window per sender, and a false norm claim caught before any member can complete the slice."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
import torch

from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.pieces import PIECE_ELEMS, WINDOW, Part, SliceReduction, piece_bounds
from swarm.sync.robust import Suspicion, norm, reduce_slice, square_sum
from swarm.sync.tensors import decode_into, encoded_size

N = 3 * PIECE_ELEMS + 12_345
MEMBERS = ("a", "b", "c", "d")


def _parts(scale_of_d: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    parts = {m: torch.randn(N, generator=g) for m in MEMBERS}
    parts["d"] = parts["d"] * scale_of_d
    return parts


def _reduction(rule: str, compression: str = "none", remaining: float = 30.0) -> tuple[SliceReduction, np.ndarray]:
    dest = np.empty(N, dtype=np.float32)
    end = time.monotonic() + remaining
    red = SliceReduction(
        MEMBERS, "a", N, compression, (rule, 0.25, 4.0, 4.0), dest, lambda: max(0.01, end - time.monotonic())
    )
    return red, dest


async def _feed(
    red: SliceReduction, peer: str, part: torch.Tensor, compression: str, claim: float | None = None
) -> None:
    """What a receiving stream does: join with the claimed norm, land every piece in its slot, complete."""
    sent = Part.of(part, compression, digest=False)
    red.join(peer, 3, sent.claim if claim is None else claim)
    for k, data in enumerate(sent.pieces()):
        decode_into(data, await red.slot(peer, k), compression)
        red.landed(peer, k)
        await asyncio.sleep(0)  # interleave the senders
    red.complete(peer)


async def _reduce_all(red: SliceReduction, parts: dict[str, torch.Tensor], compression: str = "none") -> None:
    runner = asyncio.ensure_future(red.run())
    await asyncio.gather(*(_feed(red, p, parts[p], compression) for p in MEMBERS))
    await red.done()
    await runner


@pytest.mark.parametrize("rule", ["mean", "median", "trimmed_mean"])
def test_coordinate_rules_give_the_whole_slices_bits_and_flags(rule: str) -> None:
    parts = _parts(scale_of_d=40.0)  # d is clipped (and flagged as garbage: 40x the median norm)
    whole = reduce_slice([(p, parts[p]) for p in MEMBERS], parts["a"], N, rule, 0.25, 4.0, [3] * 4, 4.0)

    async def body() -> None:
        red, dest = _reduction(rule)
        await _reduce_all(red, parts)
        assert dest.tobytes() == whole.value.numpy().tobytes()
        assert red.flagged == whole.flagged == {"d": Suspicion.GARBAGE_PART}
        assert red.bound == whole.bound

    asyncio.run(body())


def test_centered_clip_runs_per_piece() -> None:
    parts = _parts()

    async def body() -> None:
        red, dest = _reduction("centered_clip")
        await _reduce_all(red, parts)
        for a, b in piece_bounds(N):
            piece = reduce_slice([(p, parts[p][a:b]) for p in MEMBERS], None, b - a, "centered_clip", 0.25, 4.0)
            assert dest[a:b].tobytes() == piece.value.numpy().tobytes()

    asyncio.run(body())


@pytest.mark.parametrize("compression", ["fp16", "int8"])
def test_compressed_pieces_are_the_bytes_every_member_decodes(compression: str) -> None:
    parts = _parts()

    async def body() -> None:
        red, dest = _reduction("mean", compression)
        await _reduce_all(red, parts, compression)
        sent = bytearray()
        for k in range(len(red.pieces)):
            sent += await red.piece(k)
        assert len(sent) == encoded_size(N, compression)
        decoded = np.empty(N, dtype=np.float32)
        for (a, b), (lo, hi) in zip(piece_bounds(N), _offsets(compression), strict=True):
            decode_into(memoryview(sent)[lo:hi], decoded[a:b], compression)
        assert decoded.tobytes() == dest.tobytes()  # the owner's share is what the others decode

    asyncio.run(body())


def _offsets(compression: str) -> list[tuple[int, int]]:
    out, at = [], 0
    for a, b in piece_bounds(N):
        out.append((at, at + encoded_size(b - a, compression)))
        at += encoded_size(b - a, compression)
    return out


def test_a_norm_summed_piece_by_piece_is_the_whole_norm_to_the_bit() -> None:
    x = torch.randn(N + 7, generator=torch.Generator().manual_seed(3))[7:]  # a view at an odd offset
    assert Part.of(x, "int8", digest=False).claim == norm(torch.from_numpy(_decoded(x, "int8")))
    assert Part.of(x, "none", digest=False).claim == norm(x)
    summed = 0.0
    for a, b in piece_bounds(N):  # as the owner sums them: the blocks of the pieces as they land
        summed += square_sum(x[a:b].numpy())
    assert math.sqrt(summed) == norm(x)


def _decoded(x: torch.Tensor, compression: str) -> np.ndarray:
    out = np.empty(x.numel(), dtype=np.float32)
    for (a, b), data in zip(piece_bounds(x.numel()), Part.of(x, compression, digest=False).pieces(), strict=True):
        decode_into(data, out[a:b], compression)
    return out


def test_a_false_norm_claim_fails_the_round_before_the_last_piece() -> None:
    """d claims a tenth of its true norm (to dodge the clip): every piece but the last can come out, the
    last never does, and d is named. Without the check the slice would complete, d's part unclipped."""
    parts = _parts(scale_of_d=40.0)

    async def body() -> None:
        red, _ = _reduction("mean")
        runner = asyncio.ensure_future(red.run())
        honest = [_feed(red, p, parts[p], "none") for p in MEMBERS[:3]]
        liar = _feed(red, "d", parts["d"], "none", claim=norm(parts["d"]) / 10)
        await asyncio.gather(*honest, liar, return_exceptions=True)
        with pytest.raises(SyncAborted) as failed:
            await red.done()
        await runner
        assert red.produced < len(red.pieces)
        assert red.flagged.get("d") == Suspicion.GARBAGE_PART
        assert failed.value.cause == AbortCause.BAD_BYTES

    asyncio.run(body())


def test_a_sender_holds_at_most_a_window_of_pieces_ahead_of_the_reduction() -> None:
    async def body() -> None:
        red, _ = _reduction("mean", remaining=1.0)
        for p in MEMBERS:
            red.join(p, 3, 1.0)
        for k in range(WINDOW):
            await red.slot("a", k)  # free: nothing reduced yet, and still within the window
            red.landed("a", k)
        early = asyncio.ensure_future(red.slot("a", WINDOW))
        await asyncio.sleep(0.05)
        assert not early.done(), "a slot beyond the window waits for the reduction"
        with pytest.raises(SyncAborted) as timed_out:  # b, c and d never send: the round's bound ends it
            await early
        assert timed_out.value.cause == AbortCause.ALLREDUCE_TIMEOUT

    asyncio.run(body())


def test_a_part_without_a_norm_and_a_second_part_are_refused() -> None:
    async def body() -> None:
        red, _ = _reduction("mean")
        with pytest.raises(SyncAborted):
            red.join("b", 3, None)
        with pytest.raises(SyncAborted):
            red.join("b", 3, float("nan"))
        red.join("b", 3, 1.0)
        with pytest.raises(SyncAborted):
            red.join("b", 3, 1.0)
        with pytest.raises(SyncAborted):
            red.join("stranger", 3, 1.0)
        red.join("c", 0, None)  # no part: nothing to claim

    asyncio.run(body())
