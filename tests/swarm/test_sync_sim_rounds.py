"""Rules of the outer sync's rounds, on the simulated network (tests/swarm/test_sync_sim.py's members).

Each scenario ran over real hivemind processes before (tests/sync_worker.py peers): the gather
window's early close, a restart that forgot the rounds its earlier process voted for, and a
bootstrap peer frozen under its joiners. Here the members are real :class:`OuterSync` instances on
one virtual clock, so a scenario of a minute of virtual time takes a fraction of a second, and a
fault lands exactly at the round point it names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from swarm.sync import AbortCause, OuterSync, SyncReport
from swarm.sync.points import RoundPoint
from swarm.sync.records import ABORT_DIGEST
from tests.simnet import SimNet
from tests.swarm.test_sync_sim import CFG, WALL_S, Member, Plan, _histories, simulate


def _committed(m: Member) -> list[SyncReport]:
    return [r for r in m.reports if r.committed]


def _brief(reports: list[SyncReport]) -> list[tuple[int, bool, int, str]]:
    """What a failure shows of each round: (revision, committed, group size, cause)."""
    return [(r.revision, r.committed, r.group_size, r.cause.value if r.cause else r.outcome.value) for r in reports]


async def _until(condition: Callable[[], bool], limit_s: float, what: str) -> None:
    """Wait (virtual time, on the loop) until ``condition`` holds; fail after ``limit_s`` virtual seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not condition():
        assert loop.time() < end, f"no {what} within {limit_s} virtual s"
        await asyncio.sleep(0.1)


WINDOW_S = 8.0
"""A long gather window: a sync that waits it out takes over 8 s."""


def test_the_window_closes_early_once_every_expected_member_joined(tmp_path: Path) -> None:
    """Three members sync three times with an 8 s gather window. Each expects the peers whose state records
    report its own state (all start from the same weights, so the first round too) and the joiners of its
    last round, closes its join record once they joined, and the group is decided as soon as every record
    of the window is closed: a whole sync takes well under half the window (with the close off, each takes
    the whole window)."""
    cfg = replace(CFG, matchmaking_timeout_s=WINDOW_S)
    members, _, wall = simulate(tmp_path, ["a", "b", "c"], Plan(rounds=3, train_s=0.2), cfg=cfg)
    took = sorted(r.sync_s for m in members.values() for r in m.reports)
    print(f"window {WINDOW_S} s: syncs took {[round(t, 3) for t in took]}; {wall:.3f} s wall")
    for m in members.values():
        assert [r.committed for r in m.reports] == [True, True, True], _brief(m.reports)
        assert all(r.group_size == 3 for r in m.reports), _brief(m.reports)
    assert max(took) < WINDOW_S / 2, took
    assert all(len(h) == 1 for h in _histories(list(members.values())).values())
    assert len({m.states[-1] for m in members.values()}) == 1  # the survivors hold one state
    assert wall < WALL_S


