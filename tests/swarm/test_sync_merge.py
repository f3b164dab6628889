"""Histories that meet (swarm.sync.merge): the rule, what a merge keeps, and what many keys cannot do with it.

Decisions and checks without the network; the real-process run of two islands
meeting is tests/swarm/test_sync_islands.py.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch

from protocol import SigningKey
from protocol.errors import MessageRejected
from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import Snapshot
from swarm.sync.assemble import Assembled, next_state
from swarm.sync.catchup import CatchUpper
from swarm.sync.config import SyncOutcome, SyncReport
from swarm.sync.decide import CatchUpRefusal
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.job import RoundOutcome, SyncJob, weights_after
from swarm.sync.merge import MAX_PINGED, MERGE_CHECK_S, MERGE_COOLDOWN_S, decide_merge, to_ping
from swarm.sync.records import STATE_KIND, StateRecord, open_record, seal_record
from swarm.sync.tensors import state_hash
from tests.fakes import FakeClock

FP = "0123456789abcdef"
A, B, C = "a" * 64, "b" * 64, "c" * 64
"""Three histories' origins (A < B < C)."""


def _rec(peer: str, origin: str, revision: int, h: str = "", created: float = 1.0) -> StateRecord:
    return StateRecord(
        peer, FP, revision, h or (origin[0] if origin else "0") * 63 + str(revision % 10), created, origin
    )


def _snap(anchor: torch.Tensor, revision: int, origin: str) -> Snapshot:
    zeros = torch.zeros(anchor.numel())
    return Snapshot(revision, state_hash(anchor, zeros, origin), anchor, zeros, origin)


# ---- the rule ---------------------------------------------------------------------------------------


def test_the_history_with_more_live_peers_wins_and_a_tie_goes_to_the_smaller_origin() -> None:
    states = {"x": _rec("x", B, 7), "y": _rec("y", B, 7), "z": _rec("z", A, 5)}
    got = decide_merge(states, "me", A, alive={"x", "y"})  # me alone (z gone) against x and y
    assert got is not None and (got.revision, got.donors) == (7, ("x", "y"))
    assert decide_merge(states, "me", A, alive={"x", "y", "z"}) is None  # two against two: A is smaller
    seen_by_x = {**states, "me": _rec("me", A, 5)}
    assert decide_merge(seen_by_x, "x", B, alive={"y", "z", "me"}) is not None  # B's peers compute the same tie
    assert decide_merge(states, "me", C, alive={"x", "y", "z"}) is not None  # C alone loses to either


def test_a_ground_origin_wins_a_tie_so_pulling_an_island_takes_as_many_live_hosts_as_it_has_peers() -> None:
    """Round-3 finding, kept as a stated cost (SECURITY.md, "Merges"): an origin is a state's hash, which a key
    grinds below any honest one in a few tries, so the tie-break gives an attacker the island at n hosts, not
    n + 1. Breaking ties any other way that both sides can compute is as grindable."""
    island = {f"i{k}": _rec(f"i{k}", B, 40) for k in range(3)}
    ground = "0" * 8 + "f" * 56  # smaller than ~every honest origin
    hosts = {f"m{k}": _rec(f"m{k}", ground, 9) for k in range(3)}
    mine = {**island, **hosts}
    assert decide_merge(mine, "i0", B, alive={"i1", "i2", "m0", "m1"}) is None  # 3 against 2: the island stays
    pulled = decide_merge(mine, "i0", B, alive={"i1", "i2", "m0", "m1", "m2"})  # 3 against 3: the tie is hers
    assert pulled is not None and set(pulled.donors) == set(hosts)


def test_keys_that_answer_no_ping_count_for_no_history() -> None:
    """Records are free to sign; a live host is not. Counted without the ping, 20 keys would pull a pair."""
    sybils = {k.peer_id: _rec(k.peer_id, C, 900) for k in (SigningKey.generate() for _ in range(20))}
    states = {**sybils, "friend": _rec("friend", A, 5)}
    assert decide_merge(states, "me", A, alive={"friend"}) is None
    assert decide_merge(states, "me", A, alive=set(states)) is not None  # the same records, counted unpinged


def test_a_peer_with_no_history_yet_neither_counts_nor_merges() -> None:
    """A founder that committed nothing must not be moved by strangers' claims (CatchUpper._alone_behind)."""
    states = {"x": _rec("x", B, 7), "y": _rec("y", B, 7), "n": _rec("n", "", 0), "m": _rec("m", "", 0)}
    assert decide_merge(states, "me", "", alive=set(states)) is None
    assert decide_merge(states, "me", A, alive={"x", "n", "m"}) is None  # newcomers are nobody's: one against one


def test_the_state_merged_into_is_the_one_most_of_the_winners_report_then_the_newest() -> None:
    states = {
        "x": _rec("x", B, 7),
        "y": _rec("y", B, 7),
        "w": _rec("w", B, 9),
        "v": _rec("v", B, 9),
        "u": _rec("u", B, 8),
    }
    got = decide_merge(states, "me", A, alive=set(states))
    assert got is not None and (got.revision, got.donors) == (9, ("v", "w"))
    got = decide_merge(states, "me", A, alive=set(states), ignored={(9, states["w"].state_hash)})
    assert got is not None and got.revision == 7  # a state refused or never served is passed over


