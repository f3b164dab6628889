"""Counting vetoes: a member that keeps aborting rounds the others would commit (swarm.sync.vetoes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from swarm.membership import Membership
from swarm.sync.allreduce import RoundPlan
from swarm.sync.config import OuterSyncConfig
from swarm.sync.dhtio import SyncRecords
from swarm.sync.liveness import Prober
from swarm.sync.records import ABORT_DIGEST, VoteRecord
from swarm.sync.vetoes import MAX_TRACKED, VetoTally, vetoers

D = "d" * 64


def test_an_abort_is_a_veto_only_when_every_other_vote_seen_agreed_with_mine() -> None:
    members = ["me", "b", "v"]
    assert vetoers({"me": D, "b": D, "v": ABORT_DIGEST}, members, "me") == ("v",)
    assert vetoers({"me": D, "v": ABORT_DIGEST}, members, "me") == ("v",)  # b's vote not read yet
    assert vetoers({"me": D, "b": "e" * 64, "v": ABORT_DIGEST}, members, "me") == ()  # the average was in doubt
    assert vetoers({"me": ABORT_DIGEST, "v": ABORT_DIGEST}, members, "me") == ()  # I aborted too
    assert vetoers({"me": D, "x": ABORT_DIGEST}, members, "me") == ()  # not a member of this round


def test_three_vetoes_in_five_shared_rounds_and_no_fewer() -> None:
    tally = VetoTally(limit=3, span=5)
    members = ["me", "b", "v"]
    pattern = [True, False, True, False, False, True]  # 2 of any 5 at most until the sixth
    got = [tally.observe(members, "me", ["v"] if vetoed else []) for vetoed in pattern]
    assert got == [[], [], [], [], [], []]  # the first veto fell out of the last five before the third came
    assert tally.observe(members, "me", ["v"]) == ["v"]  # rounds 3-7: vetoes at 3, 6 and 7
    assert tally.count("v") == 0 and tally.count("b") == 0  # counted afresh after a ban


def test_memory_is_bounded_whatever_the_number_of_keys() -> None:
    tally = VetoTally()
    for i in range(MAX_TRACKED + 500):
        tally.observe(["me", f"k{i}"], "me", [f"k{i}"])
    assert len(tally._history) == MAX_TRACKED


def test_limit_must_fit_the_span() -> None:
    with pytest.raises(ValueError, match="limit"):
        VetoTally(limit=6, span=5)


class _Votes(SyncRecords):
    """SyncRecords whose reads return scripted votes and whose pings nobody answers, on a fake clock."""

    def __init__(self, reads: list[dict[str, str]]) -> None:
        membership = SimpleNamespace(peer_id="me", cfg=SimpleNamespace(swarm_id="s"), dht=None)
        self.now = 0.0
        super().__init__(cast(Membership, membership), "f" * 16, OuterSyncConfig(), lambda: self.now, self._tick)
        self._reads = reads

    def _tick(self, s: float) -> None:
        self.now += max(s, 0.01)

    def _store(self, *_: Any, **__: Any) -> bool:  # no DHT: nothing this peer publishes gets out
        return False

    def read_votes(self, plan: RoundPlan) -> dict[str, VoteRecord]:
        votes = self._reads.pop(0) if len(self._reads) > 1 else self._reads[0]
        return {p: VoteRecord(p, self.fingerprint, plan.revision, plan.group_id, d, self.now) for p, d in votes.items()}


class _NobodyAnswers:
    timeout_s = 1.0

    def check(self, peers: object, timeout: float) -> set[str]:
        return set()


PLAN = RoundPlan("g" * 32, 0, ("me", "b", "v"), 10, "none", "mean", 0.0, 0.0)


@pytest.mark.parametrize("own_vote_read", [True, False])
def test_the_vetoer_is_named_when_a_read_misses_my_own_vote(own_vote_read: bool) -> None:
    records = _Votes([{"me": D, "v": ABORT_DIGEST} if own_vote_read else {"v": ABORT_DIGEST}])
    records.vote(PLAN, D)  # stored nowhere (no DHT): the read misses it unless scripted
    verdict = records.await_commit(PLAN, deadline=30.0)
    assert (verdict.commit, verdict.vetoers) == (False, ("v",))


def test_the_vetoer_is_named_when_the_abort_is_read_after_a_ping_went_unanswered() -> None:
    """Under load a slow partner misses its pings; the read that follows shows the veto: it still counts."""
    records = _Votes([{"me": D}, {"me": D}, {"me": D}, {"me": D, "v": ABORT_DIGEST}])
    records.vote(PLAN, D)
    verdict = records.await_commit(PLAN, 30.0, cast(Prober, _NobodyAnswers()))
    assert (verdict.commit, verdict.reason, verdict.vetoers) == (False, "aborted by a member", ("v",))


def test_my_own_abort_still_names_nobody() -> None:
    records = _Votes([{"v": ABORT_DIGEST}])
    records.vote(PLAN, ABORT_DIGEST)
    assert records.await_commit(PLAN, 30.0).vetoers == ()
