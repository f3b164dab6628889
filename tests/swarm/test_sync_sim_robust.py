"""Robust aggregation against a hostile member, on the simulated network (tests/swarm/test_sync_sim.py's members).

The attacker m is a real :class:`OuterSync` whose weights are set, before each sync, so that its
pseudo-gradient is finite garbage (1e30 everywhere, or noise of norm ~1e6 per element), or minus
the progress it shares with the honest members just inside the clip bound; or whose parts claim a
billion inner steps. The honest members a and b dump, at each sync, their own pseudo-gradient and
the average they applied (from the outer momentum: ``g = m_new - mu m_old``), so each test
recomputes the honest mean and measures how far each committed average is from it. These ran over
real processes before (tests/sync_worker.py ``--poison``, ``--claim-steps``, ``--dump``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import swarm.sync.allreduce as allreduce
import swarm.sync.assemble as assemble_module
import swarm.sync.outer as outer
import swarm.sync.pieces as pieces
from swarm.sync import AbortCause, OuterSync, OuterSyncConfig, SyncReport
from swarm.sync.job import SyncJob
from swarm.sync.tensors import flatten, load_flat
from tests.simnet import SimNet
from tests.swarm.test_sync_sim import CFG, WALL_S, Member, Plan, _histories, _key, _model, simulate

ROUNDS = 3
"""Syncs of each member (the daemon tests': 12 steps, a sync every 4)."""
DRIFT = 1e-3
"""A direction every member's training shares, per sync (the worker's ``--drift``): the progress a flip reverses."""


@dataclass
class Dumped:
    """What one member's sync took and gave: its pseudo-gradient, its part's weight, the applied average."""

    report: SyncReport
    pseudo: torch.Tensor
    weight: int
    applied: torch.Tensor
    trusted: frozenset[str]


@dataclass
class Dumps:
    by_member: dict[str, list[Dumped]] = field(default_factory=dict)


def _shared(n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(7)) * DRIFT


def _member(
    dumps: Dumps, cfg: OuterSyncConfig, poison: Callable[[OuterSync, int], None] | None = None, claim: int = 0
) -> Callable[[SimNet, Member], Callable[[OuterSync], None]]:
    """Each sync of the member: its weights drift along the shared direction (and ``poison`` sets them), its
    part claims ``claim`` inner steps if set, and what it took and applied is dumped."""

    def make(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        out = dumps.by_member.setdefault(m.name, [])

        def setup(sync: OuterSync) -> None:
            honest_sync, honest_prepare = sync.sync_now, sync.prepare

            def prepare(inner_step: int | None = None) -> SyncJob:
                job = honest_prepare(inner_step)
                return replace(job, steps=claim) if claim else job

            def sync_now(inner_step: int | None = None) -> SyncReport:
                load_flat(sync.module, flatten(sync.module) + _shared(sum(p.numel() for p in sync.module.parameters())))
                if poison is not None:
                    poison(sync, len(out))
                before = sync.state_dict()
                pseudo = before["anchor"] - flatten(sync.module)
                weight = sync.prepare(inner_step).steps
                report = honest_sync(inner_step)
                applied = sync.state_dict()["momentum"] - cfg.outer_momentum * before["momentum"]
                out.append(Dumped(report, pseudo.double(), weight, applied.double(), sync.trusted()))
                return report

            sync.prepare = prepare  # type: ignore[method-assign]  # a hostile member's claim
            sync.sync_now = sync_now  # type: ignore[method-assign]  # a test's window on each round

        return setup

    return make


def _garbage(mode: str) -> Callable[[OuterSync, int], None]:
    """Weights whose pseudo-gradient (anchor - weights) is 1e30 everywhere, or noise of norm ~1e6 per element."""

    def poison(sync: OuterSync, k: int) -> None:
        anchor = sync.state_dict()["anchor"]
        noise = 1e6 * torch.randn(anchor.numel(), generator=torch.Generator().manual_seed(k))
        load_flat(sync.module, anchor - (torch.full_like(anchor, 1e30) if mode == "huge" else noise))

    return poison


def _flip(sync: OuterSync, k: int) -> None:
    """Minus the progress this member shares with the honest ones, just inside the 4x clip bound."""
    anchor = sync.state_dict()["anchor"]
    load_flat(sync.module, anchor + 3.9 * (anchor - flatten(sync.module)))


def _run(
    tmp_path: Path, cfg: OuterSyncConfig, poison: Callable[[OuterSync, int], None] | None = None, claim: int = 0
) -> tuple[dict[str, Member], Dumps]:
    dumps = Dumps()
    setups = {"a": _member(dumps, cfg), "b": _member(dumps, cfg), "m": _member(dumps, cfg, poison, claim)}
    members, net, wall = simulate(tmp_path, ["a", "b", "m"], Plan(rounds=ROUNDS, train_s=0.2), cfg=cfg, setups=setups)
    print(f"{wall:.3f} s wall\n" + "\n".join(net.trace))
    for name, dumped in dumps.by_member.items():
        shown = [(d.report.committed, d.report.group_size, d.report.cause, d.report.suspects) for d in dumped]
        print(name, shown)
    assert wall < 2 * WALL_S
    return members, dumps


def _deviations(dumps: Dumps) -> list[float]:
    """For each round both honest members committed: ||applied - honest mean|| / ||honest mean||."""
    out = []
    for da, db in zip(dumps.by_member["a"], dumps.by_member["b"], strict=True):
        if not (da.report.committed and db.report.committed):
            continue
        assert da.report.state_hash == db.report.state_hash
        honest = (da.pseudo + db.pseudo) / 2  # float64: a poisoned average gives a finite figure
        out.append(float((da.applied - honest).norm() / honest.norm()))
    return out


def _honest_state(members: dict[str, Member]) -> None:
    """The survivors' state: one per revision, the honest pair ending on the same finite anchor."""
    a, b = members["a"], members["b"]
    assert all(len(h) == 1 for h in _histories([a, b]).values())
    assert a.states[-1] == b.states[-1]
    assert a.checkpoint is not None and bool(a.checkpoint[0]["anchor"].isfinite().all())


@pytest.mark.parametrize(
    ("poison", "aggregator", "tolerance"),
    [("huge", "mean", 2.5), ("noise", "centered_clip", 1.0)],
)
def test_poisoned_contributions_are_clipped(tmp_path: Path, poison: str, aggregator: str, tolerance: float) -> None:
    """Clipped to 4x the median part norm: the mean moves at most (4 max|h| + |mean|) / 3 (~2.2x here); 1e30
    is garbage to every reducer, so m is left out of the later groups and never trusted (defence off: the
    1e30 round commits a 1e30 anchor)."""
    cfg = replace(CFG, aggregator=aggregator)
    members, dumps = _run(tmp_path, cfg, _garbage(poison))
    deviations = _deviations(dumps)
    print(f"{poison}/{aggregator}: deviations from the honest mean {[round(d, 3) for d in deviations]}")
    assert len(deviations) >= 2  # commits continue
    assert all(math.isfinite(d) and d <= tolerance for d in deviations), deviations
    attacker = members["m"].peer
    for name in "ab":
        named = [d.report for d in dumps.by_member[name] if attacker in d.report.suspects]
        assert named and all(len(r.suspects) == 1 for r in named), named
    _honest_state(members)
    if poison == "huge":
        first, *later = [d for d in dumps.by_member["a"] if d.report.committed]
        assert first.report.group_size == 3 and first.report.suspects[attacker] == "part far past the bound"
        assert later and all(d.report.group_size == 2 for d in later)
        assert not any(attacker in d.trusted for d in dumps.by_member["a"]), "a suspect became a partner"


def test_a_sign_flip_at_the_clip_bound_does_not_reverse_the_default_aggregate(tmp_path: Path) -> None:
    """m sends minus the progress it shares with a and b, just inside the clip bound, claiming the most steps:
    under the default aggregator every committed average still points with the honest progress."""
    rule = OuterSyncConfig().aggregator
    members, dumps = _run(tmp_path, replace(CFG, aggregator=rule), _flip, claim=2_147_483_647)
    cosines = []
    for da, db in zip(dumps.by_member["a"], dumps.by_member["b"], strict=True):
        if da.report.committed and db.report.committed:
            honest = da.pseudo + db.pseudo
            cosines.append(float(torch.nn.functional.cosine_similarity(da.applied, honest, dim=0)))
    print(f"flip/{rule}: cosines with the honest progress {[round(c, 3) for c in cosines]}")
    assert len(cosines) >= 2, cosines
    assert all(c > 0.5 for c in cosines), cosines
    assert all(len(h) == 1 for h in _histories(list(members.values())).values())
    _honest_state(members)


def test_a_member_claiming_a_billion_steps_counts_as_the_cap(tmp_path: Path) -> None:
    """a, b honest (one step per sync); m claims 10**9: it weighs as 4 x the median claim, not ~all of the
    average (cap off: its share is ~1)."""
    members, dumps = _run(tmp_path, replace(CFG, aggregator="mean"), claim=10**9)
    shares, caps = [], []
    rounds = zip(dumps.by_member["a"], dumps.by_member["b"], dumps.by_member["m"], strict=True)
    for da, db, dm in rounds:
        if not (da.report.committed and db.report.committed and dm.report.committed):
            continue
        assert dm.weight == 10**9
        w = [da.weight, db.weight]
        h = (da.pseudo * w[0] + db.pseudo * w[1]) / sum(w)
        # applied = (1 - s) h + s liar: s is the liar's share of the average
        shares.append(float((da.applied - h).norm() / (dm.pseudo - h).norm()))
        # computed here, not by the code under test: the liar counts as 4 x the median claim, which with
        # two honest claims below its own is the larger honest one
        caps.append(4 * max(w) / (4 * max(w) + sum(w)))
    print(f"the liar's share of each committed average {[round(s, 4) for s in shares]} (caps {caps})")
    assert len(shares) >= 2, shares
    assert all(s <= cap + 1e-4 for s, cap in zip(shares, caps, strict=True)), (shares, caps)
    assert max(caps) < 0.7  # as much as one peer that trained 4x the median, not the ~1.0 of its claim
    _honest_state(members)


def _lying_reducer(
    monkeypatch: pytest.MonkeyPatch, liar: str, lie: Callable[[int, int, int], np.ndarray], own_checks: bool
) -> None:
    """``liar``'s reducer returns ``lie(slice start, piece start, piece end)`` for each piece of its slice, the
    others reducing honestly (its patch names it: the members share one process); without ``own_checks`` its
    sync passes whatever average it gets (an attacker runs whatever code it likes)."""
    honest_init, honest_reduce, honest_piece = (
        allreduce._Round.__init__,
        pieces.SliceReduction._reduce,
        pieces.reduce_piece,
    )
    honest_assemble, honest_next = assemble_module.assemble, assemble_module.next_state
    starts: dict[int, int] = {}

    def init(self: Any, plan: Any, index: int, me: str, dest: Any, remaining: Any) -> None:
        honest_init(self, plan, index, me, dest, remaining)
        if me == liar:
            starts[id(self.red)] = plan.bounds()[index][0]

    def reduce(self: Any, k: int) -> None:
        if self.me != liar:
            return honest_reduce(self, k)
        a, b = self.pieces[k]
        pieces.reduce_piece = lambda *_: lie(starts.get(id(self), 0), a, b)
        try:
            return honest_reduce(self, k)
        finally:
            pieces.reduce_piece = honest_piece

    def mine() -> bool:  # the liar's sync runs on its own member thread (tests/simnet.py's start_thread)
        return threading.current_thread().name == f"sim-{liar[-6:]}"

    def assemble(*args: Any, **kwargs: Any) -> Any:
        got = honest_assemble(*args, **kwargs)
        return replace(got, suspects={}, refusal=None) if mine() and not own_checks else got

    def next_state(*args: Any, **kwargs: Any) -> Any:
        new, problem, bound = honest_next(*args, **kwargs)
        return (new, None, bound) if mine() and not own_checks else (new, problem, bound)

    monkeypatch.setattr(allreduce._Round, "__init__", init)
    monkeypatch.setattr(pieces.SliceReduction, "_reduce", reduce)
    monkeypatch.setattr(outer, "assemble", assemble)
    monkeypatch.setattr(outer, "next_state", next_state)


def test_lying_reducer_is_refused_then_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """m reduces its slice to huge noise: every honest member votes abort (nobody applies it), names m, then
    matches without it, committing the honest mean (slice check off: the noise is committed)."""
    liar = _key("m").peer_id
    noise = 1e6 * torch.randn(1 << 12, generator=torch.Generator().manual_seed(5)).numpy()
    _lying_reducer(monkeypatch, liar, lambda lo, a, b: noise[a:b].copy(), own_checks=True)
    members, dumps = _run(tmp_path, CFG)
    first = [dumps.by_member[n][0].report for n in "ab"]
    assert all(not r.committed and r.cause is AbortCause.REFUSED for r in first), first
    assert all(r.revision == 0 for r in first)  # rolled back everywhere: nobody applied it
    assert all(r.suspects.get(liar, "").startswith("reduced slice") for r in first), first
    later = [d.report for n in "ab" for d in dumps.by_member[n][1:]]
    assert later and all(r.committed and r.group_size == 2 for r in later), later
    deviations = _deviations(dumps)
    assert len(deviations) == ROUNDS - 1 and max(deviations) < 1e-5, deviations
    assert not any(r.committed for r in members["m"].reports)
    _honest_state(members)


SHRINK = 0.45
"""The shrinking reducer returns this x its slice of the anchor as the average (inside the old 0.5 floor)."""


def test_a_reducer_shrinking_its_slice_fails_every_round_and_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """m, as reducer of its slice, returns 0.45 x that slice of the anchor as the average and votes for it
    (its own checks off). Each honest member judges a reduced slice by its own evidence (its part, its recent
    parts, the averages it committed), so every round m is in fails at both, who name it and leave it out;
    the pair syncs on and its anchor keeps >0.8 of each third's norm (old floor: 6 of 6 committed, 0.03)."""
    liar = _key("m").peer_id
    anchor: list[torch.Tensor] = []

    def keep_anchor(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        return lambda sync: anchor.append(sync._snap.anchor)  # the liar's (revision 0: never moves)

    _lying_reducer(monkeypatch, liar, lambda lo, a, b: (SHRINK * anchor[0][lo + a : lo + b]).numpy(), own_checks=False)
    dumps = Dumps()
    setups = {"a": _member(dumps, CFG), "b": _member(dumps, CFG), "m": keep_anchor}
    members, _, wall = simulate(tmp_path, ["a", "b", "m"], Plan(rounds=10, train_s=0.2), setups=setups)
    with_it = {n: [d.report for d in dumps.by_member[n] if d.report.group_size == 3] for n in "ab"}
    pairs = {n: [d.report for d in dumps.by_member[n] if d.report.committed and d.report.group_size == 2] for n in "ab"}
    initial = flatten(_model())
    a_anchor = members["a"].checkpoint[0]["anchor"] if members["a"].checkpoint else initial
    thirds = [(x.norm() / y.norm()).item() for x, y in zip(a_anchor.chunk(3), initial.chunk(3), strict=True)]
    print(f"thirds of a's anchor over the initial weights': {[round(t, 4) for t in thirds]}; {wall:.3f} s wall")
    assert all(v for v in with_it.values()), "m never joined a group: nothing was tested"
    assert not any(r.committed for v in with_it.values() for r in v), with_it
    assert all(r.suspects.get(liar) == "reduced slice too large" for v in with_it.values() for r in v), with_it
    assert all(len(v) <= 3 for v in with_it.values()), with_it  # left out within 3 rounds
    assert all(len(v) >= 3 for v in pairs.values()), pairs  # the honest pair syncs on without it
    assert min(thirds) > 0.8, thirds
    _honest_state(members)
