"""Catch-up trusts evidence, not claims: who vouches for a state, and whether its bytes are plausible.

Decisions and checks without the network; the attack on the simulated network is tests/swarm/test_sync_sim_records.py.
"""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch

from protocol import SigningKey
from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import Snapshot
from swarm.sync.catchup import RETRIES, RETRY_S, SKIP_MARGIN, CatchUpper
from swarm.sync.decide import (
    MAX_CONTESTED_AHEAD,
    CatchUpRefusal,
    check_downloaded_state,
    count_vouchers,
    decide_catch_up,
    followable_states,
    peers_named_in,
)
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.records import MAX_SKIP, StateRecord
from swarm.sync.tensors import state_hash
from tests.fakes import FakeClock

FP, H0, H1, HX = "0123456789abcdef", "a" * 64, "b" * 64, "f" * 64


def _state(peer: str, revision: int, h: str, created: float = 1.0) -> StateRecord:
    return StateRecord(peer, FP, revision, h, created)


def test_only_trusted_peers_at_or_past_this_revision_vouch_and_an_own_claim_adds_one() -> None:
    records = {"b": _state("b", 5, H1), "c": _state("c", 2, H1), "x": _state("x", 5, H1), "d": _state("d", 3, H0)}
    assert count_vouchers(records, (3, H0), {"b", "c", "d"}) == {(5, H1): 1}  # c is behind, d at this state
    assert count_vouchers(records, (3, H0), {"b"}, own_claim=(5, H1)) == {(5, H1): 2}


def test_a_leaders_state_is_followed_only_while_nobody_trusted_stays_and_an_own_claim_always() -> None:
    led = (3, H1)
    assert followable_states({led: 1}, (3, H0), stay=0, led={led}) == [led]  # a newcomer joins its swarm
    assert followable_states({led: 1}, (3, H0), stay=1, led={led}) == []  # a partner at this state outweighs it
    far = (40, HX)  # this peer's own earlier signed state: followed against any number staying
    assert followable_states({far: 1}, (3, H0), stay=5, own_claim=far) == [far]
    assert followable_states({far: 1}, (3, H0), stay=5) == []  # the same claim by one trusted peer is not


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
    # a few revisions ahead is contested too (a restarted node behind its group); a far one needs a majority
    near = decide_catch_up({"b": _state("b", 5, H1), "c": _state("c", 3, H0)}, 3, H0, "a", trusted={"b", "c"})
    assert near.target is not None and near.target.contested
    ahead = 3 + MAX_CONTESTED_AHEAD + 1
    far = decide_catch_up({"b": _state("b", ahead, H1), "c": _state("c", 3, H0)}, 3, H0, "a", trusted={"b", "c"})
    assert far.target is None and far.refused == {"b": CatchUpRefusal.OUTVOTED}


def test_trusted_peers_at_our_state_count_against_a_claim_only_while_they_answer() -> None:
    """A dead partner's record outlives it (record_ttl_s): it must not hold this peer on a state its group left."""
    ahead = 3 + MAX_CONTESTED_AHEAD + 1
    states = {"b": _state("b", ahead, H1), "c": _state("c", 3, H0)}
    assert decide_catch_up(states, 3, H0, "a", trusted={"b", "c"}, stay_alive={"c"}).target is None
    gone = decide_catch_up(states, 3, H0, "a", trusted={"b", "c"}, stay_alive=set())
    assert gone.target is not None and (gone.target.revision, gone.target.contested) == (ahead, False)


def test_a_target_that_failed_is_passed_over_for_the_next_best() -> None:
    states = {"b": _state("b", 5, H1), "c": _state("c", 5, H1), "d": _state("d", 4, HX)}
    first = decide_catch_up(states, 3, H0, "a", trusted={"b", "c", "d"})
    assert first.target is not None and first.target.revision == 5
    second = decide_catch_up(states, 3, H0, "a", trusted={"b", "c", "d"}, ignored={(5, H1)})
    assert second.target is not None and (second.target.revision, second.target.state_hash) == (4, HX)


class _Records:
    """The two reads catch-up makes, answering fixed state records (the decision logic is under test here)."""

    def __init__(self, states: dict[str, StateRecord]) -> None:
        self.states = states

    def refresh_state(self, revision: int, state_hash: str, origin: str = "") -> bool:
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


# ---- forks: a target that fails, and trust that survives a restart ---------------------------------


