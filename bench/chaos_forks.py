"""What a chaos run's forks were: inside a connected swarm (a bug), or islands, and whether islands merged.

A fork is a revision committed with two or more state hashes. Whether its
groups could reach each other is read from the nodes' own round records: a
node that ingested a rollout group from a peer (``external_peers``) reached
that peer through the DHT and the payload stream at that moment, the same
paths the sync's records and parts take. So:

- **connected**: some member of one state's group ingested a group of a
  member of the other within :data:`CONTACT_S` before the later commit, or the
  two groups share a member. The sync's rules (the superseded check, the skip
  past reported revisions) are there to prevent exactly this: a bug.
- **island**: no such contact. Two parts of the swarm that cannot reach each
  other may both train on; once they meet (the first contact after the later
  commit), the losing branch must stop growing within :data:`MERGE_S`: its
  last commit is the merge (its members moved to the other branch, or left).

Branches are the states descending from each of the fork's hashes, found
through the ``parent`` of every committed sync event. Everything here is a
pure function of the events, so the judge is tested without processes.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

Event = dict[str, Any]

CONTACT_S = 10.0
"""How long before a fork's later commit a rollout ingested across its groups shows they were connected."""

MERGE_S = 60.0
"""Most seconds two branches that met may both grow (issue 29's bound on a merge)."""


class ForkKind(Enum):
    CONNECTED = "connected"
    ISLAND = "island"


@dataclass
class Fork:
    """One revision with several states: its kind, when, and (islands) when the branches met and merged.

    Times are seconds from the start of the chaos window.
    """

    revision: int
    hashes: list[str]
    kind: ForkKind
    first_s: float
    second_s: float
    contact_s: float | None = None
    """First contact across the groups after the later commit (None: they never met)."""
    merged_s: float | None = None
    """The losing branch's last commit (None: both branches still grew at the end)."""

    def problem(self, end_s: float) -> str | None:
        """The failure this fork is (one sentence), or None for an island that merged in time or never met."""
        what = f"revision {self.revision} committed with {len(self.hashes)} state hashes {self.hashes}"
        if self.kind is ForkKind.CONNECTED:
            return f"{what} by groups that could reach each other (t={self.first_s:.0f}s and t={self.second_s:.0f}s)"
        if self.contact_s is None:
            return None
        merged = end_s if self.merged_s is None else self.merged_s
        if merged - self.contact_s > MERGE_S:
            took = "never merged" if self.merged_s is None else f"merged {merged - self.contact_s:.0f}s after"
            return f"{what} (islands) met at t={self.contact_s:.0f}s and {took}"
        return None


def _commits(syncs: Iterable[Event]) -> list[Event]:
    return sorted((e for e in syncs if e.get("committed")), key=lambda e: float(e["time"]))


def descendants(syncs: Iterable[Event], root: str) -> set[str]:
    """``root`` and every committed state whose chain of parents leads to it."""
    children: dict[str, set[str]] = defaultdict(set)
    for e in _commits(syncs):
        if e.get("parent"):
            children[str(e["parent"])].add(str(e["state_hash"]))
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def contacts(rounds: Iterable[Event]) -> dict[frozenset[str], list[float]]:
    """Unordered pair of short peer ids -> sorted times one ingested a rollout group of the other."""
    out: dict[frozenset[str], list[float]] = defaultdict(list)
    for e in rounds:
        me = str(e.get("peer", ""))[-6:]
        for other in e.get("external_peers") or {}:
            if str(other)[-6:] != me:
                out[frozenset((me, str(other)[-6:]))].append(float(e["time"]))
    return {pair: sorted(ts) for pair, ts in out.items()}


def first_contact(
    met: Mapping[frozenset[str], list[float]], a: Iterable[str], b: Iterable[str], after: float, before: float
) -> float | None:
    """The first contact between a peer of ``a`` and one of ``b`` in ``[after, before]``, or None."""
    best: float | None = None
    for x in set(a):
        for y in set(b) - {x}:
            times = met.get(frozenset((x, y)), [])
            i = bisect.bisect_left(times, after)
            if i < len(times) and times[i] <= before and (best is None or times[i] < best):
                best = times[i]
    return best


