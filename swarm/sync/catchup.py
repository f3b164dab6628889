"""Catch-up: whom a peer believes about the group's state, and downloading that state when it is behind.

The trust rule (SECURITY.md, "Outer sync"): state records of keys this peer
has no reason to believe vouch nothing. Trusted are the peers named to join
through (``--peer``) and the members of every round this peer committed (the
most recent :data:`MAX_PARTNERS`). A newcomer (revision 0, no round committed
yet) follows its bootstrap peers at any distance; everyone else refuses a
downloaded state that is off target, not finite, or implausibly far from its
own anchor (:func:`~swarm.sync.decide.check_downloaded_state`).

Forks. A peer that syncs at its own state while its group has moved on
starts a second history (two hashes at one revision). So partners and this
peer's own recent steps are checkpointed (:meth:`CatchUpper.state_dict`): a
restarted node still trusts whom it synced with. Trusted peers at this
peer's own state count against a claim ahead only if they answer a ping now
(records outlive their signers by up to ``record_ttl_s``). And a target that
could not be downloaded is retried before this peer syncs at its own state
(:data:`RETRIES` rounds over at least :data:`RETRY_S`); one refused as implausible is passed over at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from swarm.sync.allreduce import Snapshot
from swarm.sync.config import AbortCause, OuterSyncConfig, SyncAborted
from swarm.sync.decide import (
    MAX_CONTESTED_AHEAD,
    CatchUp,
    CatchUpDecision,
    CatchUpRefusal,
    check_contested_step,
    check_downloaded_state,
    decide_catch_up,
    plausible_ahead,
    staying_peers,
)
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.merge import MERGE_CHECK_S, MERGE_COOLDOWN_S, decide_merge, to_ping
from swarm.sync.records import MAX_SKIP, StateRecord
from swarm.sync.robust import distance, norm

MAX_PARTNERS = 1024
"""Most recent round partners remembered as trusted for catch-up (bounded memory)."""

RECENT_STEPS = 8
"""This peer's last committed outer steps (anchor shift norms) that bound a contested catch-up."""

RETRIES = 2
"""Rounds a target that no donor served is retried (the round waits) before this peer syncs at its own state."""

RETRY_S = 30.0
"""Seconds, counted from its first failure, a target that no donor served is retried at least. Rounds alone
pass in a second or two in a fast swarm, less than a donor stays frozen (a stop, a long pause)."""

SKIP_MARGIN = 64
"""Revisions a skip leaves past the last one this peer saw reported: a dead branch's last commits may not
have reached it (a node commits and is killed before its state record spreads, so a skip to the last
revision seen can land on one that was committed)."""

MAX_UNDECIDED = 64
"""Revisions remembered that this peer voted for and aborted (bounded memory: see CatchUpper.undecided)."""

MAX_IGNORED = 256
"""Targets remembered as failed or refused (bounded memory; the oldest are forgotten first)."""

Fetch = Callable[[str, int, float], Snapshot]
"""(donor, number of values, timeout) -> the donor's state; raises on any failure."""

Alive = Callable[[list[str], float], set[str]]
"""(peers, timeout) -> those that answered a fresh ping within ``timeout``."""

Log = Callable[..., None]
"""(level, msg, *args): the owner's logger, which adds the peer and revision."""