def _upper(
    states: dict[str, StateRecord], fetch: object, trusted: frozenset[str], clock: FakeClock | None = None
) -> CatchUpper:
    records = cast(SyncRecords, _Records(states))
    return CatchUpper("a", records, fetch, OuterSyncConfig(), trusted, _quiet, clock or FakeClock(1000.0))  # type: ignore[arg-type]


def _unreachable(*_: object) -> Snapshot:
    raise ConnectionError("no route")


def test_a_target_no_donor_serves_is_retried_before_this_peer_syncs_at_its_own_state() -> None:
    """Syncing at once at its own state while the target is real (its donor frozen) would fork the history."""
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    clock = FakeClock(1000.0)
    upper = _upper({"b": _state("b", 4, H1)}, _unreachable, frozenset({"b"}), clock)
    for _ in range(3 * RETRIES):  # many rounds in a few seconds: the donor may be frozen for longer
        with pytest.raises(StateDownloadFailed) as err:
            upper.catch_up(snap, lambda: False)
        assert err.value.retry
        clock.now += 1.0
    assert upper.ignored() == frozenset()
    clock.now += RETRY_S
    assert upper.ignored() == {(4, H1)}
    assert upper.catch_up(snap, lambda: False) is None  # passed over from now on: sync at its own state


def test_a_state_download_gets_the_time_its_bytes_take_on_the_slowest_link() -> None:
    """A fixed bound cuts off every download of a large model on a slow link: the node could never rejoin."""
    own, trained = torch.ones(1000), torch.full((1000,), 1.01)
    snap = Snapshot(3, state_hash(own, torch.zeros(1000)), own, torch.zeros(1000))
    got = Snapshot(4, state_hash(trained, torch.zeros(1000)), trained, torch.zeros(1000))
    cfg = OuterSyncConfig(min_link_mbit=0.001)  # 8,000 bytes of state take 80 s at 1 kbit/s, past the 60 s bound
    given: list[float] = []

    def fetch(donor: str, n: int, timeout: float) -> Snapshot:
        given.append(timeout)
        return got

    records = cast(SyncRecords, _Records({"b": _state("b", 4, got.state_hash)}))
    upper = CatchUpper("a", records, fetch, cfg, frozenset({"b"}), _quiet, FakeClock(1000.0))
    assert upper.catch_up(snap, lambda: False) is got
    assert given == [pytest.approx(cfg.state_bound_s(1000))] and cfg.state_bound_s(1000) == pytest.approx(80.0)


def test_an_implausible_target_is_passed_over_at_once() -> None:
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    far = Snapshot(4, state_hash(100 * own, torch.zeros(10)), 100 * own, torch.zeros(10))
    upper = _upper({"b": _state("b", 4, far.state_hash)}, lambda *_: far, frozenset({"b"}))
    with pytest.raises(StateDownloadFailed) as err:
        upper.catch_up(snap, lambda: False)
    assert not err.value.retry and upper.refusals == {CatchUpRefusal.TOO_FAR: 1}
    assert upper.catch_up(snap, lambda: False) is None


def test_a_node_far_behind_accepts_a_shift_that_grows_with_the_time_it_was_away() -> None:
    """A node restarted from an old checkpoint: its group trained on (a 30-minute chaos run refused 40 behind).

    The bound grows with what the node itself saw (its last commit long ago, its rounds 1 s apart), never with
    the revisions a peer claims: the same claim right after its last commit gets one step's bound.
    """
    own = torch.ones(100)
    moved = own + 1.5  # 1.5x the anchor's norm away: too far for one step, plausible for 40
    snap = Snapshot(3, state_hash(own, torch.zeros(100)), own, torch.zeros(100))
    for away_s, ok in ((0.5, False), (1800.0, True)):
        got = Snapshot(43, state_hash(moved, torch.zeros(100)), moved, torch.zeros(100))
        clock = FakeClock(1000.0)
        states = {p: _state(p, 43, got.state_hash) for p in "bc"}  # two trusted words: a majority ahead
        upper = _upper(states, lambda *_, g=got: g, frozenset({"b", "c"}), clock)
        for _ in range(3):  # its own rounds, one a second
            upper.note_step(0.01)
            clock.now += 1.0
        clock.now += away_s - 1.0
        if ok:
            assert upper.catch_up(snap, lambda: False) is got
        else:
            with pytest.raises(StateDownloadFailed):
                upper.catch_up(snap, lambda: False)
            assert upper.refusals == {CatchUpRefusal.TOO_FAR: 1}


