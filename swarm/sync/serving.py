"""State downloads served within a budget, from one shared copy of the state's bytes.

Anyone who can open a stream may ask for this peer's state (a newcomer's first
catch-up must work before it trusts or is trusted by anyone), so what one ask
costs has to be bounded by the server, not by the asker's good will:

- :class:`ServeBudget`: at most ``limit`` downloads at once, and at most
  :data:`MAX_SERVES_PER_PEER` per asking peer; an ask past either is refused at
  once, and counted by its :class:`ServeRefusal` (the asker tries its next donor).
- :class:`SharedStates`: the serialized bytes of one state are built once and
  shared, as read-only views, by every download of it under way; at most
  :data:`MAX_HELD_STATES` states are held (the current one and one still being
  served), so a flood of asks costs one copy of the state, not one per ask.

Each serve's overall deadline (the state bound for the model's size) is the
caller's (:meth:`swarm.sync.allreduce.SyncService._serve_state`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

MAX_SERVES_PER_PEER = 1
"""State downloads one peer may take from this one at once: an honest catch-up asks one donor at a time."""
MAX_HELD_STATES = 2
"""Serialized states held at once: the current one and an older one whose downloads are not over yet."""


class ServeRefusal(Enum):
    """Why an ask for this peer's state was refused at once (the value is the reason the asker reads)."""

    BUSY = "state downloads at their limit"
    PEER_BUSY = "a state download to this peer is under way"
    STATES_HELD = "older states are still being served"


class ServeBudget:
    """The state downloads under way, per asking peer; refusals counted by reason."""

    def __init__(self, limit: int, per_peer: int = MAX_SERVES_PER_PEER) -> None:
        if limit < 1 or per_peer < 1:
            raise ValueError(f"limit={limit}, per_peer={per_peer}; use at least 1 each")
        self.limit, self.per_peer = limit, per_peer
        self._active: dict[str, int] = {}
        self.refusals: dict[ServeRefusal, int] = {}

    @property
    def active(self) -> int:
        """Downloads under way now."""
        return sum(self._active.values())

    def take(self, peer: str) -> ServeRefusal | None:
        """Take a slot for ``peer``'s download, or the reason it is refused (counted)."""
        refusal = self._refusal(peer)
        if refusal is None:
            self._active[peer] = self._active.get(peer, 0) + 1
        return refusal

    def _refusal(self, peer: str) -> ServeRefusal | None:
        if self._active.get(peer, 0) >= self.per_peer:
            return self.refuse(ServeRefusal.PEER_BUSY)
        if self.active >= self.limit:
            return self.refuse(ServeRefusal.BUSY)
        return None

    def refuse(self, reason: ServeRefusal) -> ServeRefusal:
        """Count a refusal made here or by the caller (e.g. :attr:`ServeRefusal.STATES_HELD`)."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        return reason

    def release(self, peer: str) -> None:
        """``peer``'s download is over (done, failed or past its deadline)."""
        left = self._active.get(peer, 0) - 1
        if left > 0:
            self._active[peer] = left
        else:
            self._active.pop(peer, None)


@dataclass
class _Held:
    data: asyncio.Future[memoryview]
    users: int = field(default=0)


class SharedStates:
    """Serialized states by state hash, each built once and shared by the downloads that use it.

    A state stays held while a download uses it or while it is the current one (the next ask reuses
    it); an older one goes as soon as its last download ends, or at the next ask once nothing uses it.
    """

    def __init__(self, held: int = MAX_HELD_STATES) -> None:
        self._held = held
        self._states: dict[str, _Held] = {}
        self.builds = 0
        """States serialized so far (one per state hash asked for, however many asked)."""

    def __len__(self) -> int:
        return len(self._states)

    def hold(self, key: str, build: Callable[[], Awaitable[memoryview]]) -> asyncio.Future[memoryview] | None:
        """The bytes of the current state ``key`` (built now unless held), for one more download to use until
        :meth:`let_go`; None when ``held`` older states are all still in use."""
        entry = self._states.get(key)
        if entry is None:
            for old in [k for k, e in self._states.items() if not e.users]:  # idle, and not current: stale
                del self._states[old]
            if len(self._states) >= self._held:
                return None
            entry = self._states[key] = _Held(asyncio.ensure_future(build()))
            # a build whose downloads all ended first still has its failure read: no "never retrieved"
            entry.data.add_done_callback(lambda f: f.cancelled() or f.exception())
            self.builds += 1
        entry.users += 1
        return entry.data

    def let_go(self, key: str, current: str) -> None:
        """One download of ``key`` is over; ``current`` is the state's hash now (kept if it is ``key``)."""
        entry = self._states.get(key)
        if entry is None:
            return
        entry.users -= 1
        if entry.users <= 0 and (key != current or self._failed(entry)):
            del self._states[key]

    @staticmethod
    def _failed(entry: _Held) -> bool:
        return entry.data.done() and (entry.data.cancelled() or entry.data.exception() is not None)
