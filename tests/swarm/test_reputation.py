"""Per-publisher reputation (swarm/reputation.py): pure, fake clock, no network."""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

import pytest

from swarm.reputation import PENALTY, Offence, Reputation, ReputationConfig, Standing

T0 = 1_000_000.0
GOOD, BAD, ODD = "12D3KooWgood", "12D3KooWbad", "12D3KooWodd"


def _rep(**kw: Any) -> Reputation:
    return Reputation(ReputationConfig(**kw))


@pytest.mark.parametrize(
    ("field", "value"),
    [("exploration_slots", -1), ("half_life_s", 0), ("ban_threshold", 0), ("ban_s", -5), ("max_tracked", 3)],
)
def test_config_rejects_bad_values_with_the_fix(field: str, value: float) -> None:
    bad: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=f"{field}=.*; use"):
        ReputationConfig(**bad)


def test_lies_weigh_more_than_slowness_and_slowness_more_than_absence() -> None:
    assert PENALTY[Offence.DIGEST_MISMATCH] > PENALTY[Offence.TOO_SLOW] > PENALTY[Offence.UNREACHABLE]
    assert PENALTY[Offence.REFUSED_CONTENT] > PENALTY[Offence.TOO_SLOW]
    rep = _rep()
    rep.penalize("a", Offence.UNREACHABLE, T0)
    rep.penalize("b", Offence.TOO_SLOW, T0)
    rep.penalize("c", Offence.DIGEST_MISMATCH, T0)
    assert rep.score("c", T0) < rep.score("b", T0) < rep.score("a", T0) < 0
    assert rep.standing("a", T0) is Standing.POOR and rep.standing("nobody", T0) is Standing.UNKNOWN


def test_informative_groups_earn_more_than_merely_valid_ones() -> None:
    rep = _rep()
    rep.judge("useful", T0, accepted=4, informative=4, refused=0)
    rep.judge("valid", T0, accepted=4, informative=0, refused=0)
    assert rep.score("useful", T0) > rep.score("valid", T0) > 0
    # credit per judgement is capped: a huge batch of cheap groups does not buy a top score
    rep.judge("bulk", T0, accepted=64, informative=64, refused=0)
    assert rep.score("bulk", T0) <= 4.0


def test_refusals_cost_in_proportion_and_bad_counts_are_refused() -> None:
    rep = _rep()
    rep.judge("mostly-good", T0, accepted=15, informative=8, refused=1)
    rep.judge("all-bad", T0, accepted=0, informative=0, refused=8)
    assert rep.score("mostly-good", T0) > 0
    assert rep.score("all-bad", T0) == -PENALTY[Offence.REFUSED_CONTENT]
    with pytest.raises(ValueError, match="informative <= accepted"):
        rep.judge("x", T0, accepted=1, informative=2, refused=0)


def test_scores_decay_with_the_half_life() -> None:
    rep = _rep(half_life_s=100.0)
    rep.penalize(BAD, Offence.TOO_SLOW, T0)
    rep.judge(GOOD, T0, accepted=2, informative=2, refused=0)
    assert rep.score(BAD, T0 + 100) == pytest.approx(-PENALTY[Offence.TOO_SLOW] / 2)
    assert rep.score(GOOD, T0 + 200) == pytest.approx(2.0 / 4)
    assert rep.standing(GOOD, T0 + 10_000) is Standing.UNKNOWN  # old merit fades away
    assert rep.score(BAD, T0 - 50) == -PENALTY[Offence.TOO_SLOW]  # a clock stepping back inflates nothing


def test_persistent_offender_is_banned_once_with_its_reason_and_the_ban_expires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rep = _rep(ban_threshold=8.0, ban_s=600.0)
    caplog.set_level(logging.WARNING, logger="swarm.reputation")
    assert rep.penalize(BAD, Offence.TOO_SLOW, T0) is None
    assert rep.penalize(BAD, Offence.TOO_SLOW, T0 + 1) is None
    assert rep.banned(BAD, T0 + 1) is None
    assert rep.penalize(BAD, Offence.TOO_SLOW, T0 + 2) is Offence.TOO_SLOW  # -9 <= -8: banned
    assert rep.banned(BAD, T0 + 3) is Offence.TOO_SLOW and rep.standing(BAD, T0 + 3) is Standing.BANNED
    assert rep.penalize(BAD, Offence.DIGEST_MISMATCH, T0 + 4) is None  # already banned: no second ban
    bans = [r for r in caplog.records if "banned publisher" in r.getMessage()]
    assert len(bans) == 1 and "too slow" in bans[0].getMessage()
    assert rep.banned(BAD, T0 + 2 + 599) is Offence.TOO_SLOW
    assert rep.banned(BAD, T0 + 2 + 600) is None  # the ban is over
    summary = rep.summary(T0 + 3)
    assert summary == {"tracked": 1, "banned": 1, "bans_by_reason": {"too slow": 1}}
    assert json.loads(json.dumps(summary)) == summary
    assert rep.summary(T0 + 700)["banned"] == 0