@pytest.mark.parametrize("contested", [True, False])
def test_a_trusted_donor_that_claims_a_far_revision_gets_no_wider_bound(contested: bool) -> None:
    """The round-3 catch-up takeover: a partner of one honest round signs a record one revision ahead, then
    serves a made-up state claiming revision +1,000,000. The bound stays the vouched target's (one step)."""
    own = torch.ones(1000)
    snap = Snapshot(3, state_hash(own, torch.zeros(1000)), own, torch.zeros(1000))
    fake = own + 0.5 * torch.randn(1000, generator=torch.Generator().manual_seed(3))  # ~0.5 of the norm away
    served = Snapshot(1_000_003, state_hash(fake, torch.zeros(1000)), fake, torch.zeros(1000))
    states = {"m": _state("m", 4, H1)}
    if contested:
        states["b"] = _state("b", 3, snap.state_hash)  # a lagging honest partner still at this state
    clock = FakeClock(1000.0)
    upper = _upper(states, lambda *_: served, frozenset({"m", "b"}), clock)
    upper.note_step(0.02)
    clock.now += 1.0
    upper.note_step(0.03)
    clock.now += 0.5  # the liar's record arrives half a round after this peer's last commit
    with pytest.raises(StateDownloadFailed):
        upper.catch_up(snap, lambda: False)
    assert upper.refusals == {CatchUpRefusal.OUT_OF_REACH: 1}  # one trusted word reaches no further than 8 ahead
    assert upper.catch_up(snap, lambda: False) is None  # passed over at once: the liar holds no round
    near = Snapshot(4, state_hash(fake, torch.zeros(1000)), fake, torch.zeros(1000))
    upper = _upper({**states, "m": _state("m", 4, near.state_hash)}, lambda *_: near, frozenset({"m", "b"}), clock)
    upper.note_step(0.03)
    with pytest.raises(StateDownloadFailed):  # the same state at its true distance: refused too
        upper.catch_up(snap, lambda: False)


def test_partners_and_own_steps_survive_a_checkpoint() -> None:
    upper = _upper({}, _unreachable, frozenset())
    upper.add_partners(["p1", "p2", "a"])
    upper.note_step(0.25)
    state = upper.state_dict()
    restored = _upper({}, _unreachable, frozenset())
    restored.load_state_dict({**state, "partners": [*state["partners"], 7], "steps": [*state["steps"], "x"]})
    assert restored.trusted() == {"p1", "p2"} and restored.state_dict() == state
    # a contested catch-up right after a restart has the steps it needs (no steps: it would refuse)
    own = torch.ones(1000)
    near = own + 0.002
    snap = Snapshot(3, state_hash(own, torch.zeros(1000)), own, torch.zeros(1000))
    got = Snapshot(4, state_hash(near, torch.zeros(1000)), near, torch.zeros(1000))
    states = {"p1": _state("p1", 4, got.state_hash), "p2": _state("p2", 3, snap.state_hash)}
    resumed = _upper(states, lambda *_: got, frozenset())
    resumed.load_state_dict(state)
    assert resumed.catch_up(snap, lambda: False) is got


def test_a_node_restored_behind_its_own_published_state_rejoins_it() -> None:
    """Committed rev 5, crashed before the next checkpoint, restored at 3: extending 3 again would fork."""
    states = {"b": _state("b", 5, H1), "c": _state("c", 3, H0), "d": _state("d", 3, H0)}
    assert decide_catch_up(states, 3, H0, "a", trusted={"c", "d"}).target is None  # b is no partner of the old a
    back = decide_catch_up(states, 3, H0, "a", trusted={"c", "d"}, own_claim=(5, H1))
    assert back.target is not None and (back.target.revision, back.target.state_hash, back.target.donors) == (
        5,
        H1,
        ("b",),
    )
    # a claim at or behind where it is now, or one already passed over, is history
    assert decide_catch_up(states, 5, H1, "a", trusted=set(), own_claim=(5, H1)).target is None
    assert decide_catch_up(states, 3, H0, "a", trusted={"c"}, own_claim=(5, H1), ignored={(5, H1)}).target is None


