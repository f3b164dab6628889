"""Catch-up: whom a peer believes about the group's state, and downloading that state when it is behind.

The trust rule (SECURITY.md, "Outer sync"): state records of keys this peer
has no reason to believe vouch nothing. Trusted are the peers named to join
through (``--peer``) and the members of every round this peer committed (the
most recent :data:`MAX_PARTNERS`). A newcomer (revision 0, no round committed
yet) follows its bootstrap peers at any distance; everyone else refuses a
downloaded state that is off target, not finite, or implausibly far from its
own anchor (:func:`~swarm.sync.decide.check_downloaded_state`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

import torch

from swarm.sync.allreduce import Snapshot
from swarm.sync.config import AbortCause, OuterSyncConfig, SyncAborted
from swarm.sync.decide import (
    CatchUp,
    CatchUpRefusal,
    check_contested_step,
    check_downloaded_state,
    decide_catch_up,
)
from swarm.sync.dhtio import SyncRecords
from swarm.sync.errors import StateDownloadFailed
from swarm.sync.robust import norm

MAX_PARTNERS = 1024
"""Most recent round partners remembered as trusted for catch-up (bounded memory)."""

RECENT_STEPS = 8
"""This peer's last committed outer steps (anchor shift norms) that bound a contested catch-up."""

Fetch = Callable[[str, int, float], Snapshot]
"""(donor, number of values, timeout) -> the donor's state; raises on any failure."""

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
    ) -> None:
        self._me, self._records, self._fetch, self._cfg, self._log, self._clock = me, records, fetch, cfg, log, clock
        self.bootstrap = bootstrap
        self._partners: dict[str, None] = {}
        self.refusals: dict[CatchUpRefusal, int] = {}
        self._reported: set[tuple[str, CatchUpRefusal]] = set()
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)

    def note_step(self, shift_norm: float) -> None:
        """This peer committed an outer step that moved its anchor by ``shift_norm``."""
        if math.isfinite(shift_norm):
            self._steps.append(shift_norm)

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

    def catch_up(self, snap: Snapshot, leaving: Callable[[], bool]) -> Snapshot | None:
        """The checked state to move to from ``snap``, or None if not behind; raises SyncAborted on failure."""
        self._records.refresh_state(snap.revision, snap.state_hash)
        states = self._records.read_states()
        leaders = self.bootstrap if self.newcomer(snap) else frozenset()
        decision = decide_catch_up(states, snap.revision, snap.state_hash, self._me, self.trusted(), leaders)
        for peer, reason in decision.refused.items():
            self._refused(peer, reason)
        target = decision.target
        if target is None:
            return None
        self._log(logging.INFO, "behind or diverged: catching up to rev=%d %s", target.revision, target.state_hash[:8])
        end = self._clock() + self._cfg.state_timeout_s
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
            refusal = self._judge(snap, got, target)
            if refusal is CatchUpRefusal.OFF_TARGET:
                self._refused(donor, refusal)
                continue
            if refusal is not None:  # the target's bytes themselves are implausible: every donor serves them
                self._refused(donor, refusal)
                raise StateDownloadFailed(f"target state refused: {refusal.value}")
            self._log(logging.INFO, "caught up from %s: %s", donor[-6:], got.state_hash[:8])
            return got
        raise StateDownloadFailed("no donor served the target state")

    def _refused(self, peer: str, reason: CatchUpRefusal) -> None:
        """Count a refused claim or state; WARNING once per (peer, reason), DEBUG after."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        new = (peer, reason) not in self._reported
        if new and len(self._reported) < 4096:
            self._reported.add((peer, reason))
        self._log(logging.WARNING if new else logging.DEBUG, "catch-up refused %s: %s", peer[-6:], reason.value)

    def _judge(self, snap: Snapshot, got: Snapshot, target: CatchUp) -> CatchUpRefusal | None:
        """Exactly the target, finite, and plausibly close to this peer's own anchor (else why not).

        A newcomer takes its bootstrap peers' state at any distance: its own
        weights may be another seed's initialisation, or a group that trained
        for hours moved far from them; it trusts whom it was told to join.
        """
        if (got.revision, got.state_hash) != (target.revision, target.state_hash):
            return CatchUpRefusal.OFF_TARGET
        finite = bool(torch.isfinite(got.anchor).all()) and bool(torch.isfinite(got.momentum).all())
        if self.newcomer(snap) and set(target.donors) & self.bootstrap:
            return None if finite else CatchUpRefusal.NOT_FINITE
        own = snap.anchor
        shift = norm(got.anchor - own) if finite else math.inf
        momentum = norm(got.momentum) if finite else math.inf
        refusal = check_downloaded_state(
            norm(own), shift, momentum, finite, self._cfg.max_state_shift, self._cfg.outer_momentum
        )
        if refusal is None and target.contested:
            return check_contested_step(shift, list(self._steps), self._cfg.clip_factor)
        return refusal