def test_a_merge_check_pings_a_bounded_set_half_of_them_this_peers_own_history() -> None:
    states = {f"o{i}": _rec(f"o{i}", B, 3, created=float(i)) for i in range(100)}
    states |= {f"m{i}": _rec(f"m{i}", A, 3, created=float(i)) for i in range(100)}
    pinged = to_ping(states, "me", A)
    assert len(pinged) == MAX_PINGED
    assert sum(p.startswith("m") for p in pinged) == MAX_PINGED // 2
    assert pinged[0] == "m99" and "o99" in pinged  # the freshest records of each


# ---- what names a history ---------------------------------------------------------------------------


def test_a_historys_first_commit_names_it_and_every_later_commit_keeps_the_name() -> None:
    cfg = OuterSyncConfig(outer_lr=1.0, outer_momentum=0.0)
    anchor = torch.ones(8)
    genesis = Snapshot(0, state_hash(anchor, torch.zeros(0)), anchor, torch.zeros(0))

    def commit(snap: Snapshot, step: float) -> Snapshot:
        got = Assembled(torch.full((8,), step), "d" * 64, 0, None, {}, None)
        new, problem, _ = next_state(snap, got, cfg)
        assert problem is None
        return new

    first = commit(genesis, 0.01)
    assert first.origin == state_hash(first.anchor, first.momentum)  # named after itself
    assert first.state_hash == state_hash(first.anchor, first.momentum, first.origin)
    second = commit(first, 0.02)
    assert second.origin == first.origin and second.state_hash != first.state_hash
    other = commit(genesis, 0.03)  # another group's first commit from the same revision 0: another history
    assert other.origin != first.origin


def test_a_state_hash_binds_its_history_and_a_record_its_origin() -> None:
    anchor, zeros = torch.ones(4), torch.zeros(4)
    assert state_hash(anchor, zeros, A) != state_hash(anchor, zeros, B) != state_hash(anchor, zeros)
    key = SigningKey.generate()
    record = StateRecord(key.peer_id, FP, 3, "e" * 64, 1.0, A)
    assert open_record(seal_record(STATE_KIND, record, key), STATE_KIND, StateRecord.from_wire) == record
    for bad in ("A" * 64, "a" * 63, "xyz"):
        with pytest.raises(MessageRejected, match="origin"):
            open_record(
                seal_record(STATE_KIND, StateRecord(key.peer_id, FP, 3, "e" * 64, 1.0, bad), key),
                STATE_KIND,
                StateRecord.from_wire,
            )


# ---- what a merge keeps -----------------------------------------------------------------------------


def _report(committed: bool, merged: bool) -> SyncReport:
    outcome = SyncOutcome.COMMITTED if committed else SyncOutcome.ABORTED
    report = SyncReport(0.0, "me", 9, "f" * 64, committed, 2, outcome, 0.1, 0)
    report.merged = merged
    return report


def test_a_merge_keeps_every_weight_and_makes_all_progress_since_the_fork_its_part() -> None:
    gen = torch.Generator().manual_seed(3)
    own_anchor, weights = torch.randn(50, generator=gen), torch.randn(50, generator=gen)
    theirs = _snap(torch.randn(50, generator=gen), 9, B)
    job = SyncJob.taken(_snap(own_anchor, 4, A), weights.clone())
    rebased = job.rebased(theirs)
    # its part in the new history's next average: its weights against that history's anchor
    assert torch.allclose(rebased.pseudo, theirs.anchor - weights, atol=1e-6)
    assert rebased.steps == job.steps and torch.equal(job.pseudo, own_anchor - weights)  # the job is not touched
    # committed in the same round: the group's new anchor, plus what was trained after the job was taken
    later = weights + 0.01
    new = _snap(torch.randn(50, generator=gen), 10, B)
    after = weights_after(RoundOutcome(_report(True, True), rebased, new), later.clone())
    assert torch.allclose(after, new.anchor + 0.01, atol=1e-5)


def _merging_upper(
    states: dict[str, StateRecord], served: Snapshot, alive: set[str], clock: FakeClock
) -> tuple[CatchUpper, list[str], list[int]]:
    fetched: list[str] = []
    pings: list[int] = []

    class _Records:
        def __init__(self) -> None:
            self.states = states

        def refresh_state(self, revision: int, state_hash: str, origin: str = "") -> bool:
            return True

        def read_states(self) -> dict[str, StateRecord]:
            return self.states

    def fetch(donor: str, *_: object) -> Snapshot:
        fetched.append(donor)
        return served

    def live(peers: list[str], _timeout: float) -> set[str]:
        pings.append(len(peers))
        return alive & set(peers)

    records = cast(SyncRecords, _Records())
    upper = CatchUpper("me", records, fetch, OuterSyncConfig(), frozenset(), lambda *_: None, clock, live)
    return upper, fetched, pings