class CatchUpper:
    """Decides whether this peer is behind or diverged, and downloads and checks the state to move to."""

    def __init__(
        self,
        me: str,
        records: SyncRecords,
        fetch: Fetch,
        cfg: OuterSyncConfig,
        bootstrap: frozenset[str],
        log: Log,
        clock: Callable[[], float] = time.time,
        alive: Alive | None = None,
    ) -> None:
        self._me, self._records, self._fetch, self._cfg, self._log, self._clock = me, records, fetch, cfg, log, clock
        self._alive = alive
        self.own_claim: tuple[int, str] | None = None
        """A later state this peer itself published before a restart from an older checkpoint (see decide_catch_up)."""
        self._unserved: set[tuple[int, str]] = set()
        """Targets passed over because no donor served them (others committed them; nobody holds them now)."""
        self._failed: dict[tuple[int, str], tuple[int, float]] = {}
        """Targets that failed: times no donor served them (RETRIES when refused as implausible), and when first."""
        self.bootstrap = bootstrap
        self._partners: dict[str, None] = {}
        self.refusals: dict[CatchUpRefusal, int] = {}
        self._reported: set[tuple[str, CatchUpRefusal]] = set()
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self._stepped: deque[float] = deque(maxlen=RECENT_STEPS)
        """When (this peer's clock) it committed its recent steps: its own pace (see plausible_ahead)."""
        self._undecided: deque[int] = deque(maxlen=MAX_UNDECIDED)
        self.alone_warned = False
        """Whether this peer, trusting no one, has said that live strangers report later states (see orphaned)."""
        self.merged = False
        """Whether the state the last :meth:`catch_up` returned is a merge into another history (keep weights)."""
        self.merges = 0
        self._merge_checked = -math.inf
        self._merged_at = -math.inf
        self._merge_winner = ""
        """The history the last merge check found winning ("" if this peer's own)."""
        self._merge_peers: list[str] = []
        """That history's peers that answered the check's ping: partners once merged."""
        self._shunned: dict[str, float] = {}
        """Histories whose state was refused as implausible, and when: left out of merges for the cooldown."""

    def note_step(self, shift_norm: float) -> None:
        """This peer committed an outer step that moved its anchor by ``shift_norm``."""
        if math.isfinite(shift_norm):
            self._steps.append(shift_norm)
        self._stepped.append(self._clock())

    def undecided(self, revision: int) -> None:
        """This peer voted for a state of ``revision`` and then aborted: another member may have committed it.

        A member aborts after its digest vote when a partner stops answering or
        votes abort itself, and a third may have read every digest just before
        and committed. If that member's state record never
        spreads, this peer would extend the same parent under the same number:
        a second state of ``revision``. :meth:`skip` counts it as reported.
        """
        self._undecided.append(revision)

    def state_dict(self) -> dict[str, Any]:
        """Partners (most recent last) and recent steps: what a restart must keep to stay on the group's history."""
        return {"partners": list(self._partners), "steps": list(self._steps), "stepped_at": list(self._stepped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; malformed entries are skipped (a checkpoint is local, but checked)."""
        partners = state.get("partners", [])
        steps = state.get("steps", [])
        self.add_partners(p for p in (partners if isinstance(partners, list) else []) if isinstance(p, str))
        for step in steps if isinstance(steps, list) else []:
            if isinstance(step, float) and math.isfinite(step):
                self._steps.append(step)
        stepped = state.get("stepped_at", [])
        for at in stepped if isinstance(stepped, list) else []:
            if isinstance(at, float) and math.isfinite(at):
                self._stepped.append(at)

    def ignored(self) -> frozenset[tuple[int, str]]:
        """Targets passed over: retried :data:`RETRIES` times over :data:`RETRY_S` without a donor, or refused."""
        now = self._clock()
        return frozenset(t for t, (n, first) in self._failed.items() if n >= RETRIES and now - first >= RETRY_S)

    def _fail(self, target: CatchUp, refused: bool) -> None:
        key = (target.revision, target.state_hash)
        n, first = self._failed.get(key, (0, self._clock()))
        self._failed[key] = (RETRIES, -math.inf) if refused else (n + 1, first)
        if not refused and key in self.ignored():
            self._unserved.add(key)
        while len(self._failed) > MAX_IGNORED:
            self._unserved.discard(oldest := next(iter(self._failed)))
            del self._failed[oldest]

    def skip(self, snap: Snapshot) -> int:
        """Revisions this peer's next commit from ``snap`` must skip so that a revision number names one state.

        Past every later revision any peer reports, trusted or not: a state this peer did not move to (a
        dead branch nobody serves, a history it does not trust, a claim it refused) keeps its number, and
        extending ``snap`` under it would be a second state of that number (a restarted node that refuses
        dead strangers' revision N and then commits its own N with its group).
        A revision this peer voted for and aborted counts as reported (:meth:`undecided`). Plus a margin
        for a branch's last commits whose records never spread (see SKIP_MARGIN). A claim
        more than MAX_SKIP ahead cannot be passed (the join record's bound) and is left out: keys minted
        to claim far revisions move no number, and a near claim moves it at most MAX_SKIP per commit.
        """
        seen = [r.revision for r in self._records.states.values()] + [r for r, _ in self._unserved]
        seen += self._undecided  # revisions this peer voted for and aborted (see undecided)
        beyond = [r - snap.revision for r in seen if 0 < r - snap.revision <= MAX_SKIP]
        return min(max(beyond) + SKIP_MARGIN, MAX_SKIP) if beyond else 0

    def trusted(self) -> frozenset[str]:
        """Peers whose state records may move this one (see :func:`decide_catch_up`)."""
        return self.bootstrap | frozenset(self._partners)

    def add_partners(self, members: Iterable[str]) -> None:
        """Members of a round this peer committed: now partners it can check (most recent last)."""
        for peer in members:
            if peer != self._me:
                self._partners.pop(peer, None)
                self._partners[peer] = None
        while len(self._partners) > MAX_PARTNERS:
            del self._partners[next(iter(self._partners))]

    def distrust(self, peers: Iterable[str]) -> None:
        """Suspects of a round are no longer trusted for catch-up."""
        for peer in peers:
            self._partners.pop(peer, None)

    def newcomer(self, snap: Snapshot) -> bool:
        """No history yet: revision 0 and no round committed. Its anchor is only its own initialisation."""
        return snap.revision == 0 and not self._partners

    def decide(self, snap: Snapshot, ping: bool = True) -> CatchUpDecision:
        """Read the state records and decide (pinging trusted peers at this state if they outvote a claim ahead).

        Only states of this peer's own history count (any, for a peer with none yet): across histories
        only a merge moves a peer (:mod:`swarm.sync.merge`).
        """
        states = same_history(self._records.read_states(), snap.origin)
        leaders = self.bootstrap if self.newcomer(snap) else frozenset()
        trusted, ignored = self.trusted(), self.ignored()
        own = self.own_claim if self.own_claim is not None and self.own_claim[0] > snap.revision else None
        self.own_claim = own
        mine = (snap.revision, snap.state_hash)
        decision = decide_catch_up(states, *mine, self._me, trusted, leaders, ignored, None, own)
        outvoted = CatchUpRefusal.OUTVOTED in decision.refused.values()
        if ping and decision.target is None and outvoted and self._alive is not None:
            staying = staying_peers(states, snap.revision, snap.state_hash, trusted)[:64]
            alive = self._alive([p for p in staying if p != self._me], self._cfg.ping_timeout_s)
            decision = decide_catch_up(states, *mine, self._me, trusted, leaders, ignored, alive, own)
        return decision

    def catch_up(self, snap: Snapshot, leaving: Callable[[], bool]) -> Snapshot | None:
        """The checked state to move to from ``snap``, or None if not behind; raises SyncAborted on failure.

        :class:`StateDownloadFailed` says with ``retry`` whether this peer should
        wait for the next round rather than sync at its own state (which would
        fork the history if the target is real).
        """
        target = self._target(snap)
        if target is None:
            return None
        end = self._clock() + self._cfg.state_bound_s(snap.anchor.numel())
        vouched = target  # what the trusted peers' vote chose: the bound stays its own, whatever a donor serves
        for donor in target.donors:
            left = end - self._clock()
            if left <= 0:
                break
            if leaving():
                raise SyncAborted("leaving before the state download", AbortCause.SHUTTING_DOWN)
            try:
                got = self._fetch(donor, snap.anchor.numel(), left)
            except Exception as e:
                self._log(logging.WARNING, "state download from %s failed: %s", donor[-6:], e)
                continue
            refusal = self._judge(snap, got, target, vouched)
            if refusal is None and self.merged and got.origin == snap.origin:
                refusal = CatchUpRefusal.OFF_TARGET  # a merge moves to another history, never within its own
            if refusal is CatchUpRefusal.OFF_TARGET and self._out_of_reach(donor, got, vouched, snap):
                # a partner's one word named the target, and it serves a state far past it: passed over at
                # once, or new claims of it would hold this peer's sync for RETRY_S each
                self._refused(donor, CatchUpRefusal.OUT_OF_REACH)
                self._fail(vouched, refused=True)
                continue
            if refusal is CatchUpRefusal.OFF_TARGET and not self.merged and self._moved_on(donor, got, vouched, snap):
                # a trusted donor committed again since its record: its state now is as good as its word,
                # within the bound of the state it was vouched for (its served revision is its own claim)
                target = CatchUp(got.revision, got.state_hash, (donor,), vouched.contested, vouched.lone)
                refusal = self._judge(snap, got, target, vouched)
            if refusal is CatchUpRefusal.OFF_TARGET:
                self._refused(donor, refusal)
                continue
            if refusal is not None:  # the target's bytes themselves are implausible: every donor serves them
                self._refused(donor, refusal)
                self._fail(target, refused=True)
                self._fail(vouched, refused=True)  # a donor that moved on to an implausible state: not again
                if self.merged:  # a made-up history is not downloaded again every check
                    self._shunned[got.origin] = self._clock()
                raise StateDownloadFailed(f"target state refused: {refusal.value}", retry=False)
            self._log(logging.INFO, "caught up from %s: %s", donor[-6:], got.state_hash[:8])
            if self.merged:
                self._merged_at, self._merge_winner = self._clock(), ""
                self.merges += 1
                # its new history's live peers become partners: a merged peer that trusted none of them
                # would neither follow their later commits nor see that they superseded its round, and
                # extending a state they already extended forks the history it joined
                self.add_partners(self._merge_peers)
            return got
        if self._led(snap, target):
            # its own weights are only an initialisation: syncing on them would start a second history
            # beside the swarm it was pointed at (its bootstrap peer frozen or busy): wait for a donor
            raise StateDownloadFailed("no donor served the bootstrap peers' state yet", retry=True)
        self._fail(target, refused=False)
        if self.merged:  # this peer's own history is whole: it syncs on in it and checks again later
            raise StateDownloadFailed("no donor served the history to merge into", retry=False)
        retry = (target.revision, target.state_hash) not in self.ignored()
        raise StateDownloadFailed("no donor served the target state", retry=retry)

    def _target(self, snap: Snapshot) -> CatchUp | None:
        """The state to download: a catch-up within this peer's history, else a merge into another, else None
        (:attr:`merged` says which)."""
        self.merged = False
        self._records.refresh_state(snap.revision, snap.state_hash, snap.origin)
        decision = self.decide(snap)
        for peer, reason in decision.refused.items():
            self._refused(peer, reason)
        target = decision.target
        if target is not None:
            self._log(
                logging.INFO, "behind or diverged: catching up to rev=%d %s", target.revision, target.state_hash[:8]
            )
            return target
        target = self._merge_target(snap)
        if target is not None:
            self.merged = True
            self._log(
                logging.WARNING,
                "another history has more live peers: merging into rev=%d %s (keeping this peer's weights)",
                target.revision,
                target.state_hash[:8],
            )
        return target

    def _merge_target(self, snap: Snapshot) -> CatchUp | None:
        """The state of a history with more live peers than this peer's own, if any (see swarm.sync.merge).

        Checked at most every :data:`MERGE_CHECK_S` and only while records name another history, so a
        swarm with one history pings nobody for it; never within :data:`MERGE_COOLDOWN_S` of a merge.
        A history is merged into once two checks in a row find it winning.
        """
        now = self._clock()
        if not snap.origin or self._alive is None or now - self._merged_at < MERGE_COOLDOWN_S:
            return None
        states = self._records.states
        if not any(r.origin not in ("", snap.origin) for r in states.values()):
            return None
        if now - self._merge_checked < MERGE_CHECK_S:
            return None
        self._merge_checked = now
        self._shunned = {o: t for o, t in self._shunned.items() if now - t < MERGE_COOLDOWN_S}
        states = {p: r for p, r in states.items() if r.origin not in self._shunned}
        alive = self._alive(to_ping(states, self._me, snap.origin), self._cfg.ping_timeout_s)
        target = decide_merge(states, self._me, snap.origin, alive, self.ignored())
        winner = "" if target is None else states[target.donors[0]].origin
        self._merge_peers = sorted(p for p in alive if p in states and states[p].origin == winner)
        # two checks in a row must name the winner: peers of both histories that read the records a moment
        # apart (a bridge peer's record changing history) could otherwise each merge into the other's
        confirmed, self._merge_winner = winner == self._merge_winner, winner
        return target if confirmed else None

    def _led(self, snap: Snapshot, target: CatchUp) -> bool:
        """Whether ``target`` is a state this newcomer's bootstrap peers report: it is never passed over.

        A newcomer that gave up on it after :data:`RETRIES` rounds (its only bootstrap peer frozen
        during its first catch-up) would sync at its own initial weights with whoever it meets there,
        and two histories would grow from revision 0 side by side.
        """
        return self.newcomer(snap) and bool(set(target.donors) & self.bootstrap)

    def orphaned(self, snap: Snapshot) -> bool:
        """Whether every peer this one trusts is gone while a live stranger reports a later state.

        Such a node (its whole group died while it was down) would otherwise sync
        with whoever shares its stale state and start a second history beside the
        live one. It cannot follow strangers (the trust rule), so it
        pauses its sync instead: it trains on, and a restart with a live
        ``--peer`` (or a trusted peer coming back) rejoins it. Keys minted to
        claim later states cannot cause this: it needs every trusted peer silent,
        whether or not its record is still in the DHT (the 64 most recent are pinged).
        A node that trusts no one yet (the first node of a swarm, before its first commit) is no orphan:
        see :meth:`_alone_behind`.
        Costs one ping round (bounded by ``ping_timeout_s``), only when strangers are ahead.
        """
        trusted = self.trusted()
        if self._alive is None:
            return False
        states = same_history(self._records.states, snap.origin)  # another history's peers may merge with it
        ahead = sorted((p for p, r in states.items() if p not in trusted and r.revision > snap.revision))[:16]
        if not ahead:
            return False
        if not trusted:
            self._alone_behind(ahead)
            return False
        # every trusted peer, not only those with a record: a flood of records can evict theirs from the
        # DHT's storage while they live on, and a stranger's claim alone must not pause this node
        friends = list(dict.fromkeys([*reversed(self._partners), *sorted(self.bootstrap)]))[:64]
        answered = self._alive([*friends, *ahead], self._cfg.ping_timeout_s)
        if answered & set(friends) or not answered & set(ahead):
            return False
        self._log(
            logging.WARNING,
            "no peer this node trusts answers while %d others report later states: pausing the sync "
            "(restart with --peer <a live peer> to rejoin their history)",
            len(answered & set(ahead)),
        )
        return True

    def _alone_behind(self, ahead: list[str]) -> None:
        """Say once that this peer, trusting no one, is left behind by live peers at later states.

        The first node of a swarm trusts no one until it commits a round. If it
        misses its joiners' first rounds (frozen, busy, restarted before its
        first commit), they go on without it, and it cannot follow them: a
        stranger's claim must not move it, or a key minted against a fresh
        swarm's founder would hand every later joiner (who follows the founder)
        a made-up state. It keeps syncing at its own state (a joiner at it may
        still come) rather than pause: pausing on strangers' claims would let
        one key stop a founder's sync. The operator's fix is a ``--peer``.
        """
        if self.alone_warned:
            return
        answered = self._alive(ahead, self._cfg.ping_timeout_s) if self._alive is not None else set()
        if not answered:
            return
        self.alone_warned = True
        self._log(
            logging.WARNING,
            "this node trusts no peer yet (it was started without --peer and has committed no round) while %d "
            "live peers report later states; it cannot join their history: restart it with --peer <a live peer>",
            len(answered),
        )

    def _moved_on(self, donor: str, got: Snapshot, target: CatchUp, snap: Snapshot) -> bool:
        """Whether ``got`` is a trusted donor's later state than the target it was asked for.

        A fast group commits several times a second (early close, short rounds), so
        by the time a download starts its donors have moved on and the exact target
        is gone; an untrusted donor must still serve exactly the target. A contested
        or lone target rests on one trusted word: its donor may move on only as far
        as one word may reach (:data:`MAX_CONTESTED_AHEAD` past this peer), and the
        state is judged against the target's bound either way (:meth:`_judge`).
        """
        if donor not in self.trusted() or got.revision <= target.revision:
            return False
        one_word = target.contested or target.lone
        return not one_word or got.revision - snap.revision <= MAX_CONTESTED_AHEAD

    def _out_of_reach(self, donor: str, got: Snapshot, target: CatchUp, snap: Snapshot) -> bool:
        """Whether a trusted donor moved on further than the one word the target rests on may reach."""
        moved = not self.merged and donor in self.trusted() and got.revision > target.revision
        return moved and not self._moved_on(donor, got, target, snap)

    def _refused(self, peer: str, reason: CatchUpRefusal) -> None:
        """Count a refused claim or state; WARNING once per (peer, reason), DEBUG after."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        new = (peer, reason) not in self._reported
        if new and len(self._reported) < 4096:
            self._reported.add((peer, reason))
        self._log(logging.WARNING if new else logging.DEBUG, "catch-up refused %s: %s", peer[-6:], reason.value)

    def _judge(self, snap: Snapshot, got: Snapshot, target: CatchUp, vouched: CatchUp) -> CatchUpRefusal | None:
        """Exactly the target, finite, and plausibly close to this peer's own anchor (else why not).

        A newcomer takes its bootstrap peers' state at any distance: its own
        weights may be another seed's initialisation, or a group that trained
        for hours moved far from them; it trusts whom it was told to join.
        The distance bound is fixed by this peer's own evidence: the revisions
        the ``vouched`` target is ahead, never more than this peer's own pace
        allows since its last commit (:func:`~swarm.sync.decide.plausible_ahead`).
        """
        if (got.revision, got.state_hash) != (target.revision, target.state_hash):
            return CatchUpRefusal.OFF_TARGET
        finite = bool(torch.isfinite(got.anchor).all()) and bool(torch.isfinite(got.momentum).all())
        if self.newcomer(snap) and set(target.donors) & self.bootstrap:
            return None if finite else CatchUpRefusal.NOT_FINITE
        own = snap.anchor
        shift = distance(got.anchor, own) if finite else math.inf
        momentum = norm(got.momentum) if finite else math.inf
        # k steps of honest training move the anchor about k times as far as one: a node restarted from an
        # old checkpoint must still be able to rejoin its group's history. Another history's numbers say
        # nothing of its distance (they interleave with this one's): a merge gets one step.
        claimed = vouched.revision - snap.revision
        ahead = 1 if self.merged else plausible_ahead(claimed, list(self._stepped), self._clock())
        max_shift = self._cfg.max_state_shift * ahead
        refusal = check_downloaded_state(norm(own), shift, momentum, finite, max_shift, self._cfg.outer_momentum)
        # one trusted word bounds a move by this peer's own steps; a peer with none yet (it joined through its
        # bootstrap peer and has not committed since) has only the state it downloaded to compare with
        if refusal is None and (target.contested or (target.lone and self._steps)):
            return check_contested_step(shift, list(self._steps), self._cfg.clip_factor, ahead)
        return refusal


def same_history(states: dict[str, StateRecord], origin: str) -> dict[str, StateRecord]:
    """The records of history ``origin`` and of peers with none yet; all of them for a peer with none."""
    if not origin:
        return states
    return {p: r for p, r in states.items() if r.origin in (origin, "")}
