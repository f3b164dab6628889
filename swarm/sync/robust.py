"""Bounded, robust aggregation of one slice's parts, and the checks members apply to a reducer's output.

Threat: a member may contribute finite but huge values (1e30) or noise of huge
norm, and as the reducer of its own slice may return anything. Three layers:

1. :func:`reduce_slice` (the reducer) clips every part to ``clip_factor`` x the
   median part norm (x its own part's norm when only two parts are present),
   names the members it clipped, caps every claimed weight (inner steps) at
   ``max_weight_ratio`` x the median claim (:func:`clamp_weights`), then
   aggregates with the selected rule. A round's reducer applies the same rule
   piece by piece as parts stream in (:mod:`swarm.sync.pieces`): the clip from
   the whole parts' norms, ``centered_clip`` per piece.
2. :func:`check_slice` (every member, on every reduced slice it receives)
   refuses a slice whose norm exceeds ``clip_factor`` x the norm of its own
   part of that slice: the member votes abort and the group discards.
3. :func:`check_step` (every member, before voting) refuses a new anchor that
   is non-finite or moved further than the outer step could move it from a
   pseudo-gradient bounded as in 2.

All arithmetic on the vectors is float32 in a fixed order (members, then
coordinates), so a reducer's bytes depend only on its inputs. Norms are
computed in float64 so a 1e30 part has a finite norm to compare.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

RULES = ("mean", "trimmed_mean", "median", "centered_clip")
CENTERED_CLIP_ITERS = 3
"""Iterations of centered clipping (Karimireddy et al. 2021 use 1-3 from a good start)."""


class Suspicion(enum.Enum):
    """Why a member's contribution (or a reducer's output) was refused or clipped."""

    CLIPPED_PART = "clipped part"
    GARBAGE_PART = "part far past the bound"
    REDUCED_NOT_FINITE = "reduced slice not finite"
    REDUCED_TOO_LARGE = "reduced slice too large"
    STEP_NOT_FINITE = "outer step not finite"
    STEP_TOO_LARGE = "outer step too large"
    VETOED = "kept aborting rounds the others would commit"


@dataclass(frozen=True)
class Reduced:
    """A reducer's output for its slice and the members whose parts it clipped (peer -> reason, norm)."""

    value: torch.Tensor
    flagged: dict[str, Suspicion]
    norms: dict[str, float] = field(default_factory=dict)
    """The original norm of each flagged part, for the log."""
    bound: float | None = None


NORM_BLOCK = 1 << 18
"""Elements widened to float64 at a time by :func:`norm` (2 MiB: stays in cache, no 2x-size copy)."""


def as_array(x: torch.Tensor) -> np.ndarray:
    """A float32 numpy view of ``x`` (a copy only if it is not a contiguous float32 CPU tensor).

    The vector arithmetic here runs in numpy: on the CPU builds this project uses, numpy's
    elementwise float32 kernels measured 10-20x faster than torch's on 10M elements
    (``isfinite`` 1.6 vs 30 ms, a float64 norm 3 vs 33 ms; bench/RESULTS.md, "Outer sync").
    """
    t = x.detach()
    if t.dtype != torch.float32 or t.device.type != "cpu":
        t = t.to(device="cpu", dtype=torch.float32)
    return t.contiguous().numpy()


