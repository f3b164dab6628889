"""A member that gives up on an all-reduce says so, and its partners end the round at once.

Without a word from it, a member whose own streams failed (a daemon that resets a
fresh stream under load, bad bytes it alone saw, a leave request) ends its round
at once while its partners wait for its parts until the round's deadline: with
the deadline longer than the sync period, one failure costs the group the next
epochs too. So the member that gives up sends every partner a one-frame
``abort`` notice on a fresh stream, in the background, and a partner that holds
the round fails it with :attr:`AbortCause.ABORTED_BY_MEMBER`.

A notice only ends a round its sender is a member of (the stream's peer id comes
from libp2p, not from the frame): that member could end the round anyway by
withholding its part. A notice that arrives before its receiver has registered
the round (its DHT reads can finish later than the sender's) is kept, bounded,
only while the receiver is matchmaking at that revision and has read the
sender's join record, as parts wait (:meth:`swarm.sync.allreduce.SyncService.expect`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from swarm.sync.config import AbortCause

logger = logging.getLogger(__name__)

NOTICE_TIMEOUT_S = 1.0
"""How long telling one partner may take (dial, frame, answer): best effort, in the background."""
MIN_LEAD_S = 0.25
"""No notice once the round's deadline is this close: every partner is about to end the round itself."""
MAX_EARLY = 64
"""Notices kept for rounds their receiver has not registered yet (the oldest goes first)."""

Ask = Callable[[str, dict[str, Any]], Awaitable[bool]]
"""Sends one frame to a peer on a fresh stream; whether it answered ok (:meth:`SyncService.ask`)."""


def notice(group_id: str, revision: int, cause: AbortCause) -> dict[str, Any]:
    """The header of the abort notice for one round."""
    return {"op": "abort", "group": group_id, "revision": revision, "cause": cause.value}


def worth_telling(cause: AbortCause, lead_s: float) -> bool:
    """Whether a member that gave up for ``cause``, ``lead_s`` before the deadline, tells its partners.

    A member that gave up because a partner told it to spreads nothing new; one at the deadline saves
    nobody any time.

    >>> worth_telling(AbortCause.PEER_LOST, 3.0), worth_telling(AbortCause.ABORTED_BY_MEMBER, 3.0)
    (True, False)
    >>> worth_telling(AbortCause.ALLREDUCE_TIMEOUT, 0.1)
    False
    """
    return cause is not AbortCause.ABORTED_BY_MEMBER and lead_s > MIN_LEAD_S


def cause_of(header: dict[str, Any]) -> str:
    """The cause a notice names, as one of :class:`AbortCause`'s values ("unknown" for anything else)."""
    cause = header.get("cause")
    values = {c.value for c in AbortCause}
    return cause if isinstance(cause, str) and cause in values else "unknown"


async def tell(ask: Ask, partners: Iterable[str], header: dict[str, Any]) -> int:
    """Send ``header`` to every partner at once, each under ``NOTICE_TIMEOUT_S``; return how many took it.

    Never raises: a partner that cannot be reached ends the round at its deadline, as before.
    """

    async def bounded(peer: str) -> bool:
        try:
            return await asyncio.wait_for(ask(peer, header), NOTICE_TIMEOUT_S)
        except Exception as e:  # unreachable, reset, refused, timed out: that partner keeps its deadline
            logger.debug("abort notice to %s not delivered: %s", peer[-6:], type(e).__name__)
            return False

    results = await asyncio.gather(*(bounded(p) for p in partners))
    return sum(results)


class EarlyNotices:
    """Notices for rounds not registered yet: group id -> the members that gave up on it (bounded)."""

    def __init__(self, limit: int = MAX_EARLY) -> None:
        self._limit = limit
        self._by_group: OrderedDict[str, dict[str, str]] = OrderedDict()

    def keep(self, group_id: str, sender: str, cause: str) -> None:
        self._by_group.setdefault(group_id, {})[sender] = cause
        self._by_group.move_to_end(group_id)
        while len(self) > self._limit:  # the oldest notice goes first
            oldest = next(iter(self._by_group))
            senders = self._by_group[oldest]
            del senders[next(iter(senders))]
            if not senders:
                del self._by_group[oldest]

    def take(self, group_id: str, members: Iterable[str]) -> tuple[str, str] | None:
        """(a member that gave up on ``group_id``, its cause), if any did; forgets the group either way."""
        senders = self._by_group.pop(group_id, {})
        return next(((p, senders[p]) for p in members if p in senders), None)

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_group.values())