def test_a_group_skips_past_a_dead_branch_so_a_revision_names_one_state() -> None:
    """Others committed revision 4 from this state and nobody can serve it: this peer's next commit is 5."""
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    states = {"b": _state("b", 4, H1)}
    clock = FakeClock(1000.0)
    upper = _upper(states, _unreachable, frozenset({"b"}), clock)
    for _ in range(RETRIES):
        with pytest.raises(StateDownloadFailed):
            upper.catch_up(snap, lambda: False)
        clock.now += RETRY_S
    assert upper.skip(snap) == 1 + SKIP_MARGIN  # past 4, and past commits of the branch never reported
    assert upper.skip(Snapshot(4, snap.state_hash, own, torch.zeros(10))) == 0  # history moved past it
    # the branch's record expired: what was passed over as unserved still counts
    del states["b"]
    assert upper.skip(snap) == 1 + SKIP_MARGIN
    assert _upper({}, _unreachable, frozenset({"b"})).skip(snap) == 0  # nobody reports anything later


def test_a_commit_skips_past_states_this_peer_did_not_move_to_trusted_or_not() -> None:
    """Chaos run (30 minutes, seed 1): two strangers committed revision 332 and were killed; a node restarted
    at 331 refused their claims (no trusted peer made them) and its group committed a second 332."""
    own = torch.ones(10)
    snap = Snapshot(331, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    strangers = {p: _state(p, 332, H1) for p in ("dyrvvk", "93ssXj")}
    upper = _upper({**strangers, "mate": _state("mate", 331, snap.state_hash)}, _unreachable, frozenset({"mate"}))
    assert upper.catch_up(snap, lambda: False) is None  # not moved: no trusted peer claims 332
    assert upper.skip(snap) == 1 + SKIP_MARGIN
    # a claim refused as implausible keeps its number too
    far = Snapshot(332, state_hash(100 * own, torch.zeros(10)), 100 * own, torch.zeros(10))
    liar = _upper({"b": _state("b", 332, far.state_hash)}, lambda *_: far, frozenset({"b"}))
    with pytest.raises(StateDownloadFailed):
        liar.catch_up(snap, lambda: False)
    assert liar.skip(snap) == 1 + SKIP_MARGIN


def test_a_revision_this_peer_voted_for_and_aborted_is_skipped_by_its_next_commit() -> None:
    """Chaos runs: a member that read every digest committed 9 while its partner declared it lost and aborted;
    if the committed state's record never spreads, the partner's next group must not name another 9."""
    own = torch.ones(10)
    snap = Snapshot(8, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    upper = _upper({"b": _state("b", 8, snap.state_hash)}, _unreachable, frozenset({"b"}))
    assert upper.skip(snap) == 0  # nothing reported past 8
    upper.undecided(9)
    assert upper.skip(snap) == 1 + SKIP_MARGIN  # defence off: 0
    nine = Snapshot(9, state_hash(own, torch.ones(10)), own, torch.ones(10))
    assert upper.skip(nine) == 0  # caught up to the committed 9 (or committed past it): nothing to skip


def test_a_skip_passes_a_dead_branch_however_far_it_went() -> None:
    """Chaos run (seed 1): every holder of revisions 9-19 died; the survivors at 8 skipped the cap of 8 and
    committed a second revision 17. The skip now passes the last revision anyone reports, plus a margin."""
    own = torch.ones(10)
    snap = Snapshot(8, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    states = {"b": _state("b", 9, H1), "c": _state("c", 19, HX), "stranger": _state("stranger", 40, H0)}
    upper = _upper(states, _unreachable, frozenset({"b"}))
    for _ in range(RETRIES):
        with pytest.raises(StateDownloadFailed):
            upper.catch_up(snap, lambda: False)
    # the next commit takes 8 + 1 + skip: past 40, the last revision anyone reports, by the margin
    assert upper.skip(snap) == 40 - 8 + SKIP_MARGIN
    # a claim within reach only makes the skip bigger, never past the join record's limit ...
    states["near"] = _state("near", 8 + MAX_SKIP, H0)
    assert upper.skip(snap) == MAX_SKIP
    # ... and one beyond it (keys minted to claim far revisions) moves no number
    del states["near"]
    states["liar"] = _state("liar", 2**61, H0)
    assert upper.skip(snap) == 40 - 8 + SKIP_MARGIN


def test_trusted_peers_ahead_outvote_one_at_our_state_though_each_names_another_revision() -> None:
    """A fast group's records name 28, 29, 30 (one each); a stale partner of this peer is at its state, 18."""
    states = {p: _state(p, r, h) for p, r, h in (("b", 28, H1), ("c", 29, HX), ("d", 30, H0))}
    states["e"] = _state("e", 18, H0)
    decision = decide_catch_up(states, 18, H0, "a", trusted={"b", "c", "d", "e"})
    assert decision.target is not None and (decision.target.revision, decision.target.contested) == (28, False)
    # one trusted peer far ahead against one at our state is still a liar's claim until more agree
    lone = decide_catch_up({"b": states["b"], "e": states["e"]}, 18, H0, "a", trusted={"b", "e"})
    assert lone.target is None


def test_a_trusted_donor_that_moved_on_serves_its_later_state_and_an_untrusted_one_does_not() -> None:
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    later = Snapshot(5, state_hash(own + 0.01, torch.zeros(10)), own + 0.01, torch.zeros(10))
    states = {"b": _state("b", 4, H1)}
    assert _upper(states, lambda *_: later, frozenset({"b"})).catch_up(snap, lambda: False) is later
    stranger = _upper({**states, "x": _state("x", 4, H1)}, lambda d, *_: later, frozenset({"b"}))
    stranger._fetch = lambda d, *_: later if d == "x" else _unreachable()  # only the untrusted copy answers
    with pytest.raises(StateDownloadFailed):
        stranger.catch_up(snap, lambda: False)
    assert stranger.refusals == {CatchUpRefusal.OFF_TARGET: 1}


def test_a_node_whose_every_trusted_peer_is_gone_pauses_rather_than_split_the_history() -> None:
    """Restarted after its whole group died, it would sync with whoever shares its stale state (a chaos fork)."""
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    states = {"b": _state("b", 3, snap.state_hash), "x": _state("x", 9, H1)}

    def orphaned(trusted: frozenset[str], alive: set[str]) -> bool:
        records = cast(SyncRecords, _Records(states))
        upper = CatchUpper("a", records, _unreachable, OuterSyncConfig(), trusted, _quiet, alive=lambda p, t: alive)
        return upper.orphaned(snap)

    assert orphaned(frozenset({"b"}), {"x"})  # its only trusted peer is gone; a live stranger is ahead
    assert not orphaned(frozenset({"b"}), {"b", "x"})  # a trusted peer answers: the trust rule decides as usual
    assert not orphaned(frozenset({"b"}), set())  # the stranger's record outlived it: nobody live is ahead
    assert not orphaned(frozenset(), {"x"})  # the first node of a swarm trusts no one yet: no orphan
    # a flood evicted the record of its live partner c: c still answers, so no stranger's claim pauses it
    assert not orphaned(frozenset({"c"}), {"c", "x"})


def test_a_founder_left_behind_says_so_once_and_neither_follows_nor_pauses() -> None:
    """The first node of a swarm missed its joiners' first rounds: strangers' claims must not move it."""
    own = torch.ones(10)
    snap = Snapshot(0, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    lines: list[str] = []
    alive: set[str] = set()
    records = cast(SyncRecords, _Records({"x": _state("x", 9, H1), "y": _state("y", 9, H1)}))
    say = lambda _level, msg, *args: lines.append(msg % args)  # noqa: E731
    live = lambda peers, _timeout: alive & set(peers)  # noqa: E731
    upper = CatchUpper("a", records, _unreachable, OuterSyncConfig(), frozenset(), say, alive=live)
    assert upper.decide(snap).target is None  # two keys claiming revision 9 vouch nothing
    assert not upper.orphaned(snap) and not upper.alone_warned  # the records outlived their signers: nothing said
    alive.update({"x", "y"})
    assert not upper.orphaned(snap) and not upper.orphaned(snap)  # one key must not pause a founder's sync
    said = [line for line in lines if "trusts no peer" in line]
    assert len(said) == 1 and "2 live peers" in said[0] and "--peer" in said[0], lines


def test_a_newcomer_waits_for_its_bootstrap_peers_state_however_long_no_donor_serves_it() -> None:
    """A newcomer that gave up would sync at its own initial weights: a second history from revision 0."""
    own, zeros = torch.ones(10), torch.zeros(10)
    snap = Snapshot(0, state_hash(own, zeros), own, zeros)
    served = Snapshot(0, state_hash(2 * own, zeros), 2 * own, zeros)  # the bootstrap peer's initialisation
    frozen = True

    def fetch(*_: object) -> Snapshot:
        if frozen:
            raise ConnectionError("no answer")
        return served

    upper = _upper({"boot": _state("boot", 0, served.state_hash)}, fetch, frozenset({"boot"}))
    for _ in range(3 * RETRIES):
        with pytest.raises(StateDownloadFailed) as err:
            upper.catch_up(snap, lambda: False)
        assert err.value.retry
    assert upper.ignored() == frozenset()
    frozen = False
    assert upper.catch_up(snap, lambda: False) is served
