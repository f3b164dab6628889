"""Counting vetoes: a member that keeps aborting rounds the others would commit (swarm.sync.vetoes)."""

from __future__ import annotations

import pytest

from swarm.sync.records import ABORT_DIGEST
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