def test_a_restart_skips_every_revision_its_earlier_process_voted_for(tmp_path: Path) -> None:
    """The 30-minute chaos run of seed 41 forked so: a member voted for revision 38, was frozen and killed
    before it recorded the commit its partner made, and restarted from a checkpoint older than the vote;
    its partner died too, and the records of those rounds with them. Here: a pair commits up to revision
    3, b frozen right after its vote for 3 (so it never learns of the commit a makes); both are killed,
    so no record of 1-3 survives anywhere but in the members' journals; both restart at revision 0 (no
    checkpoint) with other training. Their journals make their first commit skip past every revision they
    voted for, so no revision ever names two states (journals off: they commit a second revision 1)."""

    def freeze_b_after_its_vote(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        def observe(point: RoundPoint, revision: int) -> None:
            if point is RoundPoint.VOTED and revision == 2 and not m.restarts:
                net.loop.call_soon_threadsafe(net.freeze, m.peer)

        return observe

    async def kill_both_then_restart(net: SimNet, members: dict[str, Member]) -> None:
        a, b = members["a"], members["b"]
        await _until(lambda: any(r.revision == 3 for r in _committed(a)), 60.0, "commit of revision 3 by a")
        assert not any(r.revision == 3 for r in _committed(b))  # b never learned of it
        for m in (a, b):
            net.crash(m.peer)
        await asyncio.sleep(2.0)
        for m in (a, b):  # nothing of revisions 1-3 is left in the records: both replicas went with them
            m.checkpoint = None  # a restart from before the votes: the same knowledge as no checkpoint
            assert m.restart is not None
            m.restart()

    plan = Plan(for_s=40.0, period_s=3.0)
    members, net, wall = simulate(
        tmp_path, ["a", "b"], plan, kill_both_then_restart, observers={"b": freeze_b_after_its_vote}
    )
    a, b = members["a"], members["b"]
    print(f"restart that forgot: {wall:.3f} s wall\n" + "\n".join(net.trace))
    for m in (a, b):
        print(m.name, m.restarts, _brief(m.reports))
    assert [m.restarts[0].journalled[-1] for m in (a, b)] == [3, 3], (a.restarts, b.restarts)
    firsts = [next((r for r in m.reports[m.restarts[0].reports :] if r.committed), None) for m in (a, b)]
    assert all(r is not None and r.revision > 3 and r.group_size == 2 for r in firsts), _brief(a.reports + b.reports)
    assert all(len(h) == 1 for h in _histories([a, b]).values()), _histories([a, b])
    assert a.states[-1] == b.states[-1]  # the restarted pair ends on one state
    assert wall < 2 * WALL_S


@pytest.mark.parametrize("when", ["after_a_sync", "before_any_sync"])
def test_joiners_sync_on_when_their_only_bootstrap_peer_freezes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """b, c and d join through boot only; boot freezes (SIGSTOP-like) after a commit with them, or before
    its first sync. The joiners commit on as three, on one history. Frozen after a commit with them, boot
    resumes merely behind and catches up to their state; frozen before its first commit it trusts no one
    (a stranger's claim must not move a founder): it stays at revision 0, starts no history of its own
    (nobody shares its state) and says what the operator does about it."""
    boot_frozen: list[float] = []

    def freeze_boot_first(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:  # its sync is up (its state published) and it has not synced
            net.loop.call_soon_threadsafe(net.freeze, m.peer)
            net.loop.call_soon_threadsafe(lambda: boot_frozen.append(net.loop.time()))

        return setup

    async def freeze_then_thaw(net: SimNet, members: dict[str, Member]) -> None:
        boot, joiners = members["boot"], [members[n] for n in "bcd"]
        if when == "after_a_sync":
            await _until(lambda: any(r.group_size == 4 for r in _committed(joiners[0])), 30.0, "4-member commit")
            net.freeze(boot.peer)
            boot_frozen.append(net.loop.time())
        await _until(lambda: bool(boot_frozen), 1.0, "freeze")
        without = boot_frozen[0]
        await _until(
            lambda: all(any(r.group_size == 3 and r.time > without for r in _committed(j)) for j in joiners),
            30.0,
            "commit of every joiner without boot",
        )
        net.thaw(boot.peer)

    setups: dict[str, Callable[[SimNet, Member], Callable[[OuterSync], None]]] = {}
    if when == "before_any_sync":
        setups["boot"] = freeze_boot_first
    with caplog.at_level(logging.INFO, logger="swarm.sync"):
        members, net, wall = simulate(
            tmp_path, ["boot", "b", "c", "d"], Plan(for_s=50.0, period_s=3.0), freeze_then_thaw, setups=setups
        )
    boot, joiners = members["boot"], [members[n] for n in "bcd"]
    print(f"bootstrap frozen {when}: {wall:.3f} s wall\n" + "\n".join(net.trace))
    for m in members.values():
        print(m.name, _brief(m.reports))
    assert all(len(h) == 1 for h in _histories(list(members.values())).values())
    assert len({j.reports[-1].origin for j in joiners}) == 1  # one history, not islands
    assert len({j.states[-1] for j in joiners}) == 1 and all(j.reports[-1].committed for j in joiners)
    newest = max(j.states[-1] for j in joiners)
    if when == "after_a_sync":
        assert any(r.caught_up for r in boot.reports), _brief(boot.reports)  # behind after it resumed: caught up
        assert boot.states[-1] == newest and boot.reports[-1].committed, (boot.states[-1], newest)
    else:
        assert boot.states[-1][0] == 0 and not _committed(boot), _brief(boot.reports)
        said = [r.getMessage() for r in caplog.records if boot.peer[-6:] in r.getMessage()]
        assert any("restart it with --peer" in line for line in said), said
    assert wall < 5 * WALL_S  # 4 members, 50 virtual s: ~1-3 s under a load of 15


def test_a_member_asked_to_leave_before_voting_ends_the_round_for_everyone(tmp_path: Path) -> None:
    """c is asked to leave right after its second all-reduce: it votes abort, and nobody applies that round.

    A node asked to leave by a signal to its process group has lost its p2pd: had it voted and read its
    (now local, stale) votes, it could commit while its partners, seeing no vote and no ping answer,
    abort: both forks of a 30-minute chaos run. Defence off (c votes its digest): all three commit it.
    """
    syncs: list[OuterSync] = []

    def keep(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        return syncs.append

    def leave(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        def observe(point: RoundPoint, revision: int) -> None:
            if point is RoundPoint.ALLREDUCED and revision == 1:  # the leave request arrives mid-round
                syncs[0].cancel()

        return observe

    cfg = replace(CFG, allreduce_timeout_s=15.0)
    members, net, wall = simulate(
        tmp_path, ["a", "b", "c"], Plan(rounds=3, train_s=0.2), observers={"c": leave}, setups={"c": keep}, cfg=cfg
    )
    a, b, c = members["a"], members["b"], members["c"]
    print(f"leave before the vote: {wall:.3f} s wall\n" + "\n".join(net.trace))
    second = [m.reports[1] for m in (a, b, c)]
    assert all(r.group_size == 3 and not r.committed for r in second), _brief(second)
    assert second[2].cause is AbortCause.SHUTTING_DOWN, _brief(second)
    later = [r for m in (a, b) for r in m.reports[2:]]
    assert later and all(r.committed and r.group_size == 2 for r in later), _brief(later)
    assert all(len(h) == 1 for h in _histories([a, b, c]).values())
    assert a.states[-1] == b.states[-1]
    assert wall < WALL_S


VETOED = "kept aborting rounds the others would commit"
"""What a report names a vetoer as (swarm.sync.robust.Suspicion.VETOED)."""


def test_a_member_that_always_votes_abort_is_left_out_after_three_vetoes(tmp_path: Path) -> None:
    """m votes abort in every round it joins, whatever its average (its records are its own): the honest pair
    counts its vetoes (swarm.sync.vetoes) and, at the third, leaves it out of its groups and never trusts it;
    then it commits as a pair, one state per revision (tally off: every round with m aborts)."""
    trusted: dict[str, list[frozenset[str]]] = {"a": [], "b": []}

    def watch_trust(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:
            honest = sync.sync_now

            def sync_now(inner_step: int | None = None) -> SyncReport:
                report = honest(inner_step)
                trusted[m.name].append(sync.trusted())  # whom each sync left it trusting
                return report

            sync.sync_now = sync_now  # type: ignore[method-assign]  # a test's window on each round

        return setup

    def always_veto(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:
            records = sync._records
            honest = records.vote
            records.vote = lambda plan, digest: honest(plan, ABORT_DIGEST)  # type: ignore[method-assign]

        return setup

    setups = {"a": watch_trust, "b": watch_trust, "m": always_veto}
    members, net, wall = simulate(tmp_path, ["a", "b", "m"], Plan(rounds=7, train_s=0.2), setups=setups)
    attacker = members["m"].peer
    print(f"vetoes: {wall:.3f} s wall\n" + "\n".join(net.trace))
    for name in "ab":
        reports = members[name].reports
        print(name, _brief(reports))
        vetoed = [r for r in reports if r.cause is AbortCause.ABORTED_BY_MEMBER]
        assert len(vetoed) <= 3, _brief(reports)  # excluded within a bounded number of rounds
        named = [r for r in reports if r.suspects.get(attacker) == VETOED]
        assert len(named) == 1, _brief(reports)
        later = reports[reports.index(named[0]) + 1 :]
        assert sum(r.committed for r in later) >= 2, _brief(reports)
        assert all(r.group_size == 2 for r in later if r.committed), _brief(reports)
        assert len(trusted[name]) == len(reports) and not any(attacker in t for t in trusted[name])
    assert all(len(h) == 1 for h in _histories([members["a"], members["b"]]).values())
    assert members["a"].states[-1] == members["b"].states[-1]
    assert not _committed(members["m"]), _brief(members["m"].reports)
    assert wall < 2 * WALL_S
