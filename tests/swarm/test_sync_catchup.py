"""Catch-up trusts evidence, not claims: who vouches for a state, and whether its bytes are plausible.

Decisions and checks without the network; the real-process attack is tests/swarm/test_sync_attacks_catchup.py.
"""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch

from protocol import SigningKey
from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import Snapshot
from swarm.sync.catchup import CatchUpper
from swarm.sync.decide import CatchUpRefusal, check_downloaded_state, decide_catch_up, peers_named_in
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.records import StateRecord
from swarm.sync.tensors import state_hash

FP, H0, H1, HX = "0123456789abcdef", "a" * 64, "b" * 64, "f" * 64


def _state(peer: str, revision: int, h: str, created: float = 1.0) -> StateRecord:
    return StateRecord(peer, FP, revision, h, created)


def _sybils(n: int, revision: int = 1_000_000) -> dict[str, StateRecord]:
    """``n`` fresh keys, each signing the same made-up state (they vouch for each other)."""
    ids = [SigningKey.generate().peer_id for _ in range(n)]
    return {p: _state(p, revision, HX, created=float(i)) for i, p in enumerate(ids)}


def test_any_number_of_fresh_keys_vouch_for_nothing() -> None:
    sybils = _sybils(50)
    honest = {"b": _state("b", 3, H0)}
    decision = decide_catch_up({**sybils, **honest}, 3, H0, "a", trusted={"b"})
    assert decision.target is None
    assert decision.refused == dict.fromkeys(sybils, CatchUpRefusal.UNVOUCHED)


def test_a_trusted_peer_ahead_is_followed_and_untrusted_copies_serve_as_donors() -> None:
    states = {**_sybils(5), "b": _state("b", 5, H1, created=1.0), "x": _state("x", 5, H1, created=2.0)}
    decision = decide_catch_up(states, 3, H0, "a", trusted={"b"})
    assert decision.target is not None
    assert (decision.target.revision, decision.target.state_hash) == (5, H1)
    assert decision.target.donors == ("x", "b")  # freshest first; the hash is checked on download anyway
    assert set(decision.refused) == set(states) - {"b", "x"}


def test_a_trusted_liar_is_outvoted_by_a_trusted_peer_at_our_state() -> None:
    """A former partner claiming 1,000,000 while another partner is where we are: stay."""
    states = {"m": _state("m", 1_000_000, HX), "b": _state("b", 3, H0)}
    decision = decide_catch_up(states, 3, H0, "a", trusted={"m", "b"})
    assert decision.target is None
    assert decision.refused == {"m": CatchUpRefusal.OUTVOTED}


def test_among_equally_vouched_states_the_smallest_jump_wins() -> None:
    states = {"m": _state("m", 1_000_000, HX), "b": _state("b", 4, H1)}
    decision = decide_catch_up(states, 3, H0, "a", trusted={"m", "b"})
    assert decision.target is not None and decision.target.revision == 4
    assert decision.refused == {"m": CatchUpRefusal.OUTVOTED}
    # more vouchers beat a smaller jump
    states["c"] = _state("c", 6, H0)
    states["d"] = _state("d", 6, H0)
    decision = decide_catch_up(states, 3, H0, "a", trusted={"m", "b", "c", "d"})
    assert decision.target is not None and decision.target.revision == 6


def test_a_brand_new_node_follows_its_bootstrap_peer_not_a_sybil_crowd() -> None:
    bootstrap = peers_named_in(["/ip4/127.0.0.1/tcp/4001/p2p/boot"])
    states = {**_sybils(100), "boot": _state("boot", 7, H1)}
    decision = decide_catch_up(states, 0, H0, "new", trusted=bootstrap)
    assert decision.target is not None
    assert (decision.target.revision, decision.target.state_hash, decision.target.donors) == (7, H1, ("boot",))
    # no one to trust: a brand-new node stays at its own revision 0 whatever is claimed
    assert decide_catch_up(states, 0, H0, "new", trusted=frozenset()).target is None


def test_same_revision_other_hash_needs_a_trusted_majority() -> None:
    states = {"b": _state("b", 3, H1), "c": _state("c", 3, H1)}
    assert decide_catch_up(states, 3, H0, "a", trusted={"b", "c"}).target is not None
    assert decide_catch_up(states, 3, H0, "a", trusted=set()).target is None
    # 1 trusted against this peer itself: the smaller hash wins, so exactly one of two peers moves
    assert decide_catch_up({"b": _state("b", 3, H1)}, 3, H0, "a", trusted={"b"}).target is None
    assert decide_catch_up({"a": _state("a", 3, H0)}, 3, H1, "b", trusted={"a"}).target is not None


def test_a_newcomer_follows_its_bootstrap_at_revision_0_whatever_the_hash_order() -> None:
    # the bootstrap peer trusts no one and has the larger hash: without the leader rule neither moves
    boot = {"boot": _state("boot", 0, H1)}
    assert decide_catch_up(boot, 0, H0, "new", trusted={"boot"}).target is None
    decision = decide_catch_up(boot, 0, H0, "new", trusted={"boot"}, leaders={"boot"})
    assert decision.target is not None and decision.target.state_hash == H1
    # a trusted peer already shares the newcomer's state: the majority rule decides, not the leader
    states = {**boot, "c": _state("c", 0, H0)}
    assert decide_catch_up(states, 0, H0, "new", trusted={"boot", "c"}, leaders={"boot"}).target is None
    # sybils at revision 0 are no leaders
    assert decide_catch_up(_sybils(20, revision=0), 0, H0, "new", trusted={"boot"}, leaders={"boot"}).target is None