def test_a_peer_merges_once_two_checks_agree_then_waits_out_the_cooldown() -> None:
    own = torch.ones(100)
    snap = _snap(own, 5, A)
    theirs = _snap(own + 0.05, 12, B)
    states = {"x": _rec("x", B, 12, theirs.state_hash), "y": _rec("y", B, 12, theirs.state_hash)}
    clock = FakeClock(1000.0)
    upper, fetched, pings = _merging_upper(states, theirs, {"x", "y"}, clock)
    assert upper.catch_up(snap, lambda: False) is None  # one check names B: not yet
    clock.now += MERGE_CHECK_S / 2
    assert upper.catch_up(snap, lambda: False) is None and pings == [2]  # no second ping within MERGE_CHECK_S
    clock.now += MERGE_CHECK_S / 2
    got = upper.catch_up(snap, lambda: False)  # the second check agrees
    assert got is theirs and upper.merged and upper.merges == 1 and fetched == ["x"]
    assert upper.trusted() == {"x", "y"}  # its new history's live peers: it follows their later commits
    for _ in range(2):  # another (made-up) history now outnumbers this one: not within the cooldown
        clock.now += MERGE_CHECK_S
        assert upper.catch_up(snap, lambda: False) is None and not upper.merged
    clock.now = 1000.0 + 2 * MERGE_CHECK_S + MERGE_COOLDOWN_S
    assert upper.catch_up(snap, lambda: False) is None  # the cooldown is over: a first check
    clock.now += MERGE_CHECK_S
    assert upper.catch_up(snap, lambda: False) is theirs and upper.merges == 2
    fresh, _, _ = _merging_upper(states, theirs, set(), FakeClock(1000.0))
    assert fresh.catch_up(snap, lambda: False) is None  # nobody answers: nothing to merge into


def test_peers_that_read_the_records_a_moment_apart_do_not_swap_histories() -> None:
    """A bridge peer's record moving from one history to another must not make each side merge into the other."""
    own = torch.ones(100)
    snap = _snap(own, 5, B)
    theirs = _snap(own + 0.05, 12, A)
    first = {"x": _rec("x", A, 12, theirs.state_hash), "y": _rec("y", B, 5), "c": _rec("c", A, 12, theirs.state_hash)}
    clock = FakeClock(1000.0)
    upper, fetched, _ = _merging_upper(first, theirs, {"x", "y", "c"}, clock)
    assert upper.catch_up(snap, lambda: False) is None  # A leads, two to two, on the smaller origin
    upper._records.states = {**first, "c": _rec("c", B, 6)}  # the bridge joined B
    clock.now += MERGE_CHECK_S
    assert upper.catch_up(snap, lambda: False) is None and fetched == []  # B leads now: stays, nothing fetched


def test_a_made_up_history_far_from_this_peers_anchor_is_refused_and_not_downloaded_again_for_a_while() -> None:
    """Even with more live hosts than the island has peers, a made-up model is not taken as its anchor."""
    own = torch.ones(100)
    snap = _snap(own, 5, A)
    fake = _snap(-3.0 * own, 50, C)  # ~4 x this anchor's norm away: max_state_shift is 1
    states = {p: _rec(p, C, 50, fake.state_hash) for p in ("s1", "s2", "s3")}
    clock = FakeClock(1000.0)
    upper, fetched, _ = _merging_upper(states, fake, set(states), clock)
    assert upper.catch_up(snap, lambda: False) is None  # the first check
    clock.now += MERGE_CHECK_S
    with pytest.raises(StateDownloadFailed) as err:
        upper.catch_up(snap, lambda: False)
    assert not err.value.retry and upper.refusals == {CatchUpRefusal.TOO_FAR: 1} and upper.merges == 0
    for _ in range(3):
        clock.now += MERGE_CHECK_S
        assert upper.catch_up(snap, lambda: False) is None and fetched == ["s1"]  # shunned: not fetched again


def test_only_a_merge_moves_a_peer_across_histories() -> None:
    """A partner that merged first must not pull this peer back and forth: catch-up stays in its own history."""
    own = torch.ones(10)
    snap = _snap(own, 5, A)
    states = {"b": _rec("b", B, 40), "c": _rec("c", B, 40)}  # trusted partners, now in another history
    upper, _, _ = _merging_upper(states, snap, set(), FakeClock(1000.0))
    upper.add_partners(["b", "c"])
    assert upper.decide(snap).target is None
    assert not upper.orphaned(snap)  # nor do they count as strangers ahead of this history
    same = {"b": _rec("b", A, 40), "c": _rec("c", A, 40)}
    upper2, _, _ = _merging_upper(same, snap, set(), FakeClock(1000.0))
    upper2.add_partners(["b", "c"])
    target = upper2.decide(snap).target
    assert target is not None and target.revision == 40  # within its own history, catch-up as before
