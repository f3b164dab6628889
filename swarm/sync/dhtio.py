"""Outer-sync records in the DHT: publish signed join / vote / state records, read and verify them.

Every DHT call is bounded by ``dht_timeout_s`` (a failed read counts as "saw
nothing", a failed store as "not published"); values are small signed
records (< 1 KiB), far from the DHT's size limits (docs/ARCHITECTURE.md,
"DHT value size" and "Message cap"). Waiting loops take the current time from
the injected clock and leave the decisions to the pure functions of
:mod:`swarm.sync.decide`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from protocol.signing import ED25519, Signatures
from swarm.configs import MAX_WINDOW_FACTOR
from swarm.membership import Membership
from swarm.memo import ContentMemo
from swarm.sync.allreduce import RoundPlan
from swarm.sync.config import OuterSyncConfig
from swarm.sync.decide import (
    CommitDecision,
    GroupDecision,
    decide_commit,
    decide_group,
    earliest_open_window,
    expected_members,
    live_records,
    missing_votes,
    running_window,
    should_close,
    window_length,
)
from swarm.sync.dialhints import DialHints, transport_addrs
from swarm.sync.hivemind_transport import HivemindRecords
from swarm.sync.liveness import LivenessReason, Prober
from swarm.sync.records import (
    ABORT_DIGEST,
    JOIN_KIND,
    STATE_KIND,
    VOTE_KIND,
    JoinRecord,
    Record,
    StateRecord,
    VoteRecord,
    join_key,
    open_records,
    seal_record,
    state_key,
    vote_key,
)
from swarm.sync.transport import RecordStore
from swarm.sync.vetoes import vetoers

logger = logging.getLogger(__name__)

YIELD_POLL_S = 0.5
"""How often a member that yielded to a running group reads state records for its commit."""
ADDRS_REFRESH_S = 60.0
"""How often a peer re-reads its own addresses for its records (a relayed one comes minutes after start)."""
MAX_EXPECTED = 256
"""Most peers one round's joiners make this peer expect next round (bounded memory)."""
OPENED_RECORDS = 4096
"""Sync records whose opening is remembered by content: more than the entries one key's storage holds
(1,485 state records at the default budget), so a flooded key is verified once, not on every read."""
FREE_STATE_RECORDS = 256
"""A state key read with at most this many records is read again whenever asked (every round)."""
STATE_READ_SHARE = 0.1
"""Above that, the share of this peer's time its state reads may take (see :func:`state_read_pause_s`)."""
MAX_STATE_READ_PAUSE_S = 10.0
"""The oldest the catch-up check's view of the state records gets: a flooded key delays a catch-up this much."""


def state_read_pause_s(records: int, took_s: float) -> float:
    """How long the state records of a read that found ``records`` entries in ``took_s`` serve before the next.

    Every replica of the state key answers with every record it holds, so a
    key filled with valid records from minted keys (or served so by a hostile
    replica) costs each read time in moving and checking them. The catch-up
    check asks every round; past :data:`FREE_STATE_RECORDS` entries, reads are
    spaced so that they take at most :data:`STATE_READ_SHARE` of the time, and
    the view is never older than :data:`MAX_STATE_READ_PAUSE_S`.

    >>> state_read_pause_s(3, 0.5), state_read_pause_s(1500, 0.4), state_read_pause_s(1500, 4.0)
    (0.0, 3.6, 10.0)
    """
    if records <= FREE_STATE_RECORDS:
        return 0.0
    return round(min(MAX_STATE_READ_PAUSE_S, took_s * (1.0 - STATE_READ_SHARE) / STATE_READ_SHARE), 6)


