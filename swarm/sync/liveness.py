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
from collections.abc import Collection, Iterable

from swarm.sync.allreduce import SyncService
from swarm.sync.transport import Loop

logger = logging.getLogger(__name__)

MAX_PROBED = 1024
"""Joiners pinged per round at most (a flood of join records cannot make unbounded dials)."""


class LivenessReason(enum.Enum):
    """Why a round ended on a liveness probe; the value is the report's reason."""

    MEMBER_LOST = "member lost before voting"


class Prober:
    """Pings peers on ``service``'s loop; results are per round (:meth:`reset`)."""

    def __init__(self, loop: Loop, me: str, service: SyncService, timeout_s: float) -> None:
        self._loop, self._me, self._service, self.timeout_s = loop, me, service, timeout_s
        self._pings: dict[str, concurrent.futures.Future[bool]] = {}
        self._seen: set[str] = set()
        self._revision = -1

    def _submit(self, peer: str, timeout: float) -> concurrent.futures.Future[bool]:
        return self._loop.submit(self._service.ping(peer, timeout))

    def _answers(self, pings: dict[str, concurrent.futures.Future[bool]], timeout: float) -> set[str]:
        """Those of ``pings`` that answered yes within ``timeout`` (waited for on the loop, on its clock)."""
        try:
            return self._loop.run(_answered(pings, timeout), timeout + 1.0)
        except (RuntimeError, TimeoutError):  # the loop stopped (nobody answers), or it is stalled
            return set()

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
        peers = list(peers)
        self.see([p for p in peers if p not in self._pings])
        return self._answers({p: self._pings[p] for p in peers if p in self._pings}, self.timeout_s + 0.5)

    def check(self, peers: Collection[str], timeout: float) -> set[str]:
        """Fresh pings (not the round's cached answers): those of ``peers`` that answer within ``timeout``."""
        timeout = max(0.05, min(timeout, self.timeout_s))
        futs = {p: self._submit(p, timeout) for p in peers}
        out = self._answers(futs, timeout + 0.5)
        for fut in futs.values():
            fut.cancel()
        return out


async def _answered(pings: dict[str, concurrent.futures.Future[bool]], timeout: float) -> set[str]:
    waiting = {p: asyncio.wrap_future(f) for p, f in pings.items()}
    if waiting:
        await asyncio.wait(waiting.values(), timeout=timeout)
    return {p for p, f in waiting.items() if f.done() and not f.cancelled() and f.exception() is None and f.result()}