def finite(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is finite (block by block: no mask of the whole vector at once)."""
    a = as_array(x).reshape(-1)
    mask = np.empty(min(NORM_BLOCK, a.size), dtype=bool)
    for start in range(0, a.size, NORM_BLOCK):
        piece = mask[: min(NORM_BLOCK, a.size - start)]
        if not np.isfinite(a[start : start + piece.size], out=piece).all():
            return False
    return True


def norm(x: torch.Tensor) -> float:
    """L2 norm accumulated in float64 (finite for any finite float32 vector), block by block."""
    return _norm(as_array(x).reshape(-1), None)


def distance(x: torch.Tensor, y: torch.Tensor) -> float:
    """``norm(x - y)`` (the float32 difference, as ``x - y`` rounds it) without a full-size temporary."""
    return _norm(as_array(x).reshape(-1), as_array(y).reshape(-1))


def _norm(a: np.ndarray, b: np.ndarray | None) -> float:
    block = np.empty(min(NORM_BLOCK, a.size), dtype=np.float64)
    diff = np.empty(min(NORM_BLOCK, a.size), dtype=np.float32) if b is not None else None
    total = 0.0
    for start in range(0, a.size, NORM_BLOCK):
        piece = block[: min(NORM_BLOCK, a.size - start)]
        src = a[start : start + piece.size]
        if b is not None and diff is not None:
            src = np.subtract(src, b[start : start + piece.size], out=diff[: piece.size])
        total += _square_sum(src, piece)
    return math.sqrt(total)


def _square_sum(src: np.ndarray, block: np.ndarray) -> float:
    np.copyto(block, src)
    # square and pairwise-sum in place: no BLAS call (numpy's dot wakes OpenBLAS threads that
    # spin on every core after each call: nearly 2x the round's CPU with 4 peers)
    np.multiply(block, block, out=block)
    return float(np.add.reduce(block))


def square_sum(block: np.ndarray) -> float:
    """The float64 sum of squares of at most ``NORM_BLOCK`` values, exactly as :func:`norm` sums one block:
    a norm summed block by block from the start of a vector is :func:`norm` of it, to the bit."""
    assert block.size <= NORM_BLOCK
    return _square_sum(block.reshape(-1), np.empty(block.size, dtype=np.float64))


def clip_to(x: torch.Tensor, bound: float) -> torch.Tensor:
    """``x`` scaled down to norm ``bound`` if it is longer (float32 multiply)."""
    n = norm(x)
    if n <= bound:
        return x
    return torch.from_numpy(np.multiply(as_array(x), np.float32(bound / n)))


def norm_bound(norms: Sequence[float], own: float | None, clip_factor: float) -> float | None:
    """The largest part norm the reducer accepts unclipped; None when it has nothing to compare with.

    >>> norm_bound([1.0, 2.0, 100.0], None, 3.0), norm_bound([1.0, 100.0], 1.0, 3.0)
    (6.0, 3.0)
    """
    if len(norms) >= 3:
        ordered = sorted(norms)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        return clip_factor * median
    if len(norms) == 2:
        # with two parts a median cannot out-vote one liar: trust only the reducer's own part
        # (or, if it contributed nothing, the smaller of the two)
        return clip_factor * (own if own is not None else min(norms))
    return None


def clamp_weights(weights: Sequence[int], max_weight_ratio: float) -> list[float]:
    """Each claimed weight capped at ``max_weight_ratio`` x the median claim (the smallest, with two).

    A key can claim any step count; capped, one liar moves the weighted mean at
    most as much as an honest peer that trained ``max_weight_ratio`` x the
    median. With two parts a median cannot out-vote the liar, so the smaller
    claim is the scale (the same on every reducer, so every slice is weighted alike).

    >>> clamp_weights([4, 8, 10**9], 4.0), clamp_weights([3, 10**9], 4.0), clamp_weights([7], 4.0)
    ([4.0, 8.0, 32.0], [3.0, 12.0], [7.0])
    """
    if len(weights) < 2:
        return [float(w) for w in weights]
    ordered = sorted(weights)
    mid = len(ordered) // 2
    if len(ordered) == 2:
        scale = float(ordered[0])
    elif len(ordered) % 2:
        scale = float(ordered[mid])
    else:
        scale = 0.5 * (ordered[mid - 1] + ordered[mid])
    cap = max_weight_ratio * scale
    return [min(float(w), cap) for w in weights]


def weighted_mean(parts: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum_i w_i x_i / sum_i w_i in float32, members in order (equal weights: the plain mean, same bits as before).

    >>> weighted_mean([torch.tensor([0.0]), torch.tensor([3.0])], [1.0, 2.0])
    tensor([2.])
    """
    arrays = [as_array(p) for p in parts]
    if len(set(weights)) <= 1:
        acc = arrays[0].copy()
        for a in arrays[1:]:
            np.add(acc, a, out=acc)
        return torch.from_numpy(np.divide(acc, np.float32(len(parts)), out=acc))
    total = math.fsum(weights)
    # coefficients in float64 then one float32 multiply and one add per part (two roundings, no fused
    # multiply-add): a fixed order, so fixed bits
    acc = np.zeros_like(arrays[0])
    term = np.empty_like(arrays[0])
    for a, w in zip(arrays, weights, strict=True):
        np.add(acc, np.multiply(a, np.float32(w / total), out=term), out=acc)
    return torch.from_numpy(acc)


def weighted_trimmed_mean(stacked: torch.Tensor, weights: Sequence[float], k: int) -> torch.Tensor:
    """Per coordinate: drop the ``k`` smallest and ``k`` largest values (by count), weight the rest.

    Trimming by count, not by weight, keeps a heavy claim from shielding its own
    extreme value; the survivors then count by their (capped) inner steps.

    >>> weighted_trimmed_mean(torch.tensor([[0.0], [1.0], [4.0], [100.0]]), [1.0, 1.0, 3.0, 1.0], 1)
    tensor([3.2500])
    """
    ordered, index = stacked.sort(dim=0)
    w = torch.tensor(list(weights), dtype=torch.float64)[index]  # each value's weight, sorted with it
    kept, kept_w = ordered[k : len(weights) - k], w[k : len(weights) - k]
    coeff = (kept_w / kept_w.sum(dim=0)).to(torch.float32)
    acc = torch.zeros_like(kept[0])
    for row, c in zip(kept, coeff, strict=True):
        acc += row * c
    return acc


def coordinate_median(parts: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median (the mean of the two middle values for an even count).

    Three and four parts (the usual groups) take a min/max network in numpy, in two buffers of one
    part's size and ~5x faster than a sort on this CPU; more parts are stacked and sorted by torch.

    >>> coordinate_median(torch.tensor([[0.0, 5.0], [2.0, 1.0], [9.0, 3.0], [4.0, 4.0]]))
    tensor([3.0000, 3.5000])
    """
    k = len(parts)
    if k in (3, 4):
        rows = [as_array(r) for r in parts]
        lo, hi = np.minimum(rows[0], rows[1]), np.maximum(rows[0], rows[1])
        if k == 3:  # the median of three: max(min(a, b), min(max(a, b), c))
            return torch.from_numpy(np.maximum(lo, np.minimum(hi, rows[2], out=hi), out=lo))
        # the middle two of four: the larger of the two pairs' minima and the smaller of their maxima
        np.maximum(lo, np.minimum(rows[2], rows[3], out=hi), out=lo)
        np.minimum(np.maximum(rows[0], rows[1], out=hi), np.maximum(rows[2], rows[3]), out=hi)
        np.add(lo, hi, out=lo)
        return torch.from_numpy(np.multiply(lo, np.float32(0.5), out=lo))
    stacked = parts if isinstance(parts, torch.Tensor) else torch.stack(list(parts))
    ordered = stacked.sort(dim=0).values
    if k % 2:
        return ordered[k // 2].clone()
    return (ordered[k // 2 - 1] + ordered[k // 2]) * torch.tensor(0.5, dtype=torch.float32)


def centered_clip(parts: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """v <- v + mean_i clip(x_i - v, tau), from the coordinate-wise median; tau = median distance.

    In numpy, two passes per part and iteration: the distance ``|x_i - v|`` (block-wise, no
    temporary) and ``acc += s_i x_i``; then ``v <- v + (acc - (sum_i s_i) v) / k``, with ``s_i`` the
    clip scale (1 inside tau), which is ``mean_i s_i (x_i - v)``. Three buffers of one part's size.
    """
    rows = [as_array(x) for x in parts]
    median = coordinate_median(parts)  # a fresh tensor: updated in place below
    v = median.numpy() if len(rows) in (3, 4) else as_array(median).copy()
    term, acc = np.empty_like(v), np.empty_like(v)
    dists = sorted(_norm(r, v) for r in rows)
    tau = dists[len(dists) // 2]
    k = np.float32(len(rows))
    for _ in range(CENTERED_CLIP_ITERS):
        acc.fill(0.0)
        total = 0.0
        for r in rows:
            d = _norm(r, v)
            scale = 1.0 if d <= tau else tau / d
            total += scale
            np.add(acc, np.multiply(r, np.float32(scale), out=term), out=acc)
        np.subtract(acc, np.multiply(v, np.float32(total), out=term), out=acc)
        np.add(v, np.divide(acc, k, out=acc), out=v)
    return torch.from_numpy(v)


def aggregate(
    parts: Sequence[torch.Tensor], n: int, rule: str, trim_fraction: float, weights: Sequence[float] | None = None
) -> torch.Tensor:
    """Combine equal-length parts with ``rule``; robust rules need 3 parts (fewer: the mean).

    ``weights`` (capped inner steps, see :func:`clamp_weights`; None: all equal)
    weight ``mean`` and the survivors of ``trimmed_mean``. ``median`` and
    ``centered_clip`` ignore them: their point is that no one member moves the
    estimate far, and a weighted median would hand it to any claim heavier than
    all the others together (a capped liar at 4x the median of three is 4/6).
    """
    if rule not in RULES:
        raise ValueError(f"aggregator={rule!r}; use one of {', '.join(RULES)}")
    if not parts:
        return torch.zeros(n, dtype=torch.float32)
    w = [1.0] * len(parts) if weights is None else list(weights)
    if len(parts) >= 3 and rule != "mean":
        if rule == "median":
            return coordinate_median(parts)
        if rule == "centered_clip":
            return centered_clip(parts)
        stacked = torch.stack(list(parts))
        k = min(int(len(parts) * trim_fraction), (len(parts) - 1) // 2)
        if k > 0:
            if len(set(w)) <= 1:
                return stacked.sort(dim=0).values[k : len(parts) - k].mean(dim=0)
            return weighted_trimmed_mean(stacked, w, k)
    return weighted_mean(parts, w)


def reduce_slice(
    parts: Sequence[tuple[str, torch.Tensor]],
    own: torch.Tensor | None,
    n: int,
    rule: str,
    trim_fraction: float,
    clip_factor: float,
    weights: Sequence[int] | None = None,
    max_weight_ratio: float = 4.0,
) -> Reduced:
    """Clip each ``(peer, part)`` (member order) to the norm bound, cap ``weights`` (each part's claimed
    inner steps; None: all equal), then aggregate with ``rule``."""
    norms = [norm(t) for _, t in parts]
    bound, scales, flagged = clip_plan(
        [(peer, t_norm) for (peer, _), t_norm in zip(parts, norms, strict=True)],
        None if own is None else norm(own),
        clip_factor,
    )
    flagged_norms = {peer: t_norm for (peer, _), t_norm in zip(parts, norms, strict=True) if peer in flagged}
    clipped = [t if peer not in scales else _scale(t, scales[peer]) for peer, t in parts]
    capped = None if weights is None else clamp_weights(weights, max_weight_ratio)
    return Reduced(aggregate(clipped, n, rule, trim_fraction, capped), flagged, flagged_norms, bound)


def clip_plan(
    norms: Sequence[tuple[str, float]], own: float | None, clip_factor: float
) -> tuple[float | None, dict[str, float], dict[str, Suspicion]]:
    """The norm bound, each clipped part's scale (``bound / its norm``, as :func:`clip_to` scales it) and
    why each clipped part was clipped, from the parts' norms (member order) and the reducer's own."""
    bound = norm_bound([t for _, t in norms], own, clip_factor)
    scales: dict[str, float] = {}
    flagged: dict[str, Suspicion] = {}
    for peer, t_norm in norms:
        if bound is not None and t_norm > bound:
            # past clip_factor x the bound (16x the median by default) is no honest spread: garbage,
            # and a member sending it whole sends it to every reducer, so every honest one bans it
            gross = len(norms) >= 3 and t_norm > clip_factor * bound  # 2 parts: no telling who is off
            flagged[peer] = Suspicion.GARBAGE_PART if gross else Suspicion.CLIPPED_PART
            scales[peer] = bound / t_norm
    return bound, scales, flagged


def _scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.from_numpy(np.multiply(as_array(x), np.float32(scale)))


def check_slice(
    reduced: torch.Tensor, own: torch.Tensor | float | None, clip_factor: float, floor: float = 0.0
) -> Suspicion | None:
    """Whether a received reduced slice is plausible: finite, and within ``clip_factor`` x our own part
    or ``floor``, whichever is larger.

    Why both: a member that barely trained this round (its groups had no
    signal) has a tiny own part, and honest peers' averages dwarf it; the
    ``floor`` (a share of the anchor's own norm, see ``OuterSyncConfig.max_update``)
    keeps it from refusing them. Without either scale only finiteness is checked. ``own``: our part, or
    its norm.
    """
    if not finite(reduced):
        return Suspicion.REDUCED_NOT_FINITE
    own_norm = 0.0 if own is None else own if isinstance(own, float) else norm(own)
    limit = max(clip_factor * own_norm, floor)
    if limit > 0 and norm(reduced) > limit * (1 + 1e-6):
        return Suspicion.REDUCED_TOO_LARGE
    return None


def max_step(own_norm: float, momentum_norm: float, lr: float, mu: float, nesterov: bool, clip_factor: float) -> float:
    """Bound on ||new anchor - anchor|| when the average g obeys ||g|| <= clip_factor x ||own||.

    The step is lr x ((1 + mu) g + mu^2 m) with Nesterov, lr x (g + mu m)
    without; the triangle inequality gives the bound (1 % slack for rounding).
    """
    g = clip_factor * own_norm
    step = (1 + mu) * g + mu * mu * momentum_norm if nesterov else g + mu * momentum_norm
    return 1.01 * lr * step


def check_step(
    anchor: torch.Tensor, new_anchor: torch.Tensor, new_momentum: torch.Tensor, bound: float | None, floor: float = 0.0
) -> Suspicion | None:
    """Why the outer step must not be applied (non-finite, or moved more than ``bound`` and ``floor``), or None."""
    if not (finite(new_anchor) and finite(new_momentum)):
        return Suspicion.STEP_NOT_FINITE
    moved = distance(new_anchor, anchor)
    limit = max(bound or 0.0, floor)
    if limit > 0 and not (math.isfinite(moved) and moved <= limit):
        return Suspicion.STEP_TOO_LARGE
    return None