def classify_forks(syncs: Sequence[Event], rounds: Sequence[Event], start: float, end: float) -> list[Fork]:
    """Every revision committed with several states, classified (see the module docstring)."""
    commits = _commits(syncs)
    by_rev: dict[int, dict[str, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for e in commits:
        by_rev[int(e["revision"])][str(e["state_hash"])].append(e)
    met = contacts(rounds)
    forks = []
    for rev, states in sorted(by_rev.items()):
        if len(states) < 2:
            continue
        order = sorted(states, key=lambda h: float(states[h][0]["time"]))
        first, second = (float(states[h][0]["time"]) for h in order[:2])
        groups = [{str(e.get("peer", ""))[-6:] for e in states[h]} for h in order]
        connected = any(
            groups[i] & groups[j] or first_contact(met, groups[i], groups[j], first - CONTACT_S, second) is not None
            for i in range(len(groups))
            for j in range(i + 1, len(groups))
        )
        fork = Fork(rev, [h[:8] for h in order], ForkKind.CONNECTED if connected else ForkKind.ISLAND, first - start,
                    second - start)  # fmt: skip
        if not connected:
            _island(fork, commits, met, [states[h] for h in order[:2]], second, start, end)
        forks.append(fork)
    return forks


def _island(
    fork: Fork, commits: list[Event], met: Mapping[frozenset[str], list[float]], tips: list[list[Event]],
    second: float, start: float, end: float,
) -> None:  # fmt: skip
    """Fill when the island's two branches met and when the losing one stopped growing."""
    branches = [descendants(commits, str(tip[0]["state_hash"])) for tip in tips]
    on: dict[str, list[tuple[float, int]]] = defaultdict(list)  # peer -> (time, branch of its commit then)
    for e in commits:
        for i, branch in enumerate(branches):
            if e["state_hash"] in branch:
                on[str(e.get("peer", ""))[-6:]].append((float(e["time"]), i))
    contact = min(
        (t for pair, ts in met.items() for t in ts if second <= t <= end and _across(on, pair, t)), default=None
    )
    fork.contact_s = None if contact is None else contact - start
    last = [max(float(e["time"]) for e in commits if e["state_hash"] in b) for b in branches]
    loser_end = min(last)
    # both branches still committing in the last MERGE_S of the run: not merged (yet)
    fork.merged_s = None if loser_end > end - MERGE_S and contact is not None else loser_end - start


def _across(on: Mapping[str, list[tuple[float, int]]], pair: frozenset[str], t: float) -> bool:
    """Whether at ``t`` the two peers were on different branches (each by its last commit before ``t``)."""
    where = []
    for peer in pair:
        before = [b for when, b in on.get(peer, []) if when <= t]
        where.append(before[-1] if before else None)
    return None not in where and len(set(where)) == 2


def genesis(syncs: Iterable[Event]) -> set[str]:
    """The revision-0 states the run's committed histories grew from (one when the swarm started as one)."""
    commits = _commits(syncs)
    parent = {str(e["state_hash"]): str(e.get("parent") or "") for e in commits}
    roots = set()
    for e in commits:
        h = str(e["state_hash"])
        for _ in range(len(parent) + 1):
            if not parent.get(h):
                break
            h = parent[h]
        roots.add(h[:8])
    return roots


def ancestors(syncs: Iterable[Event], state: str) -> set[str]:
    """``state`` and every state it descends from (through committed syncs' ``parent``)."""
    parent = {str(e["state_hash"]): str(e.get("parent") or "") for e in _commits(syncs)}
    out, h = {state}, state
    while parent.get(h) and parent[h] not in out:
        h = parent[h]
        out.add(h)
    return out


def final_states(syncs: Iterable[Event], rounds: Iterable[Event], end: float, within: float = 10.0) -> dict[str, str]:
    """Short peer id -> the state of its last sync, for every node that ran a round in the last ``within`` s."""
    running = {str(e.get("peer", ""))[-6:] for e in rounds if float(e["time"]) >= end - within}
    last: dict[str, tuple[float, str]] = {}
    for e in syncs:
        peer, t = str(e.get("peer", ""))[-6:], float(e["time"])
        if peer in running and e.get("state_hash") and t >= last.get(peer, (-1.0, ""))[0]:
            last[peer] = (t, str(e["state_hash"]))
    return {p: h for p, (_, h) in last.items()}


def apart_at_end(
    syncs: Sequence[Event], rounds: Sequence[Event], end: float, starts: Mapping[str, float] | None = None
) -> tuple[list[list[str]], list[list[str]]]:
    """Nodes running at the end on histories neither of which contains the other: each pair ``peer:state``.

    The first list: pairs whose current processes reached each other a minute before the end (see
    :data:`MERGE_S`): they had time to merge, and a failure. The second: the other pairs (islands, or
    one side just started), reported. ``starts``: short peer id -> when its current process started
    (contacts of an earlier process of the same identity say nothing of this one's reach). A node
    merely behind is on the same history (its state is an ancestor of the others').
    """
    finals = final_states(syncs, rounds, end)
    lines = {p: ancestors(syncs, h) for p, h in finals.items()}
    met = contacts(rounds)
    since = starts or {}
    connected: list[list[str]] = []
    unreached: list[list[str]] = []
    peers = sorted(finals)
    for i, a in enumerate(peers):
        for b in peers[i + 1 :]:
            if finals[a] in lines[b] or finals[b] in lines[a]:
                continue
            begin = max(end - 2 * MERGE_S, since.get(a, -math.inf), since.get(b, -math.inf))
            pair = [f"{a}:{finals[a][:8]}", f"{b}:{finals[b][:8]}"]
            reached = begin <= end - MERGE_S and first_contact(met, [a], [b], begin, end - MERGE_S) is not None
            (connected if reached else unreached).append(pair)
    return connected, unreached
