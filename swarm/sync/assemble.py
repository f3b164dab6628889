"""What a member makes of one all-reduce: the average it assembled, and the outer step it would take.

Pure functions of the round's plan, this member's state and the bytes the
reducers returned, so the checks that decide a member's vote (every reduced
slice, then the outer step; :mod:`swarm.sync.robust`) run without a network.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot
from swarm.sync.config import OuterSyncConfig
from swarm.sync.merge import next_origin
from swarm.sync.robust import Suspicion, check_slice, check_step, max_step, norm
from swarm.sync.tensors import outer_step, state_hash


@dataclass(frozen=True)
class Assembled:
    """What this member assembled from one all-reduce, and what it caught on the way."""

    average: torch.Tensor
    """The decoded average (:func:`next_state` overwrites it with the outer update: read it before)."""
    digest: str
    """What this member votes: sha256 over the round and every slice's exact bytes."""
    sent: int
    own_norm: float | None
    """The norm of this member's own contribution (None when it sent weight 0)."""
    suspects: dict[str, Suspicion]
    refusal: Suspicion | None
    """Set when a reduced slice failed :func:`check_slice`: this member must vote abort."""


def assemble(plan: RoundPlan, snap: Snapshot, weight: int, result: AllReduceResult, max_update: float) -> Assembled:
    """Check every reduced slice against this member's own part (its norm, ``result.own_norms``), and digest
    the exact bytes."""
    h = hashlib.sha256(f"{plan.group_id}|{plan.revision}|{plan.compression}".encode())
    suspects: dict[str, Suspicion] = dict(result.flagged)
    refusal: Suspicion | None = None
    anchor, n = snap.anchor, snap.anchor.numel()
    slice_norms = [norm(anchor[lo:hi]) for lo, hi in plan.bounds()]
    whole = math.sqrt(math.fsum(x * x for x in slice_norms))
    average = result.average  # decoded by the exchange as each slice streamed in
    for j, ((lo, hi), digest) in enumerate(zip(plan.bounds(), result.digests, strict=True)):
        h.update(digest)
        piece = torch.from_numpy(average[lo:hi])
        # the slice's own anchor norm, or its share of the whole (a slice of zero-initialised biases)
        floor = max_update * max(slice_norms[j], whole * math.sqrt((hi - lo) / max(n, 1)))
        problem = check_slice(piece, result.own_norms[j] if weight else None, plan.clip_factor, floor)
        if problem is not None:
            # the reducer of slice j returned an implausible average: name it, and refuse the round
            suspects[plan.members[j]] = problem
            refusal = problem
    own = math.sqrt(math.fsum(x * x for x in result.own_norms)) if weight else None
    return Assembled(torch.from_numpy(average), h.hexdigest(), result.bytes_sent, own, suspects, refusal)


def next_state(
    snap: Snapshot, got: Assembled, cfg: OuterSyncConfig, skip: int = 0
) -> tuple[Snapshot, Suspicion | None, float | None]:
    """The state after applying ``got.average`` (not installed), why not to apply it if so, and the step bound.

    The new revision is ``snap.revision + 1 + skip`` (see :class:`swarm.sync.decide.GroupDecision`); its
    origin is the parent's, or the new state's own for a history's first commit (:mod:`swarm.sync.merge`).
    """
    mu = cfg.outer_momentum
    # the average is used up here (its memory holds the update): one vector fewer at the round's peak
    anchor, momentum = outer_step(snap.anchor, snap.momentum, got.average, cfg.outer_lr, mu, cfg.nesterov, True)
    bound = None
    if got.own_norm is not None:
        own, m = got.own_norm, norm(snap.momentum)
        bound = max_step(own, m, cfg.outer_lr, mu, cfg.nesterov, cfg.clip_factor)
    problem = check_step(snap.anchor, anchor, momentum, bound, cfg.max_update * norm(snap.anchor))
    origin = next_origin(snap.origin, state_hash(anchor, momentum) if not snap.origin else "")
    new = Snapshot(snap.revision + 1 + skip, state_hash(anchor, momentum, origin), anchor, momentum, origin)
    return new, problem, bound