class SyncRecords:
    """This peer's view of the sync records of one (swarm, fingerprint), in ``store`` (default: the
    membership's DHT), signed and checked with ``signatures``."""

    def __init__(
        self,
        membership: Membership,
        fingerprint: str,
        cfg: OuterSyncConfig,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        store: RecordStore | None = None,
        signatures: Signatures = ED25519,
    ) -> None:
        self._m, self.fingerprint, self.cfg = membership, fingerprint, cfg
        self._signatures = signatures
        self._dht: RecordStore = store if store is not None else HivemindRecords(membership)
        self._clock, self._sleep = clock, sleep
        self.me = membership.peer_id
        self.swarm_id = membership.cfg.swarm_id
        self.revision = 0  # for log lines only
        self._reported: set[str] = set()
        self._published: tuple[int, str, float] = (-1, "", float("-inf"))
        self.banned: dict[str, float] = {}
        """peer -> time until which its join records are ignored (set by OuterSync for lying reducers)."""
        self.skip = 0
        """What this peer's join records ask its next commit to skip (set per round by OuterSync)."""
        self.last_round: frozenset[str] = frozenset()
        """The peers that joined this peer's key last round (expected next round: :func:`expected_members`)."""
        self.states: dict[str, StateRecord] = {}
        """The state records of the last :meth:`read_states` (the catch-up check reads them every round)."""
        self._states_until = float("-inf")
        """Until when :attr:`states` serve instead of a new read (:func:`state_read_pause_s`)."""
        self._here: tuple[int, str] = (-1, "")
        self._before: tuple[int, str] = (-1, "")
        """The state of the last matchmaking, and the one before it (see :meth:`_nearby`)."""
        self._last_matchmaking = float("-inf")
        """When the last matchmaking began (see :meth:`_nearby`)."""
        self._addrs: tuple[str, ...] | None = None
        self._addrs_at = 0.0
        """This peer's transport addresses, published with its join and state records (swarm.sync.dialhints)."""
        self.hints = DialHints()
        """Other peers' published addresses (OuterSync hands its sync service this same object)."""
        self.opened = ContentMemo[Any](OPENED_RECORDS)
        """Outcomes of opening records by content (see :func:`open_records`)."""
        self._my_vote: tuple[str, str] = ("", "")
        """(group id, digest) of this peer's last vote: it counts as seen when naming vetoers."""

    def _log(self, level: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s rev=%d] " + msg, self.me[-6:], self.revision, *args)

    def _rejected(self, kind: str, reasons: list[str]) -> None:
        """Log rejected records: WARNING the first time a reason is seen, DEBUG on every poll after."""
        if not reasons:
            return
        new = [r for r in reasons if r not in self._reported]
        if len(self._reported) > 256:
            self._reported.clear()
        self._reported.update(new)
        level = logging.WARNING if new else logging.DEBUG
        self._log(level, "rejected %d %s records: %s", len(reasons), kind, reasons[:3])

    def _get(self, key: str) -> dict[Any, Any]:
        try:
            return self._dht.get(key, self.cfg.dht_timeout_s)
        except Exception as e:
            self._log(logging.WARNING, "DHT read failed: %s", type(e).__name__)
            return {}

    def _store(self, key: str, kind: str, record: Record, ttl: float, timeout: float | None = None) -> bool:
        value = seal_record(kind, record, self._m.identity.key, self._signatures)
        try:
            return self._dht.store(key, self.me, value, ttl, self.cfg.dht_timeout_s if timeout is None else timeout)
        except Exception as e:
            self._log(logging.WARNING, "DHT store of a %s record failed: %s", kind, type(e).__name__)
            return False

    # ---- state records ------------------------------------------------------------------------

    def publish_state(self, revision: int, state_hash: str, origin: str = "") -> bool:
        """Announce (revision, state hash, origin) after every commit or catch-up, with this peer's addresses."""
        self.revision = revision
        now = float(self._clock())
        record = StateRecord(self.me, self.fingerprint, revision, state_hash, now, origin, self.addrs())
        key = state_key(self.swarm_id, self.fingerprint)
        stored = self._store(key, STATE_KIND, record, self.cfg.record_ttl_s)
        if stored:
            self._published = (revision, state_hash, record.created)
        return stored

    def addrs(self) -> tuple[str, ...]:
        """This peer's transport addresses, asked again every ADDRS_REFRESH_S: a node behind NAT gains a relayed
        address minutes after it started (libp2p's relay reservation), and the records must carry it."""
        now = self._clock()
        if self._addrs is None or now - self._addrs_at >= ADDRS_REFRESH_S:
            self._addrs = transport_addrs(self._dht.addresses())
            self._addrs_at = now
        return self._addrs

    def refresh_state(self, revision: int, state_hash: str, origin: str = "") -> None:
        """Re-publish the state record once half its lifetime has passed (or if it never got out)."""
        last_rev, last_hash, created = self._published
        stale = self._clock() - created > self.cfg.record_ttl_s / 2
        if stale or (last_rev, last_hash) != (revision, state_hash):
            self.publish_state(revision, state_hash, origin)

    def read_states(self) -> dict[str, StateRecord]:
        """Verified state records of this architecture, by peer (the last read's while it serves)."""
        start = self._clock()
        if start < self._states_until:
            return self.states
        fp = self.fingerprint
        raw = self._get(state_key(self.swarm_id, fp))
        kept, rejected = open_records(
            raw,
            STATE_KIND,
            StateRecord.from_wire,
            lambda r: None if r.fingerprint == fp else "other fingerprint",
            self._clock(),
            self.opened,
            self._signatures,
        )
        self._rejected(STATE_KIND, rejected)
        self.hints.learn(kept)
        self.states = kept
        took = self._clock() - start
        pause = state_read_pause_s(len(raw), took)
        if pause > 0:
            self._log(logging.DEBUG, "%d state records took %.2fs to read: next in %.1fs", len(raw), took, pause)
        self._states_until = start + took + pause
        return kept

    # ---- matchmaking --------------------------------------------------------------------------

    def _read_joins(self, key: str, revision: int, state_hash: str) -> dict[str, JoinRecord]:
        fp = self.fingerprint

        def expect(r: JoinRecord) -> str | None:
            ok = (r.fingerprint, r.revision, r.state_hash) == (fp, revision, state_hash)
            return None if ok else "other fingerprint, revision or state"

        now = self._clock()
        kept, rejected = open_records(
            self._get(key), JOIN_KIND, JoinRecord.from_wire, expect, now, self.opened, self._signatures
        )
        self._rejected(JOIN_KIND, rejected)
        self.hints.learn(kept)  # the joiners this round pings may be known to this peer only through these
        return {p: r for p, r in kept.items() if self.banned.get(p, float("-inf")) <= now}

    def _join(
        self,
        key: str,
        revision: int,
        state_hash: str,
        window: float,
        window_s: float,
        closed: bool = False,
        timeout: float | None = None,
    ) -> JoinRecord:
        now = float(self._clock())
        record = JoinRecord(
            self.me,
            self.fingerprint,
            revision,
            state_hash,
            float(window),
            now,
            closed,
            self.skip,
            self.addrs(),
            float(window_s),
        )
        cfg = self.cfg
        ttl = MAX_WINDOW_FACTOR * cfg.matchmaking_timeout_s + cfg.allreduce_timeout_s + 30.0
        self._store(key, JOIN_KIND, record, ttl, timeout)
        return record

    def _close(self, key: str, mine: JoinRecord, length: float) -> JoinRecord:
        """Mark this peer's record of its window closed (an early close: :func:`should_close`).

        The store is cut at the window's normal end, so the close never delays
        the decision past ``w + M`` (outer.py's time bound). If it does not get
        out, others only keep gathering to the normal end, where the members
        are the same.
        """
        left = mine.window_start + length - self._clock()
        self._log(logging.DEBUG, "every expected member joined window %.3f: closing it", mine.window_start)
        return self._join(
            key, mine.revision, mine.state_hash, mine.window_start, length, True, min(self.cfg.dht_timeout_s, left)
        )

    def matchmake(
        self,
        revision: int,
        state_hash: str,
        prober: Prober | None = None,
        leaving: Callable[[], bool] = lambda: False,
        open_s: float | None = None,
        trusted: frozenset[str] = frozenset(),
    ) -> GroupDecision:
        """Join (or open, asking for ``open_s`` seconds: :func:`window_for`) the earliest open gather window and
        wait for it to close.

        With a ``prober``, every joiner read is pinged at once, and the group
        is formed only from the joiners that answered (:meth:`_live_group`).
        Once ``leaving()`` is true the wait ends with "leaving": no group is
        formed yet, so nobody depends on this member. Once every expected
        member (:func:`expected_members`) joined, this peer closes its record;
        the group is decided as soon as the window is sealed (every record
        closed), else at its normal end.
        """
        self.revision = revision
        m_s = self.cfg.matchmaking_timeout_s
        expected = expected_members(self.last_round, self.me, self._nearby(revision, state_hash, self._clock()))
        key = join_key(self.swarm_id, self.fingerprint, revision, state_hash, self.cfg.compression)
        seen = self._read_joins(key, revision, state_hash)
        now = self._clock()
        window = earliest_open_window(seen, now, m_s)
        least = self.cfg.min_group_size
        running = None if window is not None else running_window(seen, now, m_s, self.me, trusted, least)
        if running is not None:  # a group of this history is under way from here: wait for its commit instead
            members = tuple(sorted(p for p, r in seen.items() if r.window_start == running))
            until = min(running + 2 * window_length(seen, running, m_s), now + MAX_WINDOW_FACTOR * m_s)
            self._await_commit_of(revision, trusted, until, leaving)
            return GroupDecision("yielded", running, members)
        if window is None:
            mine = self._join(key, revision, state_hash, self._clock(), m_s if open_s is None else open_s)
        else:
            mine = self._join(key, revision, state_hash, window, window_length(seen, window, m_s))
        while True:
            if leaving():
                return GroupDecision("leaving", mine.window_start)
            start = self._clock()
            seen = {**self._read_joins(key, revision, state_hash), self.me: mine}
            if prober is not None:
                prober.see(seen)
            earlier = earliest_open_window(seen, start, m_s)
            length = window_length(seen, mine.window_start, m_s)
            if earlier is not None and earlier < mine.window_start:
                self._log(logging.DEBUG, "switching to the earlier window %.3f", earlier)
                mine = self._join(key, revision, state_hash, earlier, window_length(seen, earlier, m_s))
                seen[self.me] = mine
            elif should_close(seen, self.me, expected) and self._clock() < mine.window_start + length:
                mine = seen[self.me] = self._close(key, mine, length)
            decision = decide_group(seen, start, self.cfg, self.me)
            if decision.status != "gather":
                self.last_round = frozenset(sorted(seen)[:MAX_EXPECTED])
                return decision if prober is None else self._live_group(seen, start, mine.window_start, prober)
            wait = min(self.cfg.poll_s, mine.window_start + decision.window_s - self._clock())
            self._sleep(max(0.0, wait))

    def _await_commit_of(
        self, revision: int, trusted: frozenset[str], until: float, leaving: Callable[[], bool]
    ) -> None:
        """Wait, reading state records, until a trusted peer reports a revision past ``revision`` (the running
        group committed: the next round's catch-up takes its state), ``until``, or the leave signal. Within a
        full window's time (``until``), so the round stays within its bound."""
        while not leaving() and self._clock() < until:
            if any(r.revision > revision for p, r in self.read_states().items() if p in trusted):
                return
            self._sleep(max(0.0, min(YIELD_POLL_S, until - self._clock())))

    def _nearby(self, revision: int, state_hash: str, now: float) -> list[str]:
        """Peers that moved to this state, or to the one this peer matchmade at before, since its last matchmaking.

        Such a peer arrived during the last round (a slower one that caught up
        after the window was sealed) and comes to this one. A peer whose record
        is older and that did not join last round (frozen, paused, gone) is not
        waited for: expecting it keeps every window open to its end, which
        lengthens every committed sync by up to the window. The records are the catch-up
        check's read of this round (:attr:`states`): no DHT read. At most
        ``MAX_EXPECTED``, lowest ids first.
        """
        here, since = (revision, state_hash), self._last_matchmaking
        if here != self._here:
            self._before, self._here = self._here, here
        self._last_matchmaking = now
        near = {self._here, self._before}
        fresh = (p for p, r in self.states.items() if (r.revision, r.state_hash) in near and r.created >= since)
        return sorted(fresh)[:MAX_EXPECTED]

    def _live_group(self, seen: dict[str, JoinRecord], now: float, window: float, prober: Prober) -> GroupDecision:
        """The group of the joiners of ``window`` that answered their ping (waits at most the ping timeout)."""
        joiners = sorted(p for p, r in seen.items() if r.window_start == window and p != self.me)
        answered = prober.answered(joiners)
        silent = [p[-6:] for p in joiners if p not in answered]
        if silent:
            self._log(logging.INFO, "left out %d joiners that did not answer a ping: %s", len(silent), silent[:8])
        decision = decide_group(live_records(seen, answered, self.me), now, self.cfg, self.me)
        if decision.status == "ready":
            prober.expect(decision.members)
        return decision

    # ---- commit vote --------------------------------------------------------------------------

    def vote(self, plan: RoundPlan, digest: str) -> bool:
        """Publish this member's vote: the assembled average's digest, or "abort"."""
        record = VoteRecord(self.me, self.fingerprint, plan.revision, plan.group_id, digest, float(self._clock()))
        self._my_vote = (plan.group_id, digest)
        key = vote_key(self.swarm_id, self.fingerprint, plan.group_id)
        cfg = self.cfg
        return self._store(key, VOTE_KIND, record, cfg.allreduce_timeout_s + cfg.commit_timeout_s + 30.0)

    def read_votes(self, plan: RoundPlan) -> dict[str, VoteRecord]:
        """Verified votes of ``plan``'s round (other groups' or revisions' votes are refused)."""
        fp = self.fingerprint

        def expect(r: VoteRecord) -> str | None:
            ok = (r.fingerprint, r.revision, r.group_id) == (fp, plan.revision, plan.group_id)
            return None if ok else "vote of another round"

        raw = self._get(vote_key(self.swarm_id, fp, plan.group_id))
        kept, rejected = open_records(
            raw, VOTE_KIND, VoteRecord.from_wire, expect, self._clock(), self.opened, self._signatures
        )
        self._rejected(VOTE_KIND, rejected)
        return kept

    def await_commit(self, plan: RoundPlan, deadline: float, prober: Prober | None = None) -> CommitDecision:
        """Poll the votes until :func:`decide_commit` decides; the last read begins by ``deadline``.

        With a ``prober``, members whose vote is still missing after two polls
        are pinged (again every ping timeout); if one no longer answers, this
        member votes abort, which ends the round on every member at once.
        """
        probe_at = self._clock() + 2 * self.cfg.poll_s
        while True:
            start = self._clock()
            votes = {p: r.digest for p, r in self.read_votes(plan).items()}
            verdict = decide_commit(votes, plan.members, start, deadline)
            if verdict.commit is False:
                return self._with_vetoers(plan, votes, verdict)
            if verdict.commit is not None:
                return verdict
            if prober is not None and start >= probe_at:
                lost = self._lost(plan, votes, deadline, prober)
                if lost is not None:
                    return lost
                probe_at = self._clock() + prober.timeout_s
            left = deadline - self._clock()
            if left <= 0:
                return CommitDecision(False, "commit timeout")
            # aim the last read a little before the deadline, so scheduling jitter cannot push it past
            self._sleep(min(self.cfg.poll_s, max(0.0, left - 0.02)))

    def _with_vetoers(self, plan: RoundPlan, votes: dict[str, str], verdict: CommitDecision) -> CommitDecision:
        """``verdict`` naming the members whose abort alone ended the round (swarm.sync.vetoes).

        This peer's own vote counts as seen even when the read missed it: its
        tally then names the same vetoers as its partners', whose reads showed it.
        """
        group_id, digest = self._my_vote
        seen = {self.me: digest, **votes} if group_id == plan.group_id else votes
        return verdict._replace(vetoers=vetoers(seen, plan.members, self.me))

    def _lost(self, plan: RoundPlan, votes: dict[str, str], deadline: float, prober: Prober) -> CommitDecision | None:
        """Ping the members not voted yet; if one is gone, end the round (None: all answered)."""
        missing = missing_votes(votes, plan.members, self.me)
        gone = set(missing) - prober.check(missing, deadline - self._clock())
        if not gone:
            return None
        # it may have voted just before dying: one more read, then abort only if still incomplete
        start = self._clock()
        again = {p: r.digest for p, r in self.read_votes(plan).items()}
        verdict = decide_commit(again, plan.members, start, deadline)
        if verdict.commit is not None:
            return self._with_vetoers(plan, again, verdict) if verdict.commit is False else verdict
        self._log(logging.WARNING, "members %s lost before voting: voting abort", [p[-6:] for p in sorted(gone)])
        self.vote(plan, ABORT_DIGEST)
        return CommitDecision(False, LivenessReason.MEMBER_LOST.value)
