"""Pure decisions of outer sync: who forms a group, whether a round commits, whom to catch up from.

Every function takes its inputs (records already verified, the current time,
the config) as arguments and does no I/O, so each rule is unit-tested
without a network.

Gather window. A peer that wants to sync reads the join key of its
(fingerprint, revision, state hash). If some window opened at ``w`` is still
open to joiners (``now < w + JOIN_FRACTION * M``, M = matchmaking_timeout_s)
it joins the earliest such window, otherwise it opens its own at ``now``.
While gathering it keeps switching to the earliest open window it sees. At
``w + M`` every member reads the key once more; the group is every peer whose
record names window ``w``, sorted by peer id. The last ``(1 - JOIN_FRACTION) * M``
of the window lets the last joins propagate; a member that still sees a
different set computes a different group id and is refused by the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from swarm.sync.config import OuterSyncConfig
from swarm.sync.records import ABORT_DIGEST, JoinRecord, StateRecord

JOIN_FRACTION = 0.75
"""Share of the gather window during which peers may still join it."""


def earliest_open_window(records: Mapping[str, JoinRecord], now: float, window_s: float) -> float | None:
    """The start of the earliest window still open to joiners, or None if none is.

    >>> r = JoinRecord("p", "0" * 16, 0, "0" * 64, 10.0, 10.0)
    >>> earliest_open_window({"p": r}, now=12.0, window_s=4.0), earliest_open_window({"p": r}, 13.5, 4.0)
    (10.0, None)
    """
    starts = [r.window_start for r in records.values() if r.window_start <= now]
    open_ = [w for w in starts if now < w + JOIN_FRACTION * window_s]
    return min(open_) if open_ else None


def group_id(fingerprint: str, revision: int, state_hash: str, window_start: float, members: Sequence[str]) -> str:
    """32 hex chars naming one group of one round; every message of the round carries it."""
    text = f"{fingerprint}|{revision}|{state_hash}|{window_start!r}|{','.join(members)}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class GroupDecision:
    """``status`` is "gather" (window still open), "ready", "no partner" or "not in group"."""

    status: str
    window_start: float
    members: tuple[str, ...] = ()
    group_id: str = ""


def decide_group(join_records: Mapping[str, JoinRecord], now: float, cfg: OuterSyncConfig, me: str) -> GroupDecision:
    """Decide this peer's group from the (verified) join records of its key.

    The window is the one ``me``'s own record names; before it closes the
    answer is "gather". Members are the peers whose records name the same
    window, sorted; at most ``max_group_size`` (lowest ids first) are taken.
    """
    mine = join_records.get(me)
    if mine is None:
        return GroupDecision("no partner", now)
    w = mine.window_start
    if now < w + cfg.matchmaking_timeout_s:
        return GroupDecision("gather", w)
    members = tuple(sorted(p for p, r in join_records.items() if r.window_start == w))
    members = members[: cfg.max_group_size]
    if me not in members:
        return GroupDecision("not in group", w)
    if len(members) < cfg.min_group_size:
        return GroupDecision("no partner", w, members)
    gid = group_id(mine.fingerprint, mine.revision, mine.state_hash, w, members)
    return GroupDecision("ready", w, members, gid)


class CommitDecision(NamedTuple):
    """``commit`` is True (apply), False (discard) or None (not decided yet: keep polling)."""

    commit: bool | None
    reason: str


def decide_commit(
    digests_by_peer: Mapping[str, str], members: Sequence[str], now: float, deadline: float
) -> CommitDecision:
    """Apply only if every member voted the same digest, seen by a read that began by ``deadline``.

    ``now`` is when the read that returned ``digests_by_peer`` *started*. Any
    "abort" vote or two different digests end the round at once. Every member
    does its last read at the same ``deadline``, so a vote visible to one
    member's committing read is visible to every other member's last read.

    >>> decide_commit({"a": "x" * 64, "b": "x" * 64}, ["a", "b"], now=1.0, deadline=2.0)
    CommitDecision(commit=True, reason='committed')
    >>> decide_commit({"a": "x" * 64}, ["a", "b"], now=2.5, deadline=2.0)
    CommitDecision(commit=False, reason='commit timeout')
    """
    votes = {p: d for p, d in digests_by_peer.items() if p in members}
    if ABORT_DIGEST in votes.values():
        return CommitDecision(False, "aborted by a member")
    if len(set(votes.values())) > 1:
        return CommitDecision(False, "digest mismatch")
    if now > deadline:
        return CommitDecision(False, "commit timeout")
    if len(votes) == len(set(members)):
        return CommitDecision(True, "committed")
    return CommitDecision(None, "pending")


@dataclass(frozen=True)
class CatchUp:
    """Download the state at (revision, state_hash) from one of ``donors`` (freshest first)."""

    revision: int
    state_hash: str
    donors: tuple[str, ...]


def decide_catch_up(
    state_records: Mapping[str, StateRecord], my_revision: int, my_hash: str, me: str = ""
) -> CatchUp | None:
    """Whether this peer must download the group's state before its next sync.

    The target is the highest revision anyone (this peer included) reports,
    and at that revision the hash most peers report (ties: smallest hash).
    A peer behind the target, or at it with another hash, catches up; donors
    are the other peers reporting exactly the target.
    """
    others = {p: r for p, r in state_records.items() if p != me}
    target_rev = max([my_revision, *(r.revision for r in others.values())])
    counts: dict[str, int] = {}
    for r in others.values():
        if r.revision == target_rev:
            counts[r.state_hash] = counts.get(r.state_hash, 0) + 1
    if my_revision == target_rev:
        counts[my_hash] = counts.get(my_hash, 0) + 1
    target_hash = min(counts, key=lambda h: (-counts[h], h))
    if (my_revision, my_hash) == (target_rev, target_hash):
        return None
    donors = sorted(
        (p for p, r in others.items() if (r.revision, r.state_hash) == (target_rev, target_hash)),
        key=lambda p: (-others[p].created, p),
    )
    return CatchUp(target_rev, target_hash, tuple(donors))