def test_two_lies_ban_but_honest_peers_recover_from_a_bad_moment() -> None:
    rep = _rep()
    rep.penalize(BAD, Offence.DIGEST_MISMATCH, T0)
    assert rep.penalize(BAD, Offence.DIGEST_MISMATCH, T0 + 30) is Offence.DIGEST_MISMATCH
    rep.judge(GOOD, T0, accepted=4, informative=2, refused=0)
    rep.penalize(GOOD, Offence.UNREACHABLE, T0 + 30)  # a restart
    assert rep.standing(GOOD, T0 + 30) is Standing.GOOD
    rep.penalize(ODD, Offence.UNREACHABLE, T0)
    rep.delivered(ODD, T0 + 1)
    rep.judge(ODD, T0 + 1, accepted=2, informative=1, refused=0)
    assert rep.standing(ODD, T0 + 1) is Standing.GOOD


def test_memory_is_bounded_at_100k_keys_and_good_publishers_are_kept() -> None:
    rep = _rep(max_tracked=4096)
    rep.judge(GOOD, T0, accepted=8, informative=8, refused=0)
    rep.judge(ODD, T0, accepted=2, informative=0, refused=0)
    t = time.perf_counter()
    for i in range(100_000):
        rep.penalize(f"sybil-{i}", Offence.UNREACHABLE if i % 2 else Offence.FUTURE_DATED, T0 + i * 1e-3)
    elapsed = time.perf_counter() - t
    assert len(rep) <= 4096
    assert rep.standing(GOOD, T0 + 100) is Standing.GOOD and rep.standing(ODD, T0 + 100) is Standing.GOOD
    assert elapsed < 10.0, elapsed  # measured ~1 s: forgetting is amortised, not a scan per key


def test_choose_puts_good_first_then_exploration_then_poor() -> None:
    rep = _rep(exploration_slots=2)
    for peer, informative in (("g1", 4), ("g2", 1)):
        rep.judge(peer, T0, accepted=4, informative=informative, refused=0)
    rep.penalize("p1", Offence.UNREACHABLE, T0)
    rep.penalize("p2", Offence.TOO_SLOW, T0)
    rep.penalize("banned", Offence.DIGEST_MISMATCH, T0)
    rep.penalize("banned", Offence.DIGEST_MISMATCH, T0)
    unknown = [f"u{i}" for i in range(50)]
    pubs = ["p2", "banned", *unknown, "p1", "g2", "g1"]
    order = rep.choose(pubs, T0, limit=10, live=set(), rng=random.Random(1))
    assert set(order[:2]) == {"g1", "g2"}
    assert all(p.startswith("u") for p in order[2:4])
    assert order[4:] == ["p1", "p2"]  # poor ones last, best first; unknowns beyond the quota wait
    assert "banned" not in order
    assert rep.choose(pubs, T0, limit=3, live=set(), rng=random.Random(1))[:2] == order[:2]


def test_choose_prefers_live_unknowns_and_lets_them_fill_free_slots() -> None:
    rep = _rep(exploration_slots=2)
    unknown = [f"u{i}" for i in range(300)]
    live = {"u7", "u70", "u170", "u270"}
    order = rep.choose(unknown, T0, limit=8, live=live, rng=random.Random(2))
    assert set(order) == live  # quota first from the live ones, then the other live ones fill free slots
    order = rep.choose(unknown, T0, limit=8, live=set(), rng=random.Random(2))
    assert len(order) == 2  # no live hint: a flood of fresh keys gets the exploration slots, no more


def test_choose_weights_good_publishers_by_score() -> None:
    rep = _rep()
    rep.judge("best", T0, accepted=4, informative=4, refused=0)
    rep.judge("meh", T0, accepted=4, informative=0, refused=0)
    firsts = [rep.choose(["meh", "best"], T0, limit=2, live=set(), rng=random.Random(s))[0] for s in range(400)]
    share = firsts.count("best") / len(firsts)
    assert 0.8 < share < 0.99, share  # scores 4.0 vs 0.4: "best" first ~91% of the time, "meh" not starved
