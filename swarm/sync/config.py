"""Outer-sync configuration, the per-round report, and the named failure.

The time bound a sync may take is :meth:`OuterSyncConfig.max_sync_seconds`;
see :mod:`swarm.sync.outer` for the derivation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

COMPRESSIONS = ("none", "fp16", "int8")
AGGREGATORS = ("mean", "trimmed_mean", "median", "centered_clip")
BYTES_PER_ELEMENT = {"none": 4.0, "fp16": 2.0, "int8": 1.0 + 4 / 4096}
"""Wire bytes per parameter of each encoding (int8: one float32 scale per 4,096 values)."""


RULE_FIELDS = (
    "outer_lr", "outer_momentum", "nesterov", "aggregator", "trim_fraction", "clip_factor", "max_weight_ratio",
    "max_update",
)  # fmt: skip
"""The settings that decide a round's new state from its members' parts (see :meth:`OuterSyncConfig.rule`)."""
ALLREDUCE_WIRE = 2
"""The all-reduce's wire format (2: parts and reduced slices streamed piece by piece, each part claiming its
norm: :mod:`swarm.sync.pieces`); in the rule, so peers of different formats never meet in a group."""


class SyncOutcome(StrEnum):
    """How one sync ended: the ``sync`` event's ``reason`` (details go to the log only)."""

    COMMITTED = "committed"
    NO_PARTNER = "no partner"
    ABORTED = "aborted"


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
class OuterSyncConfig:
    """How often and how (robustly, with which bounds) peers of one architecture average."""

    sync_every: int = field(
        default=100, metadata={"help": "Inner steps between outer syncs (H); unused (may be 0) with sync_period_s."}
    )
    sync_period_s: float = field(
        default=0.0,
        metadata={
            "help": "Sync on epochs of wall time instead: every peer of an architecture starts a sync at each "
            "multiple of this many seconds (clocks agree to well within a round), so peers of different speeds "
            "meet, each contributing what it trained since the anchor; 0: every sync_every inner steps."
        },
    )
    eager: bool = field(
        default=True,
        metadata={
            "help": "Run each sync beside training and apply its outcome at a later round boundary, keeping the "
            "steps trained meanwhile (async DiLoCo, 'eager updates'); off: training waits for every sync."
        },
    )
    outer_lr: float = field(
        default=0.7, metadata={"help": "Outer SGD learning rate (DiLoCo's; a node's default is 1, plain averaging)."}
    )
    outer_momentum: float = field(
        default=0.9, metadata={"help": "Outer SGD momentum (DiLoCo's; a node's default is 0, plain averaging)."}
    )
    nesterov: bool = field(default=True, metadata={"help": "Use Nesterov momentum in the outer step."})
    compression: str = field(
        default="none", metadata={"help": "Exchanged tensor encoding: none, fp16 or int8 (per-chunk scale)."}
    )
    aggregator: str = field(
        default="centered_clip",
        metadata={
            "help": "Slice reducer over the (norm-clipped) parts: mean, trimmed_mean, median (coordinate-wise) "
            "or centered_clip (Karimireddy et al. 2021, on each piece of 2^18 values as the parts stream in); "
            "the robust rules need 3+ parts, else the mean. "
            "centered_clip by default: clipping and the step cap bound a member's size, not its direction, "
            "and under the mean one member sending minus the group's progress at the bound reverses it."
        },
    )
    trim_fraction: float = field(
        default=0.2, metadata={"help": "Fraction trimmed from each end by trimmed_mean, in [0, 0.5)."}
    )
    clip_factor: float = field(
        default=4.0,
        metadata={
            "help": "Norm bound on contributions: a reducer clips a part longer than clip_factor x the median "
            "part norm of its slice (x its own part's norm with 2 parts), and a member votes abort on a "
            "reduced slice longer than clip_factor x its own part. Higher tolerates more honest spread "
            "but lets a poisoner move the average further; > 1."
        },
    )
    max_weight_ratio: float = field(
        default=4.0,
        metadata={
            "help": "Each member's part counts by the inner steps it trained since the anchor, but a reducer "
            "counts a claim as at most this x the median claim of its slice (x the smaller, with 2 parts): "
            "any key can claim any step count. Higher lets much faster peers count fully but lets a liar "
            "move the average further; >= 1."
        },
    )
    suspect_ban_s: float = field(
        default=600.0,
        metadata={
            "help": "Seconds this peer leaves out of its sync groups a member whose reduced slice failed the "
            "check (non-finite or too large), whose part was garbage, or that kept aborting rounds the others "
            "would commit: any of them would otherwise make every round abort."
        },
    )
    matchmaking_timeout_s: float = field(
        default=5.0, metadata={"help": "Gather window: peers arriving within it form one group."}
    )
    allreduce_timeout_s: float = field(
        default=60.0, metadata={"help": "Bound on the whole reduce-scatter + all-gather of one round."}
    )
    direct_payloads: bool = field(
        default=True,
        metadata={
            "help": "Move all-reduce payloads on direct TCP connections (set up, and every payload's sha256 "
            "checked, over the authenticated P2P stream; not encrypted), falling back to the P2P stream "
            "where a peer cannot be reached; off: everything on P2P streams (encrypted, ~3x the CPU)."
        },
    )
    chunk_timeout_s: float = field(
        default=10.0, metadata={"help": "Bound on moving any one 1 MiB chunk (or header) on a stream."}
    )
    commit_timeout_s: float = field(
        default=5.0, metadata={"help": "Time after the all-reduce deadline for every member's commit vote."}
    )
    dht_timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "Bound on any single DHT get or store; keep it above hivemind's RPC wait_timeout "
            "(3 s) so a read that meets a frozen DHT node still returns the other nodes' records."
        },
    )
    ping_timeout_s: float = field(
        default=2.0,
        metadata={
            "help": "Bound on a liveness ping: a joiner that does not answer one within it is left out of the "
            "group, and a member whose vote is missing and that does not answer makes the round abort."
        },
    )
    state_timeout_s: float = field(
        default=60.0, metadata={"help": "Bound on downloading the group's state when catching up."}
    )
    max_state_serves: int = field(
        default=4,
        metadata={
            "help": "State downloads this peer serves at once (one per asking peer): an ask past it is refused "
            "at once and the asker tries its next donor. Every download shares one copy of the state's bytes, "
            "but also the link: each must finish within the state download bound. >= 1."
        },
    )
    min_link_mbit: float = field(
        default=20.0,
        metadata={
            "help": "Slowest link (Mbit/s each way) a member is expected to sync over: the all-reduce and state "
            "download bounds grow to what the model's bytes take at this rate when that is longer than "
            "allreduce_timeout_s / state_timeout_s, so a large model on a slow link is not cut off mid-round."
        },
    )
    max_state_shift: float = field(
        default=1.0,
        metadata={
            "help": "Catch-up refuses a downloaded state whose anchor differs from this peer's own by more "
            "than this x the norm of its own anchor (and whose momentum is over that / (1 - outer_momentum)). "
            "Higher lets a peer far behind catch up; lower limits how far a hostile donor can move it; > 0."
        },
    )
    max_update: float = field(
        default=0.5,
        metadata={
            "help": "Floor of the reduced-slice and outer-step checks for a member with no evidence of an "
            "honest average's scale (its parts and committed averages all below 1e-4 of the anchor's norm: its "
            "groups had no signal since it started): max_update x the anchor's norm (per slice: its share). "
            "Every other member judges by its own evidence (swarm.sync.assemble). > 0."
        },
    )
    min_group_size: int = field(default=2, metadata={"help": "Fewest peers (self included) to sync with."})
    max_group_size: int = field(default=64, metadata={"help": "Most peers in one sync group."})
    poll_s: float = field(default=0.1, metadata={"help": "Interval between DHT polls while waiting."})
    record_ttl_s: float = field(default=600.0, metadata={"help": "Lifetime of this peer's state record in the DHT."})

    def __post_init__(self) -> None:
        if self.sync_every < (0 if self.sync_period_s else 1):
            raise ValueError(f"sync_every={self.sync_every}; use at least 1 (typical: 100-500), or a sync_period_s")
        if not (math.isfinite(self.sync_period_s) and (self.sync_period_s == 0 or self.sync_period_s >= 1)):
            raise ValueError(f"sync_period_s={self.sync_period_s}; use 0 (count inner steps) or at least 1 second")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression={self.compression!r}; use one of {', '.join(COMPRESSIONS)}")
        if self.aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator={self.aggregator!r}; use one of {', '.join(AGGREGATORS)}")
        if not 0.0 <= self.trim_fraction < 0.5:
            raise ValueError(f"trim_fraction={self.trim_fraction}; use a value in [0, 0.5), e.g. 0.2")
        if not (math.isfinite(self.clip_factor) and self.clip_factor > 1.0):
            raise ValueError(f"clip_factor={self.clip_factor}; use a finite number above 1 (typical: 2-10)")
        if not (math.isfinite(self.max_weight_ratio) and self.max_weight_ratio >= 1.0):
            raise ValueError(
                f"max_weight_ratio={self.max_weight_ratio}; use a finite number of at least 1 (typical: 2-8)"
            )
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise ValueError(f"outer_lr={self.outer_lr}; use a positive number (DiLoCo: 0.7)")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ValueError(f"outer_momentum={self.outer_momentum}; use a value in [0, 1) (DiLoCo: 0.9)")
        for name in (
            "matchmaking_timeout_s",
            "allreduce_timeout_s",
            "chunk_timeout_s",
            "commit_timeout_s",
            "dht_timeout_s",
            "state_timeout_s",
            "ping_timeout_s",
            "poll_s",
            "record_ttl_s",
            "suspect_ban_s",
            "min_link_mbit",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}; use a positive number of seconds")
        if self.allreduce_timeout_s < self.dht_timeout_s:
            raise ValueError(
                f"allreduce_timeout_s={self.allreduce_timeout_s} < dht_timeout_s={self.dht_timeout_s}; "
                "raise allreduce_timeout_s (the documented time bound assumes A >= d)"
            )
        if not (math.isfinite(self.max_update) and self.max_update > 0):
            raise ValueError(f"max_update={self.max_update}; use a positive number (default 0.5)")
        if not (math.isfinite(self.max_state_shift) and self.max_state_shift > 0):
            raise ValueError(f"max_state_shift={self.max_state_shift}; use a positive number (default 1.0)")
        if self.max_state_serves < 1:
            raise ValueError(f"max_state_serves={self.max_state_serves}; use at least 1 (default 4)")
        if self.min_group_size < 2:
            raise ValueError(f"min_group_size={self.min_group_size}; use at least 2 (yourself and a peer)")
        if self.max_group_size < self.min_group_size:
            raise ValueError(f"max_group_size={self.max_group_size} < min_group_size={self.min_group_size}; raise it")

    def rule(self) -> str:
        """The settings every member of a group must share to compute one new state from one average.

        Members whose outer step or aggregation differ would each commit a different state and their
        digests could never agree, so every round they met in would abort; the sync namespace
        carries this rule (:func:`swarm.fingerprint.sync_fingerprint`) and they never meet. The wire
        encoding is in the join key already.
        """
        return ",".join(f"{name}={getattr(self, name)!r}" for name in RULE_FIELDS) + f",wire={ALLREDUCE_WIRE}"

    def transfer_s(self, nbytes: float) -> float:
        """Seconds ``nbytes`` take each way at ``min_link_mbit``, a quarter more for headers and acknowledgements."""
        return 1.25 * nbytes * 8 / (self.min_link_mbit * 1e6)

    def allreduce_bound_s(self, n_elems: int) -> float:
        """Bound on one all-reduce of ``n_elems`` parameters: what a member's bytes take on the slowest link,
        at least ``allreduce_timeout_s``. A member sends, and receives, 2 (N - 1) / N < 2 times the encoded
        model (its parts, then the reduced slice to every other member)."""
        per_element = BYTES_PER_ELEMENT[self.compression]
        return max(self.allreduce_timeout_s, self.transfer_s(2 * per_element * n_elems))

    def momentum_elems(self, n_elems: int) -> int:
        """Values of the outer momentum a state of ``n_elems`` parameters holds: none without momentum.

        With ``outer_momentum`` 0 the step never reads the buffer (it would only copy the last average),
        so the state is the anchor alone: a model's size less at rest, in every round and in every
        catch-up download. The rule is in the sync namespace, so every peer a node meets agrees.
        """
        return n_elems if self.outer_momentum > 0 else 0

    def state_bound_s(self, n_elems: int) -> float:
        """Bound on downloading a state (anchor and any momentum, float32) of ``n_elems`` parameters."""
        return max(self.state_timeout_s, self.transfer_s(4 * (n_elems + self.momentum_elems(n_elems))))

    def max_sync_seconds(self, n_elems: int) -> float:
        """Upper bound on one ``sync_now`` (catch-up included) for a model of ``n_elems`` parameters; see
        :mod:`swarm.sync.outer` (:meth:`OuterSync.max_sync_seconds` passes its own model's size)."""
        d = self.dht_timeout_s
        round_s = self.matchmaking_timeout_s + self.allreduce_bound_s(n_elems) + max(self.commit_timeout_s, d)
        # three ping rounds: the catch-up check's (trusted peers at this state), the merge check's (peers of
        # this and other histories) and the orphan check's
        return round_s + self.state_bound_s(n_elems) + 3 * self.ping_timeout_s + 6 * d + 1.0


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
