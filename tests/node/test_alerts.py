"""The once-only warnings: alone in the swarm, the last peer gone, outer syncs without a partner (fake clock)."""

from __future__ import annotations

import logging

from node.observe.alerts import (
    ALONE_AFTER_S,
    NO_PARTNER_SYNCS,
    QUIET_ROUNDS,
    YIELDED_SYNCS,
    Alert,
    Edge,
    Latch,
    NoPartnerWhy,
    PeerWatch,
    no_partner_why,
)


def _run(watch: PeerWatch, start: float, end: float, step: float = 1.0, **kw: object) -> list[Alert]:
    """``check`` once a simulated second from ``start`` to ``end``; the lines it gave."""
    out, t = [], start
    while t <= end:
        alert = watch.check(t, **kw)  # type: ignore[arg-type]
        if alert is not None:
            out.append(alert)
        t += step
    return out


def test_latch_raises_after_its_grace_once_and_clears_once() -> None:
    latch = Latch(grace_s=5.0)
    assert [latch.update(True, t) for t in (0.0, 4.9)] == [None, None]
    assert latch.update(True, 5.0) is Edge.RAISED
    assert latch.update(True, 50.0) is None, "never repeated while the condition holds"
    assert latch.update(False, 51.0) is Edge.CLEARED
    assert latch.update(False, 52.0) is None
    assert latch.update(True, 53.0) is None, "the grace starts over"


def test_a_joiner_connected_to_another_swarm_is_told_to_check_swarm_id() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0, joined_through=1)
    assert _run(watch, 0.0, ALONE_AFTER_S - 1, connected=2) == []
    lines = _run(watch, ALONE_AFTER_S, 10 * ALONE_AFTER_S, connected=2)
    assert len(lines) == 1, "one line, not one per round"
    assert lines[0].level == logging.WARNING
    assert "connected to 2 peer(s)" in lines[0].text and "--swarm-id" in lines[0].text and "'mine'" in lines[0].text


def test_a_joiner_with_no_connection_is_told_to_check_its_peer() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0, joined_through=1)
    (line,) = _run(watch, 0.0, 2 * ALONE_AFTER_S, connected=0)
    assert line.level == logging.WARNING and "--peer" in line.text


def test_a_first_node_waiting_for_joiners_is_told_at_info_and_cleared_when_one_comes() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    (line,) = _run(watch, 0.0, 2 * ALONE_AFTER_S, connected=0)
    assert line.level == logging.INFO
    watch.hear("peer-b", "tiny-s", 2 * ALONE_AFTER_S + 1)
    cleared = watch.check(2 * ALONE_AFTER_S + 1)
    assert cleared is not None and cleared.level == logging.INFO and "hearing 1 peer" in cleared.text


def test_the_last_peer_gone_warns_once_and_its_return_clears_it() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    for t in range(10):  # a peer heard every second
        watch.hear("peer-b-abcdef", "tiny-s", float(t))
        assert watch.check(float(t)) is None
    lines = _run(watch, 10.0, 10.0 + 5 * ALONE_AFTER_S)
    assert len(lines) == 1
    assert lines[0].level == logging.WARNING and "last peer" in lines[0].text and "abcdef" in lines[0].text
    assert lines[0].text.count("alone") == 1
    back = 11.0 + 5 * ALONE_AFTER_S
    watch.hear("peer-b-abcdef", "tiny-s", back)
    cleared = watch.check(back)
    assert cleared is not None and "hearing 1 peer" in cleared.text
    assert watch.check(back + 1) is None


def test_a_peer_quiet_within_a_few_slow_rounds_is_not_gone() -> None:
    round_s = 2 * ALONE_AFTER_S  # a real model on a CPU: one batch every two minutes
    watch = PeerWatch("mine", "big", started=0.0)
    watch.hear("peer-b", "big", 0.0)
    assert _run(watch, 0.0, (QUIET_ROUNDS - 0.5) * round_s, step=round_s / 4, round_s=round_s) == []
    assert len(_run(watch, QUIET_ROUNDS * round_s, 8 * round_s, step=round_s / 4, round_s=round_s)) == 1


def test_why_no_partner_from_the_models_heard() -> None:
    assert no_partner_why("a", []) is NoPartnerWhy.NO_PEER
    assert no_partner_why("a", [""]) is NoPartnerWhy.NO_PEER, "a peer whose model is unknown says nothing"
    assert no_partner_why("a", ["b", "c"]) is NoPartnerWhy.OTHER_MODEL
    assert no_partner_why("a", ["b", "a"]) is NoPartnerWhy.OTHER_SETTINGS


def _syncs(watch: PeerWatch, partners: list[bool], t0: float = 0.0) -> list[Alert]:
    return [a for i, p in enumerate(partners) if (a := watch.synced(p, t0 + i)) is not None]


def test_no_partner_says_the_other_model_once_after_a_few_syncs() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    watch.hear("peer-b", "tiny-m", 0.0)
    assert _syncs(watch, [False] * (NO_PARTNER_SYNCS - 1)) == [], "the first syncs may just come early"
    lines = _syncs(watch, [False] * 20, t0=NO_PARTNER_SYNCS)
    assert len(lines) == 1
    assert "another model (tiny-m)" in lines[0].text and "--model" in lines[0].text


def test_no_partner_names_the_outer_settings_when_the_same_model_is_heard() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    watch.hear("peer-b", "tiny-s", 0.0)
    (line,) = _syncs(watch, [False] * NO_PARTNER_SYNCS)
    assert "--outer-lr" in line.text and "--sync-compression" in line.text


def test_no_partner_clears_once_a_sync_meets_one_and_a_single_miss_says_nothing() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    (raised,) = _syncs(watch, [False] * NO_PARTNER_SYNCS)
    assert "no peer of this swarm" in raised.text
    (cleared,) = _syncs(watch, [True, True], t0=10.0)
    assert "found a partner again" in cleared.text
    assert _syncs(watch, [False, True, False, True], t0=20.0) == []


def test_a_node_that_collects_nothing_is_never_called_alone_and_says_it_cannot_tell_why() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0, joined_through=1, hears=False)
    assert _run(watch, 0.0, 10 * ALONE_AFTER_S, connected=3) == []
    (line,) = _syncs(watch, [False] * NO_PARTNER_SYNCS)
    assert "--external 0" in line.text and "cannot tell why" in line.text


def test_no_partner_is_said_again_only_when_its_reason_changes() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0)
    (alone,) = _syncs(watch, [False] * NO_PARTNER_SYNCS)
    assert "no peer of this swarm" in alone.text
    watch.hear("peer-b", "tiny-m", 5.0)  # a peer of another model joins: the reason is now another one
    (other,) = _syncs(watch, [False] * 10, t0=5.0)
    assert "another model (tiny-m)" in other.text


def test_a_node_that_keeps_waiting_for_other_groups_warns_once_naming_the_fix() -> None:
    watch = PeerWatch("mine", "tiny-s", started=0.0, joined_through=1)
    said = [a for i in range(3 * YIELDED_SYNCS) if (a := watch.yielded(True, float(i))) is not None]
    assert [a.level for a in said] == [logging.WARNING] and "--sync-window" in said[0].text
    again = watch.yielded(False, 100.0)
    assert again is not None and again.level == logging.INFO
    # a race lost now and then says nothing
    assert all(watch.yielded(i % 3 == 0, 200.0 + i) is None for i in range(4 * YIELDED_SYNCS))
