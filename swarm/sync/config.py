"""Outer-sync configuration, the per-round report, and the named failure.

:class:`OuterSyncConfig` and its constants live in :mod:`swarm.configs` (standard library only, so the
command line reads them without the sync's imports) and are re-exported here. The time bound a sync may
take is :meth:`OuterSyncConfig.max_sync_seconds`; see :mod:`swarm.sync.outer` for the derivation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from swarm.configs import AGGREGATORS as AGGREGATORS
from swarm.configs import ALLREDUCE_WIRE as ALLREDUCE_WIRE
from swarm.configs import BYTES_PER_ELEMENT as BYTES_PER_ELEMENT
from swarm.configs import COMPRESSIONS as COMPRESSIONS
from swarm.configs import RULE_FIELDS as RULE_FIELDS
from swarm.configs import OuterSyncConfig as OuterSyncConfig


class SyncOutcome(StrEnum):
    """How one sync ended: the ``sync`` event's ``reason`` (details go to the log only)."""

    COMMITTED = "committed"
    NO_PARTNER = "no partner"
    ABORTED = "aborted"
    YIELDED = "yielded"
    """A group of this peer's history was already under way from its state: it waits for that commit and
    catches up (:func:`swarm.sync.decide.running_window`) rather than start a group that would lose."""


class SyncPhase(StrEnum):
    """The parts of one sync, in order: the ``sync`` event's ``phases`` keys (seconds in each)."""

    CATCH_UP = "catch_up"
    """The catch-up and orphan checks (state records, pings, any download) before joining a window."""
    MATCHMAKE = "matchmake"
    """From joining a gather window until the group is decided: mostly waiting for partners to arrive."""
    ALLREDUCE = "allreduce"
    VOTE = "vote"
    """The outer step, the vote and waiting for every member's vote."""


def phase_seconds(marks: Mapping[SyncPhase, float], end: float) -> dict[str, float]:
    """Seconds spent in each phase that began, from the times phases began and the round's end.

    >>> phase_seconds({SyncPhase.CATCH_UP: 1.0, SyncPhase.MATCHMAKE: 1.5}, 4.0)
    {'catch_up': 0.5, 'matchmake': 2.5}
    """
    order = [(t, p) for p, t in sorted(marks.items(), key=lambda kv: kv[1])]
    ends = [t for t, _ in order[1:]] + [end]
    return {p.value: round(max(0.0, e - t), 4) for (t, p), e in zip(order, ends, strict=True)}


class AbortCause(StrEnum):
    """Why a sync round was aborted: the ``sync`` event's ``cause``. An aborted round is never applied."""

    NOT_IN_GROUP = "not in group"
    ALLREDUCE_TIMEOUT = "all-reduce timeout"
    ALLREDUCE_FAILED = "all-reduce failed"
    PEER_REFUSED = "peer refused"
    PEER_LOST = "peer lost"
    BAD_BYTES = "bad bytes"
    GROUP_MISMATCH = "group mismatch"
    REFUSED = "refused the average"
    ABORTED_BY_MEMBER = "aborted by a member"
    DIGEST_MISMATCH = "digest mismatch"
    COMMIT_TIMEOUT = "commit timeout"
    MEMBER_LOST = "member lost before voting"
    SHUTTING_DOWN = "shutting down"
    CATCH_UP_FAILED = "catch-up failed"
    ORPHANED = "orphaned"
    """Every peer this one trusts is gone while live strangers report later states: syncing would split the
    history (a node restarted after its whole group died; it trains on, and rejoins once given a live --peer)."""
    SUPERSEDED = "superseded"
    """A trusted peer reported a later state from this round's parent: committing would fork the history."""
    UNJOURNALLED = "vote not journalled"
    """This member could not write its vote to disk (swarm.sync.journal), so it voted abort."""


class SyncAborted(RuntimeError):
    """A sync round failed on this member (dead peer, timeout, bad bytes, group mismatch).

    ``cause`` is what metrics count; ``reason`` the detail for the log.
    """

    def __init__(self, reason: str, cause: AbortCause = AbortCause.ALLREDUCE_FAILED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


@dataclass
class SyncReport:
    """What one sync call did; :meth:`to_metrics` gives the JSONL metrics line."""

    time: float
    peer: str
    revision: int
    state_hash: str
    committed: bool
    group_size: int
    outcome: SyncOutcome
    sync_s: float
    bytes_sent: int
    caught_up: bool = False
    group_id: str = ""
    allreduce_s: float = 0.0
    suspects: dict[str, str] = field(default_factory=dict)
    """Members caught contributing garbage this round (peer -> reason): clipped parts, lying reducers."""
    catch_up_refused: dict[str, int] = field(default_factory=dict)
    """State claims and downloads catch-up refused so far, by reason (cumulative since start)."""
    cause: AbortCause | None = None
    """Why the round was aborted (None unless ``outcome`` is aborted)."""
    parent: str = ""
    """The state hash the round started from (after any catch-up): a commit's parent in the history."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds in each :class:`SyncPhase` this round reached: where a slow sync spent its time."""
    origin: str = ""
    """The history of the state this round ended at (:mod:`swarm.sync.merge`)."""
    merged: bool = False
    """Whether this round began by merging into another history (its catch-up kept the weights)."""

    def to_metrics(self) -> dict[str, Any]:
        """The ``{"event": "sync", ...}`` metrics record."""
        return {
            "event": "sync",
            "time": self.time,
            "peer": self.peer,
            "revision": self.revision,
            "state_hash": self.state_hash,
            "committed": self.committed,
            "group_size": self.group_size,
            "reason": self.outcome.value,
            "cause": "" if self.cause is None else self.cause.value,
            "sync_s": round(self.sync_s, 4),
            "bytes_sent": self.bytes_sent,
            "caught_up": self.caught_up,
            "group_id": self.group_id,
            "allreduce_s": round(self.allreduce_s, 4),
            "suspects": len(self.suspects),
            "catch_up_refused": dict(self.catch_up_refused),
            "suspect_peers": dict(self.suspects),
            "parent": self.parent,
            "phases": dict(self.phases),
            "origin": self.origin,
            "merged": self.merged,
        }
