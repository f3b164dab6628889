"""What a member makes of one all-reduce: the average it assembled, and the outer step it would take.

Pure functions of the round's plan, this member's state and the bytes the
reducers returned, so the checks that decide a member's vote (every reduced
slice, then the outer step; :mod:`swarm.sync.robust`) run without a network.

The scale a member judges a reducer's slice by is its own evidence
(:class:`OwnScale`): its own part this round, its own recent parts and the
averages it committed. ``max_update`` x the anchor's norm, a scale no
contribution sets, is used only by a member without such evidence (one whose
groups had no signal since it started): a reducer returning half of its
slice of the anchor passes that floor at every member, and shrinks its
slice towards zero commit after commit (tests/swarm/test_sync_sim_robust.py).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot
from swarm.sync.config import OuterSyncConfig
from swarm.sync.merge import next_origin
from swarm.sync.robust import Suspicion, check_slice, check_step, max_step, norm
from swarm.sync.tensors import outer_step, state_hash

RECENT_SCALES = 8
"""Own parts and committed averages a member remembers as the scale of an honest slice."""

MIN_EVIDENCE = 1e-4
"""Own evidence below this x the anchor's norm is no scale: a member whose groups had no signal keeps the
``max_update`` floor, or it would refuse every honest average (and ban its partners)."""


class OwnScale:
    """The norm of an honest average as this member saw it: its own recent parts and committed averages."""

    def __init__(self) -> None:
        self._seen: deque[float] = deque(maxlen=RECENT_SCALES)

    def note(self, value: float | None) -> None:
        """A norm this member produced (its part) or committed to (an average); others' claims never count."""
        if value is not None and math.isfinite(value) and value > 0:
            self._seen.append(value)

    def scale(self, now: float | None = None) -> float:
        """The largest remembered norm, and this round's own part (``now``) if larger; 0 without evidence."""
        return max([*self._seen, now or 0.0], default=0.0)

    def state_dict(self) -> list[float]:
        return list(self._seen)

    def load_state_dict(self, values: Iterable[object]) -> None:
        for v in values:
            if isinstance(v, float):
                self.note(v)


def slice_floor(
    slice_norm: float, whole: float, size: int, n: int, scale: float, clip_factor: float, max_update: float
) -> float:
    """Largest norm a reduced slice may have whatever this member's own part of it is.

    With own evidence (``scale``, a whole-vector norm): ``clip_factor`` x its share for this slice, the
    larger of the slice's share of the anchor's norm and of its elements. Without: ``max_update`` x the
    slice's anchor norm (or its share of the whole, for a slice of zero-initialised biases).

    >>> slice_floor(3.0, 6.0, 25, 100, scale=0.1, clip_factor=4.0, max_update=0.5)  # 4 x 0.1 x max(0.5, 0.5)
    0.2
    >>> slice_floor(3.0, 6.0, 25, 100, scale=0.0, clip_factor=4.0, max_update=0.5)  # no evidence: 0.5 x 3.0
    1.5
    """
    share = math.sqrt(size / max(n, 1))
    if scale >= MIN_EVIDENCE * whole and scale > 0:
        return clip_factor * scale * max(slice_norm / whole if whole > 0 else 0.0, share)
    return max_update * max(slice_norm, whole * share)


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
    scale: float = 0.0
    """The own evidence the slices were judged by (:class:`OwnScale`); the outer step is judged by it too."""
    average_norm: float = 0.0
    """The norm of the whole average: evidence of an honest average's scale once the round commits."""


def assemble(
    plan: RoundPlan, snap: Snapshot, weight: int, result: AllReduceResult, max_update: float, seen: float = 0.0
) -> Assembled:
    """Check every reduced slice against this member's own part (its norm, ``result.own_norms``) and its own
    evidence (``seen``: :meth:`OwnScale.scale`), and digest the exact bytes."""
    h = hashlib.sha256(f"{plan.group_id}|{plan.revision}|{plan.compression}".encode())
    suspects: dict[str, Suspicion] = dict(result.flagged)
    refusal: Suspicion | None = None
    anchor, n = snap.anchor, snap.anchor.numel()
    slice_norms = [norm(anchor[lo:hi]) for lo, hi in plan.bounds()]
    whole = math.sqrt(math.fsum(x * x for x in slice_norms))
    own = math.sqrt(math.fsum(x * x for x in result.own_norms)) if weight else None
    scale = max(seen, own or 0.0)
    average = result.average  # decoded by the exchange as each slice streamed in
    for j, ((lo, hi), digest) in enumerate(zip(plan.bounds(), result.digests, strict=True)):
        h.update(digest)
        piece = torch.from_numpy(average[lo:hi])
        floor = slice_floor(slice_norms[j], whole, hi - lo, n, scale, plan.clip_factor, max_update)
        problem = check_slice(piece, result.own_norms[j] if weight else None, plan.clip_factor, floor)
        if problem is not None:
            # the reducer of slice j returned an implausible average: name it, and refuse the round
            suspects[plan.members[j]] = problem
            refusal = problem
    avg = torch.from_numpy(average)
    return Assembled(avg, h.hexdigest(), result.bytes_sent, own, suspects, refusal, scale, norm(avg))


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
    # the floor follows the slices' own-evidence scale when there is one (see slice_floor)
    whole = norm(snap.anchor)
    if got.scale > 0 and got.scale >= MIN_EVIDENCE * whole:
        m = norm(snap.momentum)
        floor = max_step(got.scale, m, cfg.outer_lr, mu, cfg.nesterov, cfg.clip_factor)
    else:
        floor = cfg.max_update * whole
    problem = check_step(snap.anchor, anchor, momentum, bound, floor)
    origin = next_origin(snap.origin, state_hash(anchor, momentum) if not snap.origin else "")
    new = Snapshot(snap.revision + 1 + skip, state_hash(anchor, momentum, origin), anchor, momentum, origin)
    return new, problem, bound