def test_peers_named_in_reads_only_p2p_components() -> None:
    addrs = ["/ip4/1.2.3.4/tcp/1/p2p/12D3KooWAbc", "/ip4/1.2.3.4/tcp/2", "/dns/x/tcp/3/p2p/"]
    assert peers_named_in(addrs) == frozenset({"12D3KooWAbc"})


# ---- downloaded state --------------------------------------------------------------------------


def _judge(own: torch.Tensor, anchor: torch.Tensor, momentum: torch.Tensor, shift: float = 1.0) -> object:
    finite = bool(torch.isfinite(anchor).all() and torch.isfinite(momentum).all())
    return check_downloaded_state(
        float(own.norm()),
        float((anchor - own).norm()) if finite else math.inf,
        float(momentum.norm()) if finite else math.inf,
        finite,
        shift,
        0.9,
    )


def test_a_made_up_anchor_is_too_far_and_a_trained_one_is_not() -> None:
    gen = torch.Generator().manual_seed(0)
    own = 0.1 * torch.randn(10_000, generator=gen)
    trained = own + 0.02 * torch.randn(10_000, generator=gen)  # 20% relative: many revisions of training
    made_up = 0.1 * torch.randn(10_000, generator=gen)  # same scale, other values: ~141% away
    zeros = torch.zeros(10_000)
    assert _judge(own, trained, 0.5 * trained - 0.5 * own) is None
    assert _judge(own, made_up, zeros) is CatchUpRefusal.TOO_FAR
    assert _judge(own, 1000 * own, zeros) is CatchUpRefusal.TOO_FAR
    assert _judge(own, made_up, zeros, shift=2.0) is None  # the bound is the operator's choice
    # a momentum far beyond what steps of that size accumulate
    assert _judge(own, trained, 100 * own) is CatchUpRefusal.TOO_FAR


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_state_is_refused(bad: float) -> None:
    own = torch.ones(8)
    poisoned = own.clone()
    poisoned[3] = bad
    assert _judge(own, poisoned, torch.zeros(8)) is CatchUpRefusal.NOT_FINITE
    assert _judge(own, own, poisoned) is CatchUpRefusal.NOT_FINITE


def test_max_state_shift_is_validated() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="max_state_shift"):
            OuterSyncConfig(max_state_shift=bad)
    assert OuterSyncConfig().max_state_shift == 1.0


# ---- the next revision, while trusted peers that lag still report our state ------------------------


def test_the_next_revision_is_followed_on_one_trusted_voucher_though_lagging_partners_report_our_state() -> None:
    """A 160 s chaos run forked here: partners that had not seen revision 3 yet kept this peer on 2."""
    states = {"b": _state("b", 4, H1), "c": _state("c", 3, H0), "d": _state("d", 3, H0)}
    decision = decide_catch_up(states, 3, H0, "a", trusted={"b", "c", "d"})
    assert decision.target is not None and (decision.target.revision, decision.target.contested) == (4, True)
    uncontested = decide_catch_up({"b": _state("b", 4, H1)}, 3, H0, "a", trusted={"b"})
    assert uncontested.target is not None and not uncontested.target.contested
    jump = decide_catch_up({"b": _state("b", 5, H1), "c": _state("c", 3, H0)}, 3, H0, "a", trusted={"b", "c"})
    assert jump.target is None and jump.refused == {"b": CatchUpRefusal.OUTVOTED}  # two ahead: a majority


class _Records:
    """The two reads catch-up makes, answering fixed state records (the decision logic is under test here)."""

    def __init__(self, states: dict[str, StateRecord]) -> None:
        self.states = states

    def refresh_state(self, revision: int, state_hash: str) -> bool:
        return True

    def read_states(self) -> dict[str, StateRecord]:
        return self.states


def _contested_catch_up(served: torch.Tensor, own_steps: list[float]) -> tuple[object, dict[CatchUpRefusal, int]]:
    own = torch.ones(1000)
    snap = Snapshot(3, state_hash(own, torch.zeros(1000)), own, torch.zeros(1000))
    got = Snapshot(4, state_hash(served, torch.zeros(1000)), served, torch.zeros(1000))
    states = {"b": _state("b", 4, got.state_hash), "c": _state("c", 3, snap.state_hash)}
    upper = CatchUpper(
        "a", cast(SyncRecords, _Records(states)), lambda *_: got, OuterSyncConfig(), frozenset({"b", "c"}), _quiet
    )
    for step in own_steps:
        upper.note_step(step)
    try:
        return upper.catch_up(snap, lambda: False), upper.refusals
    except StateDownloadFailed:
        return None, upper.refusals


def _quiet(*_: object) -> None:
    pass


def test_a_contested_next_state_must_move_no_more_than_this_peers_own_steps_allow() -> None:
    own = torch.ones(1000)
    honest = own + 0.002 * torch.randn(1000, generator=torch.Generator().manual_seed(1))  # one step: norm ~0.06
    liar = own + 0.2 * torch.randn(1000, generator=torch.Generator().manual_seed(2))  # norm ~6: within max_state_shift
    assert _contested_catch_up(honest, [0.05, 0.07])[0] is not None
    got, refusals = _contested_catch_up(liar, [0.05, 0.07])
    assert got is None and refusals == {CatchUpRefusal.CONTESTED_STEP: 1}
    assert _contested_catch_up(honest, [])[0] is None  # no step of its own to compare with: stays
