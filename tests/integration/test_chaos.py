"""Chaos: real nodes killed, frozen, stopped and spawned at random must keep training and syncing on one history.

The run itself is bench/chaos.py; here a 3-minute run must pass every criterion,
forks included: a revision committed with two states by groups that could reach
each other fails, as do islands that met and did not merge within 60 s, and nodes
that reached each other a minute before the end but ended on different histories
(bench/chaos_forks.py). The pure judges it relies on must flag what they are there
to flag. The run also prints the groups some members applied and others aborted
(split): the aborting side skips the revision it voted for, so they do not fork.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import pytest

from bench.chaos import (
    Action,
    Cause,
    Chaos,
    ChaosConfig,
    ChaosReport,
    Member,
    choose_action,
    exit_expected,
    judge,
    longest_gap,
    run_chaos,
    split_groups,
)
from bench.chaos_forks import ForkKind, apart_at_end, classify_forks, genesis
from tests.procs import Proc, Procs

CHAOS_S = 180.0  # with start-up and the final SIGTERMs the test stays under 4 minutes


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.timeout(320)
def test_chaos_run_keeps_training_and_syncing(tmp_path: Path) -> None:
    report = run_chaos(ChaosConfig(out=tmp_path / "chaos", duration_s=CHAOS_S, nodes=4, seed=16))
    print(report.to_json())
    print(f"forks: {len(report.forks)} of {len(report.revisions)} revisions; states extended twice: {report.branches}")
    print(f"forks classified: {report.fork_kinds}; histories from revision 0: {report.genesis}")
    print(f"groups applied by some members only: {report.split}")
    assert report.ok, "\n".join(report.failures)
    assert sum(report.actions.values()) >= CHAOS_S / 6, report.actions  # the chaos did happen (one per 1-3 s)


def test_longest_gap_counts_the_edges_of_the_window() -> None:
    assert longest_gap([], 10.0, 70.0) == (60.0, 10.0)
    assert longest_gap([20.0, 25.0, 90.0], 10.0, 70.0) == (45.0, 25.0)


def _sync(
    t: float, rev: int, h: str, committed: bool = True, group: str = "", peer: str = "", parent: str = ""
) -> dict[str, object]:
    group = group or f"g{rev}{h}"
    return {"event": "sync", "time": t, "revision": rev, "state_hash": h, "committed": committed,
            "group_id": group, "peer": peer, "parent": parent}  # fmt: skip


def _chain(
    peers: list[str], hashes: list[str], t0: float, root: str = "00", dt: float = 5.0
) -> list[dict[str, object]]:
    """Commits of one branch: revision i + 1 is ``hashes[i]``, committed by every peer in ``peers``."""
    parents = [root, *hashes]
    return [_sync(t0 + i * dt, i + 1, h, peer=p, parent=parents[i]) for i, h in enumerate(hashes) for p in peers]


def _ingest(t: float, me: str, other: str) -> dict[str, object]:
    return {"event": "round", "time": t, "peer": me, "external_peers": {other: 1}}


def test_a_fork_between_groups_that_reached_each_other_fails_and_an_island_that_merged_does_not() -> None:
    a, b = ["p-aaaaaa", "p-bbbbbb"], ["p-cccccc", "p-dddddd"]
    island = [*_chain(a, ["a1", "a2", "a3", "a4"], 10.0), *_chain(b, ["b1", "b2"], 11.0)]
    island += [_sync(30.0, 5, "a5", peer=p, parent="a4") for p in [*a, *b]]  # b's members moved to a's branch
    met_late = [_ingest(25.0, "p-cccccc", "p-aaaaaa")]  # first contact after the fork: 5 s before the merge
    forks = classify_forks(island, met_late, 0.0, 100.0)
    assert [(f.revision, f.kind, f.contact_s, f.merged_s) for f in forks] == [
        (1, ForkKind.ISLAND, 25.0, 16.0),
        (2, ForkKind.ISLAND, 25.0, 16.0),
    ]
    assert all(f.problem(100.0) is None for f in forks)
    assert genesis(island) == {"00"}
    met_early = [_ingest(8.0, "p-cccccc", "p-aaaaaa")]  # they reached each other just before the fork
    connected = classify_forks(island, met_early, 0.0, 100.0)
    assert connected[0].kind is ForkKind.CONNECTED and connected[0].problem(100.0) is not None


def test_islands_that_met_and_both_grew_on_for_a_minute_fail() -> None:
    a, b = ["p-aaaaaa", "p-bbbbbb"], ["p-cccccc", "p-dddddd"]
    both = [*_chain(a, [f"a{i}" for i in range(1, 20)], 10.0), *_chain(b, [f"b{i}" for i in range(1, 20)], 11.0)]
    forks = classify_forks(both, [_ingest(20.0, "p-cccccc", "p-bbbbbb")], 0.0, 110.0)
    assert forks[0].kind is ForkKind.ISLAND and forks[0].merged_s is None
    assert forks[0].problem(110.0) == (
        "revision 1 committed with 2 state hashes ['a1', 'b1'] (islands) met at t=20s and never merged"
    )
    never_met = classify_forks(both, [], 0.0, 110.0)
    assert never_met[0].contact_s is None and never_met[0].problem(110.0) is None
    two_roots = [*_chain(a, ["a1"], 1.0, root="r1"), *_chain(b, ["b1"], 1.0, root="r2")]
    assert genesis(two_roots) == {"r1", "r2"}


def test_judge_flags_two_hashes_at_one_revision_and_the_gaps(tmp_path: Path) -> None:
    cfg = ChaosConfig(out=tmp_path)
    agreed = [_sync(10.0, 1, "aa"), _sync(11.0, 1, "aa"), _sync(12.0, 2, "bb"), _sync(13.0, 2, "cc", False)]
    report = ChaosReport(100.0, 4, 0)
    judge(report, agreed, [float(t) for t in range(0, 101, 5)], (0.0, 100.0), cfg)
    assert report.ok, report.failures
    split = ChaosReport(100.0, 4, 0)
    judge(split, [*agreed, _sync(14.0, 2, "dd")], [5.0, 80.0], (0.0, 100.0), cfg)
    assert split.failures == [
        "no round on any node for 75s from t=5s",
        "revision 2 committed with 2 state hashes ['bb', 'dd'] by groups that could reach each other (t=12s and t=14s)",
    ]
    assert split.forks == {2: ["bb", "dd"]}
    counted = ChaosReport(100.0, 4, 0)
    judge(counted, [*agreed, _sync(14.0, 2, "dd")], [float(t) for t in range(0, 101, 5)], (0.0, 100.0),
          ChaosConfig(out=tmp_path, forks_fail=False))  # fmt: skip
    assert counted.ok and counted.forks == {2: ["bb", "dd"]}
    half = ChaosReport(100.0, 4, 0)  # one group, two outcomes: never allowed
    judge(half, [*agreed, _sync(14.0, 2, "dd", group="g2bb")], [float(t) for t in range(0, 101, 5)], (0.0, 100.0),
          ChaosConfig(out=tmp_path, forks_fail=False))  # fmt: skip
    assert half.failures == ["group g2bb committed with 2 state hashes: ['bb', 'dd']"]
    none = ChaosReport(100.0, 4, 0)
    judge(none, [_sync(10.0, 0, "aa", False)], [50.0], (0.0, 100.0), cfg)
    assert "no committed sync in 100s" in none.failures


def test_expected_exits() -> None:
    assert exit_expected(-9, Cause.KILLED, False)
    assert all(exit_expected(s, Cause.TERMED, False) for s in (0, 143, -15))
    assert not exit_expected(1, Cause.TERMED, False)  # the leave watchdog fired, or a traceback
    assert not exit_expected(0, Cause.NONE, False)  # a node we did not touch must not leave
    assert not exit_expected(2, Cause.NONE, False) and exit_expected(2, Cause.NONE, True)


def test_choose_action_keeps_the_swarm_alive() -> None:
    rng = random.Random(0)
    for running, alive, dead in [(1, 1, 3), (1, 2, 0), (2, 2, 2), (0, 3, 1), (1, 5, 1)]:
        for _ in range(200):
            a = choose_action(rng, running, alive, dead, limit=4)
            assert a not in (Action.KILL, Action.TERM) or (running >= 2 and alive >= 3)
            assert a is not Action.STOP or running >= 2
            assert a not in (Action.RESTART, Action.ADD) or (running >= 1 and alive <= 4)
    assert choose_action(rng, 0, 3, 1, limit=4) is None  # nobody to join through, nobody to spare


def test_split_groups_finds_a_round_applied_by_some_members_only() -> None:
    events = [
        {**_sync(1.0, 4, "aa", group="g1"), "peer": "p-aaaaaa"},
        {**_sync(1.1, 3, "00", False, group="g1"), "peer": "p-bbbbbb", "cause": "member lost before voting"},
        {**_sync(2.0, 5, "bb", group="g2"), "peer": "p-aaaaaa"},
        {**_sync(2.0, 5, "bb", group="g2"), "peer": "p-bbbbbb"},
        {**_sync(3.0, 5, "bb", False, group="g3"), "peer": "p-aaaaaa", "cause": "commit timeout"},
    ]
    assert split_groups(events) == {"g1": ["aaaaaa: committed", "bbbbbb: member lost before voting"]}


def test_nodes_connected_for_a_minute_must_end_on_one_history_though_no_number_was_reused() -> None:
    """A branch that skipped past the other's numbers reuses none, but it is still a second history."""
    a, c, e = "p-aaaaaa", "p-cccccc", "p-eeeeee"
    events = [*_chain([a], ["a1", "a2", "a3"], 10.0), _sync(12.0, 70, "b70", peer=c, parent="00")]
    events.append(_sync(20.0, 1, "a1", peer=e, parent="00"))  # e is behind a, on a's history
    running = [{"event": "round", "time": 179.0, "peer": p, "external_peers": {}} for p in (a, c, e)]
    met_early = [_ingest(110.0, a, c), _ingest(110.0, e, c), *running]
    pairs = [["aaaaaa:a3", "cccccc:b70"], ["cccccc:b70", "eeeeee:a1"]]
    assert apart_at_end(events, met_early, 180.0) == (pairs, [])
    met_late = [_ingest(179.0, a, c), *running]  # met just now: they may still merge
    assert apart_at_end(events, met_late, 180.0) == ([], pairs)
    assert apart_at_end(events, [_ingest(110.0, a, e), *running], 180.0) == ([], pairs)  # e behind a: not apart
    # c restarted at 150 s: what an earlier process of its identity reached says nothing of this one
    assert apart_at_end(events, met_early, 180.0, {"cccccc": 150.0}) == ([], pairs)


class _DyingProc:
    """A node process SIGKILLed a moment ago: still alive until the next look, then gone with -9."""

    def __init__(self) -> None:
        self.looks, self.termed = 0, False

    def alive(self) -> bool:
        self.looks += 1
        return self.looks <= 2

    @property
    def returncode(self) -> int:
        return -9

    def term(self) -> None:
        self.termed = True

    def output(self) -> str:
        return ""


def test_a_node_killed_just_before_the_end_is_not_counted_as_a_bad_sigterm_exit(tmp_path: Path) -> None:
    """A kill just before the end must not be followed by the final SIGTERM, which would make its -9 'unexpected'."""
    chaos = Chaos(ChaosConfig(out=tmp_path, term_bound_s=1.0), cast(Procs, None))
    m = Member("n0", tmp_path / "n0.key", "aaaaaa", cast(Proc, _DyingProc()), incarnation=1, cause=Cause.KILLED)
    m.recorded = False
    chaos.members.append(m)
    chaos.finish()
    assert chaos.report.failures == [] and m.recorded and not cast(_DyingProc, m.proc).termed
