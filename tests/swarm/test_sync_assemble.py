"""What a member makes of one all-reduce: a reducer's slice is judged by the member's own evidence.

The round-3 lying reducer returns 0.45 x its slice of the anchor, which the ``max_update`` floor (0.5 x
the slice's anchor norm) let through at every member. Pure: no network.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot
from swarm.sync.assemble import MIN_EVIDENCE, OwnScale, assemble, next_state, slice_floor
from swarm.sync.robust import Suspicion, norm
from swarm.sync.tensors import state_hash

N = 3000
MEMBERS = ("a", "m", "z")  # "m" reduces the middle slice


def _plan() -> RoundPlan:
    return RoundPlan("g" * 32, 3, MEMBERS, N, "none", "mean", 0.2, 1e9)


def _round(average: torch.Tensor, own: torch.Tensor | None) -> AllReduceResult:
    bounds = _plan().bounds()
    own_norms = [] if own is None else [norm(own[lo:hi]) for lo, hi in bounds]
    return AllReduceResult(average.numpy().copy(), [b"x" * 32] * len(bounds), 0, {}, own_norms)


def _setting() -> tuple[Snapshot, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    anchor = 0.1 * torch.randn(N, generator=gen)
    parts = [0.002 * torch.randn(N, generator=gen) for _ in MEMBERS]  # one inner phase: ~2% of the anchor
    snap = Snapshot(3, state_hash(anchor, torch.zeros(N)), anchor, torch.zeros(N))
    return snap, parts[0], torch.stack(parts).mean(0)


def _lie(snap: Snapshot, honest: torch.Tensor) -> torch.Tensor:
    lo, hi = _plan().bounds()[1]
    lied = honest.clone()
    lied[lo:hi] = 0.45 * snap.anchor[lo:hi]  # the reducer's slice: 0.45 x the anchor's
    return lied


def test_a_reducer_returning_half_its_anchor_slice_is_refused_and_named() -> None:
    snap, own, honest = _setting()
    got = assemble(_plan(), snap, 4, _round(_lie(snap, honest), own), OuterSyncConfig().max_update)
    assert got.refusal is Suspicion.REDUCED_TOO_LARGE and got.suspects == {"m": Suspicion.REDUCED_TOO_LARGE}
    fine = assemble(_plan(), snap, 4, _round(honest, own), OuterSyncConfig().max_update)
    assert fine.refusal is None and fine.suspects == {}
    new, problem, _ = next_state(snap, fine, OuterSyncConfig())
    assert problem is None and new.revision == 4


def test_the_lie_passes_the_anchor_floor_that_a_member_without_evidence_keeps() -> None:
    """What the defence changes: the old floor (no evidence) lets the lie through; own evidence does not."""
    snap, own, honest = _setting()
    lo, hi = _plan().bounds()[1]
    lie = norm(0.45 * snap.anchor[lo:hi])
    whole, part = norm(snap.anchor), norm(snap.anchor[lo:hi])
    assert slice_floor(part, whole, hi - lo, N, 0.0, 4.0, 0.5) >= lie  # max_update x the slice's anchor norm
    assert slice_floor(part, whole, hi - lo, N, norm(own), 4.0, 0.5) < lie / 4
    got = assemble(_plan(), snap, 0, _round(_lie(snap, honest), None), 0.5)  # weight 0, no history
    assert got.refusal is None  # a member with no evidence at all cannot tell


def test_a_member_that_barely_trained_judges_by_what_it_saw_before() -> None:
    """Its groups had no signal this round: its earlier parts and committed averages are the scale."""
    snap, own, honest = _setting()
    scale = OwnScale()
    scale.note(norm(own))
    scale.note(math.nan)  # never counted
    tiny = 1e-6 * own
    result = _round(honest, tiny)
    assert assemble(_plan(), snap, 4, result, 0.5, scale.scale()).refusal is None
    assert assemble(_plan(), snap, 4, _round(_lie(snap, honest), tiny), 0.5, scale.scale()).refusal is not None
    # no history and a part below MIN_EVIDENCE x the anchor: it keeps the floor rather than refuse honest peers
    assert norm(tiny) < MIN_EVIDENCE * norm(snap.anchor)
    assert assemble(_plan(), snap, 4, result, 0.5).refusal is None
    restored = OwnScale()
    restored.load_state_dict([*scale.state_dict(), "junk", -1.0])
    assert restored.scale() == scale.scale()


def test_the_outer_step_is_bounded_by_the_same_evidence() -> None:
    snap, own, honest = _setting()
    got = assemble(_plan(), snap, 4, _round(honest, own), 0.5)
    big = type(got)(torch.from_numpy(np.full(N, 0.05, dtype=np.float32)), got.digest, 0, None, {}, None, got.scale, 0.0)
    _, problem, _ = next_state(snap, big, OuterSyncConfig())
    assert problem is Suspicion.STEP_TOO_LARGE  # 0.05 per weight: half the anchor's scale in one step
