"""Who is online for this round: ping probes on the sync stream, run beside the synchronous round.

A join record only proves that its signer once held a key; anyone can sign
records for keys that never come online ("ghosts"), and an all-reduce with a
ghost in it fails. So a member pings each joiner on
the sync stream handler as soon as it reads the joiner's record, and at the
window's close keeps only the joiners that answered (:func:`live_records`).
Every honest member pings the same records and an honest peer answers every
ping, so honest members keep the same set and compute the same group id;
ghosts, fresh ones every window included, never answer and cost one ping.

While awaiting votes, a member also pings the members whose vote is missing:
one that no longer answers (crashed after the all-reduce) makes this member
vote abort at once instead of waiting for the vote deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import time
from collections.abc import Collection, Iterable

from swarm.membership import Membership
from swarm.sync.allreduce import SyncService

logger = logging.getLogger(__name__)

MAX_PROBED = 1024
"""Joiners pinged per round at most (a flood of join records cannot make unbounded dials)."""


class LivenessReason(enum.Enum):
    """Why a round ended on a liveness probe; the value is the report's reason."""

    MEMBER_LOST = "member lost before voting"


class Prober:
    """Pings peers on ``service``'s loop; results are per round (:meth:`reset`)."""

    def __init__(self, membership: Membership, service: SyncService, timeout_s: float) -> None:
        self._m, self._service, self.timeout_s = membership, service, timeout_s
        self._me = membership.peer_id
        self._pings: dict[str, concurrent.futures.Future[bool]] = {}
        self._seen: set[str] = set()
        self._revision = -1

    def _submit(self, peer: str, timeout: float) -> concurrent.futures.Future[bool]:
        loop = self._m.loop
        if loop is None:  # membership stopped: nobody answers
            done: concurrent.futures.Future[bool] = concurrent.futures.Future()
            done.set_result(False)
            return done
        return asyncio.run_coroutine_threadsafe(self._service.ping(peer, timeout), loop.loop)

    def reset(self, revision: int) -> None:
        """A new round at ``revision``: forget earlier answers (a peer live then may be gone now)."""
        for fut in self._pings.values():
            fut.cancel()
        self._pings.clear()
        self._seen.clear()
        self._revision = revision

    def see(self, joiners: Collection[str]) -> None:
        """Joiners read from the DHT: ping each new one, and let their parts wait for this member's group.

        Every joiner seen this round stays expected until the group is decided: a member that decided
        first may send its part while this one still waits for pings, and must not be refused then.
        """
        if len(self._seen) < MAX_PROBED:
            self._seen.update(joiners)
        self._service.expect(self._revision, frozenset(self._seen))
        for peer in joiners:
            if peer not in self._pings and peer != self._me and len(self._pings) < MAX_PROBED:
                self._pings[peer] = self._submit(peer, self.timeout_s)

    def expect(self, members: Collection[str]) -> None:
        """The group is decided: only its members' parts may still wait."""
        self._service.expect(self._revision, members)

    def done(self) -> None:
        """Round over: refuse every unregistered group id at once."""
        self._service.expect_nothing()

    def answered(self, peers: Iterable[str]) -> set[str]:
        """Those of ``peers`` that answered their ping, waiting (bounded by the ping timeout) for pending ones."""
        self.see([p for p in peers if p not in self._pings])
        end = time.monotonic() + self.timeout_s + 0.5
        out: set[str] = set()
        for peer in peers:
            fut = self._pings.get(peer)
            if fut is None:
                continue
            try:
                if fut.result(max(0.0, end - time.monotonic())):
                    out.add(peer)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                pass
        return out

    def check(self, peers: Collection[str], timeout: float) -> set[str]:
        """Fresh pings (not the round's cached answers): those of ``peers`` that answer within ``timeout``."""
        timeout = max(0.05, min(timeout, self.timeout_s))
        futs = {p: self._submit(p, timeout) for p in peers}
        end = time.monotonic() + timeout + 0.5
        out: set[str] = set()
        for peer, fut in futs.items():
            try:
                if fut.result(max(0.0, end - time.monotonic())):
                    out.add(peer)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                fut.cancel()
        return out
