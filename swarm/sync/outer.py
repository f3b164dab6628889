"""Fault-tolerant DiLoCo outer sync: never half-applied, never hung.

One round, on every member (M, A, C, S, d = the window's length,
allreduce_bound_s, commit_timeout_s, state_bound_s, dht_timeout_s; A and S
grow with the model's bytes at ``min_link_mbit``; M is matchmaking_timeout_s
unless the window's opener measured slower syncs, at most 3x it:
:func:`swarm.sync.decide.window_for`, so that a group that lost a race at
the same parent still finds the next window open after it caught up):

1. Catch-up: read the state records of this architecture; if more trusted
   peers (round partners, peers named to join through) report a newer state
   (or another hash at this revision) than report this peer's own (those
   that still answer a ping), or one trusted peer a state a few revisions
   on whose shift this peer's own steps can account for, download
   (anchor, any momentum, revision) from a peer at the target, verify the hash,
   that it is finite and plausibly close to this peer's own anchor, and
   move to it (:mod:`swarm.sync.catchup`); the weights keep this peer's own
   progress on top (:meth:`OuterSync.apply`). Keys that are not trusted
   vouch nothing. Only states of this peer's own history (its origin) count;
   when live peers of another history outnumber its own, it merges into
   theirs instead, keeping its weights (:mod:`swarm.sync.merge`).
2. Matchmaking: signed join records under (fingerprint, revision, state
   hash), so only peers sharing the same history meet; a gather window
   opened at ``w`` closes at ``w + M`` (:func:`decide_group`). Every joiner
   read is pinged at once; only those that answered by the close (waiting at
   most P = ping_timeout_s more) are members (:mod:`swarm.sync.liveness`), so
   keys that never come online cost nothing. Group id = hash of the sorted
   members; fewer than ``min_group_size`` -> "no partner".
3. All-reduce by ``w + M + A``: reduce-scatter + all-gather of the reducers'
   exact bytes (:mod:`swarm.sync.allreduce`).
4. Commit vote: if a trusted peer now reports a later state than the
   round's parent (another group extended it meanwhile), vote abort: a
   commit would fork the history. Else each member publishes a signed digest of (group id,
   revision, every slice's bytes), or "abort"; apply only if all members
   voted the same digest, seen by a read begun by ``D = w + M + A + C``
   (:func:`decide_commit`). Then revision += 1, and a signed (revision,
   state hash) record is published. A member whose vote is still missing
   and that does not answer a ping (bounded by P and by ``D``) is gone:
   this member votes abort, and every member ends the round at once.

Time bound. All deadlines are absolute from ``w``, and ``w`` is at most the
time this peer first read the join key, so a stalled or dead peer cannot
push anyone's deadlines. One ``sync_now`` returns within

    T_max = M + A + max(C, d) + S + 3 P + 6 d   (+ local O(params) compute)

Counted with every DHT call taking its full d: the catch-up check refreshes
and reads the state records (2 d), may ping the trusted peers that report
this peer's own state (P), may ping the peers of this and other histories to
tell whether to merge (P, :mod:`swarm.sync.merge`), may ping trusted peers and
strangers ahead to tell whether it is orphaned (P), and, when it runs (a
catch-up or a merge), downloads within S and
stores the new state record (d); the round's first join read (d) fixes w;
from w: the window M, the all-reduce ends by ``w + M + A`` (a late group
decision, with the join store, last group read and pings overrunning the
window by up to 2 d + P, only shortens it; A >= d is enforced so the abort
path fits too), the last vote read begins by ``w + M + A + max(C, d)`` and
takes up to d, and the state store after a commit up to d (or, when a lost
member ends the round, the abort vote's store: pings there are cut at ``D``).
``OuterSyncConfig.max_sync_seconds`` computes it (adding 1 s for compute).

Residual risk (repaired by catch-up): if a member's last vote read misses a
vote that another member's earlier read saw (DHT replicas out of step), or a
member stalled past ``D``, that member discards while others commit. It is
then behind the group's revision, and step 1 makes it download the state
before its next sync, so no one ever averages a diverged history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from protocol.signing import ED25519, Signatures
from swarm.fingerprint import model_fingerprint, sync_fingerprint
from swarm.membership import Membership
from swarm.sync.allreduce import RoundPlan, Snapshot, SyncService
from swarm.sync.assemble import Assembled, OwnScale, assemble, next_state
from swarm.sync.catchup import CatchUpper
from swarm.sync.config import (
    AbortCause,
    OuterSyncConfig,
    SyncAborted,
    SyncOutcome,
    SyncPhase,
    SyncReport,
    phase_seconds,
)
from swarm.sync.decide import CatchUpRefusal, CommitDecision, GroupDecision, peers_named_in, window_for
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.hivemind_transport import hivemind_net
from swarm.sync.job import RoundOutcome, SyncJob, apply_outcome
from swarm.sync.journal import JournalStore, VoteJournal, journal_path
from swarm.sync.liveness import Prober
from swarm.sync.pipe import PipedStreams
from swarm.sync.points import Observer, RoundPoint
from swarm.sync.records import ABORT_DIGEST, valid_origin
from swarm.sync.robust import Suspicion, distance
from swarm.sync.schedule import Schedule
from swarm.sync.tensors import flatten, state_hash
from swarm.sync.transport import Streams, SyncNet
from swarm.sync.vetoes import VetoTally

logger = logging.getLogger(__name__)

BANNED_FOR = (Suspicion.REDUCED_NOT_FINITE, Suspicion.REDUCED_TOO_LARGE, Suspicion.GARBAGE_PART, Suspicion.VETOED)
"""Suspicions that leave a member out of sync groups for ``suspect_ban_s``. A merely clipped part is
not among them: clipping bounds it already, and an honest member near the bound may be clipped by
one reducer only, and a ban on one side only splits the group."""
_SPENT = torch.empty(0)

RECENT_SYNCS = 8
"""Rounds whose all-reduce seconds set the length of the windows this peer opens (decide.window_for)."""
"""What an :class:`Assembled` holds as its average once the outer step has consumed it."""


def fit_momentum(momentum: torch.Tensor, n: int) -> torch.Tensor:
    """A checkpoint's momentum as a state of this rule holds it: ``n`` values (0 without momentum).

    A checkpoint written under the other ``--outer-momentum`` setting has the other size: its old hash
    named a state in another rule's namespace, where no peer of this one vouches for it, so the buffer
    restarts at zero (or is dropped) and the anchor is kept.
    """
    return momentum if momentum.numel() == n else torch.zeros(n, dtype=torch.float32, device=momentum.device)


class OuterSync:
    """DiLoCo outer sync of ``module`` with the peers of the same fingerprint.

    The anchor starts as the module's current weights (revision 0, zero
    momentum). Call :meth:`maybe_sync` after every inner step; always :meth:`close`.
    ``observe`` hears the points each round passes (:mod:`swarm.sync.points`); ``net`` is the network
    (:mod:`swarm.sync.transport`; default: the membership's hivemind daemon and DHT); ``signatures``
    sign and check its records (Ed25519; a simulation's cheaper ones: :class:`protocol.signing.Signatures`);
    ``journal`` keeps its votes (default: a file beside the identity, :mod:`swarm.sync.journal`).
    """

    def __init__(
        self,
        membership: Membership,
        module: torch.nn.Module,
        cfg: OuterSyncConfig,
        clock: Callable[[], float] = time.time,
        observe: Observer | None = None,
        net: SyncNet | None = None,
        signatures: Signatures = ED25519,
        journal: JournalStore | None = None,
    ) -> None:
        self.cfg, self.module, self._clock, self._observe = cfg, module, clock, observe
        self._net = net = net if net is not None else hivemind_net(membership)
        self.peer_id = membership.peer_id
        self.fingerprint = sync_fingerprint(model_fingerprint(module), cfg.rule())
        anchor = flatten(module)
        momentum = torch.zeros(cfg.momentum_elems(anchor.numel()), dtype=torch.float32, device=anchor.device)
        self._snap = Snapshot(0, state_hash(anchor, momentum), anchor, momentum)
        # the state the module's weights are based on; _snap runs ahead of it while a round's
        # outcome waits to be applied, and checkpoints save this one (weights and anchor agree)
        self._applied = self._snap
        # the inner step the applied anchor's un-synced progress starts at (a part counts by the steps
        # since); None after restoring a checkpoint that did not record it: the next job counts 1
        self._anchor_step: int | None = 0
        self._records = SyncRecords(membership, self.fingerprint, cfg, clock, net.loop.sleep, net.records, signatures)
        self._scale = OwnScale()
        """This member's own evidence of an honest slice's scale (swarm.sync.assemble)."""
        name = f"{membership.cfg.swarm_id}.sync.{self.fingerprint}"
        bootstrap = peers_named_in(membership.cfg.initial_peers)
        hints = self._records.hints
        # streams between two homes go through a third peer (swarm.sync.pipe), never a libp2p circuit
        prefix = f"{membership.cfg.swarm_id}.sync"
        self._streams: Streams = net.streams
        self._pipes: PipedStreams | None = None
        if membership.cfg.use_relay:
            self._streams = self._pipes = PipedStreams(
                net.streams, membership.identity.key, prefix, hints.relays, lambda peer: hints.behind_nat(peer),
                sorted(bootstrap), signatures, clock,
            )  # fmt: skip
        self._service = SyncService(
            self._streams,
            name,
            self.peer_id,
            cfg.chunk_timeout_s,
            lambda: self._snap,
            clock,
            observe,
            register_timeout=cfg.allreduce_timeout_s,
            # a node that accepts no incoming connections cannot take payloads directly either: with no
            # listener it asks senders for the stream at once (none waits out a connect to it); it still
            # sends its own directly to owners that listen
            direct_host=membership.cfg.host if cfg.direct_payloads and not membership.cfg.client_mode else None,
            direct_send=cfg.direct_payloads,
            max_state_serves=cfg.max_state_serves,
            state_deadline=cfg.state_bound_s(anchor.numel()),  # a stalled reader frees its slot by then
        )
        self._service.hints = self._records.hints  # addresses read with the records, dialled by the service
        net.loop.run(self._service.start(), cfg.dht_timeout_s)
        self._prober = Prober(net.loop, self.peer_id, self._service, cfg.ping_timeout_s)
        self._closed = False
        self._leaving = threading.Event()
        self._waiting_for = ""
        """The reason of the last catch-up retry: repeats go to DEBUG (a newcomer may wait for minutes)."""
        self._schedule = Schedule(cfg.sync_every, cfg.sync_period_s, clock())
        self._catchup = CatchUpper(
            self.peer_id, self._records, self._fetch_state, cfg, bootstrap, self._log, clock, self._prober.check
        )
        self._group: tuple[int, tuple[str, ...]] = (-1, ())
        self._marks: dict[SyncPhase, float] = {}
        self._recent: deque[float] = deque(maxlen=RECENT_SYNCS)
        """All-reduce seconds of the last rounds that voted: the window this peer opens (window_for)."""
        """When this round's phases began (:meth:`_mark`); the report's ``phases`` come from them."""
        self._vetoes = VetoTally()
        store = journal if journal is not None else journal_path(membership.identity.path)
        self._journal = VoteJournal(store, self.fingerprint)
        for revision in self._journal.voted:  # votes of an earlier process of this peer id (see swarm.sync.journal)
            self._catchup.undecided(revision)
        self._records.publish_state(self._snap.revision, self._snap.state_hash, self._snap.origin)
        self._log(logging.INFO, "outer sync ready: fingerprint %s, %d parameters", self.fingerprint, anchor.numel())

    @property
    def revision(self) -> int:
        """The name of the committed state: +1 per commit (more only past a dead branch: see JoinRecord.skip)."""
        return self._snap.revision

    @property
    def state_hash(self) -> str:
        """sha256 hex of the anchor and outer momentum (none with ``outer_momentum`` 0)."""
        return self._snap.state_hash

    def state_dict(self) -> dict[str, Any]:
        """The outer state to checkpoint: revision, anchor and momentum (CPU copies) of the applied state."""
        snap = self._applied
        return {
            "revision": snap.revision,
            "origin": snap.origin,  # the history's name: a restart must not look like a history of its own
            "anchor": snap.anchor.cpu().clone(),
            "momentum": snap.momentum.cpu().clone(),
            "trust": self._catchup.state_dict(),  # a restart keeps its partners: see swarm.sync.catchup, "Forks"
            "anchor_step": self._anchor_step,
            "scale": self._scale.state_dict(),  # a restart still judges reducers by what it saw
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the module's weights are left as they are) and announce it."""
        device = self._snap.anchor.device
        anchor = state["anchor"].to(device, torch.float32)
        momentum = state["momentum"].to(device, torch.float32)
        if anchor.shape != self._snap.anchor.shape or momentum.numel() not in (0, anchor.numel()):
            raise ValueError(
                f"outer-sync state has {anchor.numel()} values; this model has {self._snap.anchor.numel()}"
            )
        momentum = fit_momentum(momentum, self._snap.momentum.numel())
        revision = int(state["revision"])
        origin = state.get("origin", "")
        if not valid_origin(origin):
            raise ValueError(f"outer-sync state names a malformed origin {origin!r}")
        self._snap = self._applied = Snapshot(revision, state_hash(anchor, momentum, origin), anchor, momentum, origin)
        step = state.get("anchor_step")
        self._anchor_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        scale = state.get("scale")
        if isinstance(scale, list):
            self._scale.load_state_dict(scale)
        trust = state.get("trust")
        if isinstance(trust, dict):
            self._catchup.load_state_dict(trust)
        # a record this peer signed before the restart may name a later state: it committed that
        # one after its last checkpoint, and must rejoin it rather than extend this one again
        own = self._records.read_states().get(self.peer_id)
        if own is not None and own.revision > revision:
            self._log(logging.INFO, "own record says rev=%d %s: catching up to it", own.revision, own.state_hash[:8])
            self._catchup.own_claim = (own.revision, own.state_hash)
        self._records.publish_state(revision, self._snap.state_hash, origin)

    def _log(self, level: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s rev=%d] " + msg, self.peer_id[-6:], self._snap.revision, *args)

    def maybe_sync(self, inner_step: int) -> SyncReport | None:
        """Sync now if the schedule says so after ``inner_step`` (see :class:`Schedule`); else None."""
        now = self._clock()
        if not self._schedule.due(inner_step, now):
            return None
        self._schedule.begun(now)
        return self.sync_now(inner_step)

    def sync_now(self, inner_step: int | None = None) -> SyncReport:
        """Catch up if needed, run one round and apply its outcome; never raises SyncAborted (see the report)."""
        outcome = self.run(replace(self.prepare(inner_step), blocking=True))
        self.apply(outcome)
        return outcome.report

    def max_sync_seconds(self) -> float:
        """Upper bound on one round of this model (:meth:`OuterSyncConfig.max_sync_seconds`)."""
        return self.cfg.max_sync_seconds(self._snap.anchor.numel())

    @property
    def anchor_step(self) -> int | None:
        """The inner step the applied anchor's un-synced progress starts at (None: not known)."""
        return self._anchor_step

    def prepare(self, inner_step: int | None = None) -> SyncJob:
        """The next round's job: the applied anchor, the weights now and the inner steps trained since the
        anchor, counted from ``inner_step`` (call on the thread that trains; without it the part counts 1)."""
        since = self._anchor_step
        steps = 1 if inner_step is None or since is None else inner_step - since
        return SyncJob.taken(self._applied, flatten(self.module), steps, inner_step)

    def apply(self, outcome: RoundOutcome) -> None:
        """Put a round's outcome into the weights, keeping every inner step (call on the thread that trains).

        A commit: the new anchor plus what was trained since the job was taken
        (the job's progress went into the average). A catch-up only: the
        downloaded anchor plus all this peer's progress since its own anchor,
        which it contributes to the next round. Nothing installed: nothing to do.
        """
        new = outcome.installed
        if new is None:
            return
        if outcome.report.merged and not outcome.report.committed:
            self._applied = new  # a merge keeps the weights as they are: they are its part (SyncJob.rebased)
            return
        apply_outcome(outcome, self.module)
        self._applied = new
        if outcome.report.committed:  # the job's steps are in the average; those trained since are not
            self._anchor_step = outcome.job.step

    def run(self, job: SyncJob) -> RoundOutcome:
        """Catch up if needed, then run one round of ``job`` (the module is not touched: see :meth:`apply`).

        A failed catch-up is logged and the round runs at the current state:
        it can only meet peers with the same (revision, state hash).
        """
        if self._closed:
            raise RuntimeError("OuterSync is closed")
        t0 = self._clock()
        self._marks = {SyncPhase.CATCH_UP: t0}
        start = self._snap
        if self._leaving.is_set():
            return RoundOutcome(self._report(t0, AbortCause.SHUTTING_DOWN, 0, 0), job, None)
        try:
            caught_up = self._maybe_catch_up()
        except SyncAborted as e:
            if isinstance(e, StateDownloadFailed) and e.retry:
                # the target may be real (its donors frozen, or moved on meanwhile): syncing at this
                # state now could extend it a second time and fork the history; retry next round
                level = logging.DEBUG if e.reason == self._waiting_for else logging.WARNING
                self._waiting_for = e.reason
                self._log(level, "catch-up failed (%s); retrying next round", e.reason)
                return RoundOutcome(self._report(t0, e.cause, 0, 0), job, None)
            # Safe to go on: join keys carry (revision, state hash), so this peer can only
            # meet peers with exactly its history. A peer claiming a revision it cannot serve
            # must not stop everyone else from syncing (passed over after RETRIES rounds and RETRY_S).
            self._log(logging.WARNING, "catch-up failed (%s); syncing at the current state", e.reason)
            caught_up = False
        self._waiting_for = ""
        merged = caught_up and self._catchup.merged
        if merged:
            job = job.rebased(self._snap)
        if not caught_up and self._catchup.orphaned(self._snap):
            return RoundOutcome(self._report(t0, AbortCause.ORPHANED, 0, 0), job, None)
        self._prober.reset(self._snap.revision)
        parent = self._snap.state_hash
        try:
            report = self._round(t0, job, caught_up)
        except SyncAborted as e:
            self._log(logging.WARNING, "round aborted: %s", e.reason)
            report = self._report(t0, e.cause, 0, 0, caught_up)
        finally:
            self._prober.done()  # from now on parts naming any unregistered group are refused at once
        report.parent, report.merged = parent, merged
        return RoundOutcome(report, job, None if self._snap is start else self._snap)

    def _report(
        self,
        t0: float,
        cause: AbortCause | None,
        size: int,
        sent: int,
        caught_up: bool = False,
        gid: str = "",
        outcome: SyncOutcome | None = None,
    ) -> SyncReport:
        """The round's report: aborted with a ``cause``, else committed (or the ``outcome`` given: no partner)."""
        now = self._clock()
        snap = self._snap
        outcome = outcome or (SyncOutcome.ABORTED if cause is not None else SyncOutcome.COMMITTED)
        committed = outcome is SyncOutcome.COMMITTED
        report = SyncReport(
            now, self.peer_id, snap.revision, snap.state_hash, committed, size, outcome, now - t0, sent, caught_up, gid
        )
        report.cause = cause
        report.phases = phase_seconds(self._marks, now)
        if SyncPhase.VOTE.value in report.phases:  # an all-reduce that finished: a measure of the links
            self._recent.append(report.phases[SyncPhase.ALLREDUCE.value])
        report.origin = snap.origin
        report.catch_up_refused = {why.value: n for why, n in self.catch_up_refusals.items()}
        return report

    def _passed(self, point: RoundPoint, revision: int) -> None:
        if self._observe is not None:
            self._observe(point, revision)

    def _mark(self, phase: SyncPhase) -> float:
        """Note that ``phase`` begins now (the previous one ends); returns the time."""
        now = self._marks[phase] = self._clock()
        return now

    # ---- catch-up -----------------------------------------------------------------------------

    def trusted(self) -> frozenset[str]:
        """Peers whose state records may move this one (see :mod:`swarm.sync.catchup`)."""
        return self._catchup.trusted()

    @property
    def catch_up_refusals(self) -> dict[CatchUpRefusal, int]:
        """State claims and downloads refused so far, by reason."""
        return self._catchup.refusals

    def _fetch_state(self, donor: str, n: int, timeout: float) -> Snapshot:
        fetch = self._service.fetch_state(donor, n, timeout, self.cfg.momentum_elems(n))
        got: Snapshot = self._net.loop.run(fetch, timeout + 1)
        return got

    def _maybe_catch_up(self) -> bool:
        got = self._catchup.catch_up(self._snap, self._leaving.is_set)
        if got is None:
            return False
        self._install(got, caught_up=True)
        return True

    def _install(self, snap: Snapshot, caught_up: bool = False) -> None:
        if not caught_up and snap.revision > self._group[0] >= 0:
            # a commit of the round just planned: its members are now partners this peer can check,
            # and its step is a scale for the next revisions others report (a contested catch-up)
            self._catchup.add_partners(self._group[1])
            self._catchup.note_step(distance(snap.anchor, self._snap.anchor))
        self._snap = snap  # served to peers at once; the weights follow in apply()
        self._records.publish_state(snap.revision, snap.state_hash, snap.origin)

    # ---- one round ----------------------------------------------------------------------------

    def _round(self, t0: float, job: SyncJob, caught_up: bool) -> SyncReport:
        snap = self._snap
        # the job's weight: the inner steps since the anchor, 0 if nothing was trained (SyncJob.weight). A
        # peer that just caught up contributes the progress it keeps (apply() re-applies it on the new anchor).
        self._records.skip = self._catchup.skip(snap)
        self._mark(SyncPhase.MATCHMAKE)
        open_s = window_for(self.cfg.matchmaking_timeout_s, self._recent)
        decision = self._records.matchmake(
            snap.revision, snap.state_hash, self._prober, self._leaving.is_set, open_s, self._catchup.trusted()
        )
        if decision.status == "yielded":
            self._log(logging.INFO, "a group of %d is under way from this state (window %.2f): waiting for its "
                      "commit", len(decision.members), decision.window_start)  # fmt: skip
            return self._report(t0, None, 0, 0, caught_up, outcome=SyncOutcome.YIELDED)
        if decision.status != "ready":
            self._log(logging.INFO, "%s (window %.2f)", decision.status, decision.window_start)
            if decision.status in ("not in group", "leaving"):
                cause = AbortCause.NOT_IN_GROUP if decision.status == "not in group" else AbortCause.SHUTTING_DOWN
                return self._report(t0, cause, len(decision.members), 0, caught_up)
            return self._report(t0, None, len(decision.members), 0, caught_up, outcome=SyncOutcome.NO_PARTNER)
        plan = self._plan(decision, snap)
        self._passed(RoundPoint.MATCHMADE, snap.revision)
        deadline = plan.deadline + self.cfg.commit_timeout_s
        t_ar = self._mark(SyncPhase.ALLREDUCE)
        try:
            got = self._allreduce(plan, snap, job)
        except SyncAborted as e:
            self._records.vote(plan, ABORT_DIGEST)
            self._log(logging.WARNING, "all-reduce failed: %s; discarding the round", e.reason)
            return self._report(t0, e.cause, len(plan.members), 0, caught_up, plan.group_id)
        allreduce_s = self._clock() - t_ar
        self._passed(RoundPoint.ALLREDUCED, snap.revision)
        # checked BEFORE voting, so a bad average makes this member vote abort and nobody applies it
        self._mark(SyncPhase.VOTE)
        new, step_problem = self._outer_step(snap, got, plan.skip)
        got = replace(got, average=_SPENT)  # the outer step used it up: its memory goes back before the vote
        refusal = got.refusal or step_problem
        if refusal is None and self._superseded(snap, deadline):
            self._records.vote(plan, ABORT_DIGEST)
            return self._suspect_report(t0, plan, AbortCause.SUPERSEDED, got, caught_up)
        if self._leaving.is_set():
            # A node asked to leave may already have lost its network: Ctrl-C and most service managers
            # signal the whole process group, p2pd included. Its partners then see no vote and no ping
            # answer and abort, while its own reads (now local, stale) could show every digest: it would
            # commit alone, a second history. So leaving ends the round here.
            self._records.vote(plan, ABORT_DIGEST)
            self._log(logging.WARNING, "leaving before the vote: voted abort")
            return self._suspect_report(t0, plan, AbortCause.SHUTTING_DOWN, got, caught_up)
        if refusal is None and not self._journal.record(new.revision):
            self._records.vote(plan, ABORT_DIGEST)  # a vote a restart could forget must not count
            return self._suspect_report(t0, plan, AbortCause.UNJOURNALLED, got, caught_up)
        delivered = self._records.vote(plan, ABORT_DIGEST if refusal is not None else got.digest)
        self._passed(RoundPoint.VOTED, snap.revision)
        if refusal is not None:
            self._log(logging.WARNING, "refused the average (%s); voted abort", refusal.value)
            return self._suspect_report(t0, plan, AbortCause.REFUSED, got, caught_up)
        verdict = self._records.await_commit(plan, deadline, self._prober)
        if verdict.commit and not delivered and self._leaving.is_set():
            # its vote never reached the network and it is leaving (see above): the partners cannot
            # have counted it, so they abort; committing on its own reads would apply the round alone
            self._records.vote(plan, ABORT_DIGEST)
            verdict = CommitDecision(False, AbortCause.SHUTTING_DOWN.value)
        # a member that keeps aborting rounds the others would commit joins the suspects (swarm.sync.vetoes)
        for peer in self._vetoes.observe(plan.members, self.peer_id, verdict.vetoers):
            got.suspects[peer] = Suspicion.VETOED
        if not verdict.commit:
            self._log(logging.WARNING, "not committed: %s; keeping local weights", verdict.reason)
            self._catchup.undecided(new.revision)  # voted for it: another member may have committed it
            return self._suspect_report(t0, plan, AbortCause(verdict.reason), got, caught_up)
        self._install(new)
        self._scale.note(got.average_norm)  # an average every member checked and committed
        self._log(logging.INFO, "committed group %s: state %s", plan.group_id[:8], self._snap.state_hash[:8])
        report = self._suspect_report(t0, plan, None, got, caught_up)
        report.allreduce_s = allreduce_s
        return report

    def _superseded(self, snap: Snapshot, deadline: float) -> bool:
        """Whether a trusted peer now reports a later state than this round's parent (checked before voting).

        Such a state comes from another group that extended the same parent while
        this one gathered and reduced (this group's own members publish only after
        every vote): committing too would fork the history. Voting abort instead,
        every member of this group moves to that state at its next catch-up. Only
        with time to spare before the vote deadline (a DHT read takes up to d).
        """
        if self._clock() + self.cfg.dht_timeout_s >= deadline:
            return False
        target = self._catchup.decide(snap, ping=False).target
        if target is None or target.revision <= snap.revision:
            return False
        self._log(logging.WARNING, "superseded by rev=%d %s: voting abort", target.revision, target.state_hash[:8])
        return True

    def _suspect_report(
        self, t0: float, plan: RoundPlan, cause: AbortCause | None, got: Assembled, caught_up: bool
    ) -> SyncReport:
        report = self._report(t0, cause, len(plan.members), got.sent, caught_up, plan.group_id)
        report.suspects = {peer: why.value for peer, why in got.suspects.items()}
        # A lying reducer makes every round it is in abort, and a garbage part is sent to every
        # reducer: leave both out of the next groups (BANNED_FOR). No suspect is trusted for catch-up.
        self._catchup.distrust(got.suspects)
        now = self._clock()
        until = now + self.cfg.suspect_ban_s
        banned = self._records.banned
        for peer in [p for p, t in banned.items() if t <= now]:
            del banned[peer]
        for peer, why in got.suspects.items():
            if why in BANNED_FOR:
                self._log(logging.WARNING, "leaving %s out of sync groups for %.0f s", peer, self.cfg.suspect_ban_s)
                banned[peer] = until
        return report

    def _plan(self, decision: GroupDecision, snap: Snapshot) -> RoundPlan:
        cfg = self.cfg
        plan = RoundPlan(
            decision.group_id,
            snap.revision,
            decision.members,
            snap.anchor.numel(),
            cfg.compression,
            cfg.aggregator,
            cfg.trim_fraction,
            decision.window_start + decision.window_s + cfg.allreduce_bound_s(snap.anchor.numel()),
            cfg.clip_factor,
            cfg.max_weight_ratio,
            decision.skip,
        )
        self._group = (plan.revision, plan.members)  # trusted as partners if this round commits
        short = [m[-6:] for m in plan.members]
        self._log(logging.INFO, "group %s of %d: %s", plan.group_id[:8], len(plan.members), short)
        return plan

    def _allreduce(self, plan: RoundPlan, snap: Snapshot, job: SyncJob) -> Assembled:
        timeout = max(0.1, plan.deadline - self._clock()) + 2.0
        weight = job.weight  # read before the round: a blocking one writes the average over the job's part
        try:
            result = self._net.loop.run(self._service.allreduce(plan, job.pseudo, weight, job.blocking), timeout)
        except TimeoutError:
            raise SyncAborted("all-reduce timeout") from None
        got = assemble(plan, snap, weight, result, self.cfg.max_update, self._scale.scale())
        self._scale.note(got.own_norm)  # its own part: evidence of an honest slice's scale for later rounds
        for peer, why in got.suspects.items():
            self._log(logging.WARNING, "suspect %s in group %s: %s", peer, plan.group_id[:8], why.value)
        return got

    def _outer_step(self, snap: Snapshot, got: Assembled, skip: int = 0) -> tuple[Snapshot, Suspicion | None]:
        """The state after applying ``got.average`` (not installed here), and why not to apply it, if so."""
        new, problem, bound = next_state(snap, got, self.cfg, skip)
        if problem is not None:
            self._log(logging.WARNING, "outer step refused (%s): bound %s", problem.value, bound)
        return new, problem

    def cancel(self) -> None:
        """Leaving: a round not yet in a group ends at its next step (nobody depends on it); one in a group runs on.

        Thread-safe: called by the training thread while the round runs on the sync thread.
        """
        self._leaving.set()

    def close(self) -> None:
        """Stop serving (bounded by ``dht_timeout_s``); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._net.loop.run(self._service.stop(), self.cfg.dht_timeout_s)
        except Exception as e:
            self._log(logging.DEBUG, "stopping the sync service: %s", e)
