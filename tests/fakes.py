"""Test doubles shared by in-process tests (no processes, no network).

One clock, for wall and monotonic reads alike: time that moves only when a test
says so, by ``step`` on every read (code that measures its own elapsed time then
sees it pass without a real sleep), or by a wait it is asked for, which passes
at once. One exchange and one sync, each standing for its protocol in
:mod:`node.core.links` and recording what the node asked of it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from protocol import RolloutBatch
from swarm.exchange import CollectResult
from swarm.sync import SyncReport

HOLD_S = 10.0
"""A held publish or collect waits at most this for the test to release it (only a broken test hits it)."""


class FakeClock:
    """Seconds that move by ``step`` on each read and by whatever a test adds to ``now`` or a wait lets pass.

    One instance is a node's whole :class:`~node.core.clock.Clock`: wall and
    monotonic reads are the same seconds (only differences of monotonic ones
    mean anything). ``waits`` records each wait's seconds; ``on_wait`` stands
    for what happens elsewhere while a wait's time passes.
    """

    def __init__(self, now: float = 1_700_000_000.0, step: float = 0.0) -> None:
        self.now, self.step = now, step
        self.waits: list[float] = []
        self.on_wait: Callable[[], None] | None = None

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def monotonic(self) -> float:
        return self()

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """``event.wait(seconds)`` without sleeping: ``on_wait`` runs while the time passes (if any does);
        an event set by then ends the wait at once, otherwise the clock moves on by ``seconds``."""
        self.waits.append(seconds)
        if seconds > 0 and not event.is_set() and self.on_wait is not None:
            self.on_wait()
        if event.is_set():
            return True
        self.advance(max(0.0, seconds))
        return False


class FakeExchange:
    """An in-process exchange: records publishes, collects and judgements, and replays queued collect results.

    A test can hold a publish or a collect inside the call until it sets
    ``release_publish`` / ``release_collect`` (both open at first; ``in_publish``
    / ``in_collect`` count the calls that entered), make them raise
    (``fail_publish``, ``fail_collect``), and give each collect ``collect_s``
    seconds on ``clock``.
    """

    def __init__(self, collect_s: float = 0.0, clock: FakeClock | None = None) -> None:
        self.round = 0
        self.published: list[RolloutBatch] = []
        self.queued: deque[CollectResult] = deque()
        self.collect_calls: list[tuple[float, int]] = []
        self.on_collect: Callable[[], None] | None = None
        self.closed = 0
        self.traffic = {"bytes_in": 1234, "bytes_out": 567}
        self.judged: list[tuple[str, int, int, int]] = []  # (publisher, accepted, informative, refused)
        self.banned = 0
        self.release_publish, self.release_collect = threading.Event(), threading.Event()
        self.release_publish.set()
        self.release_collect.set()
        self.in_publish, self.in_collect = threading.Semaphore(0), threading.Semaphore(0)
        self.fail_publish = self.fail_collect = False
        self.clock, self.collect_s = clock or FakeClock(0.0), collect_s

    def publish(self, batch: RolloutBatch) -> object:
        self.in_publish.release()
        self.release_publish.wait(HOLD_S)
        if self.fail_publish:
            raise ConnectionError("DHT gone")
        self.published.append(batch)
        return None

    def collect(self, since: float, limit: int) -> CollectResult:
        self.collect_calls.append((since, limit))
        self.in_collect.release()
        self.release_collect.wait(HOLD_S)
        if self.fail_collect:
            raise RuntimeError("a bug")
        if self.on_collect is not None:
            self.on_collect()
        self.clock.advance(self.collect_s)
        return self.queued.popleft() if self.queued else CollectResult([], [], 0, 0.0)

    def stats(self) -> dict[str, int]:
        return dict(self.traffic)

    def judge(self, publisher: str, *, accepted: int, informative: int, refused: int) -> None:
        self.judged.append((publisher, accepted, informative, refused))

    def reputation_summary(self) -> dict[str, Any]:
        tracked = len({j[0] for j in self.judged})
        return {"tracked": tracked, "banned": self.banned, "bans_by_reason": {"refused content": self.banned}}

    def close(self) -> None:
        self.closed += 1


class FakeSync:
    """An in-process sync that never syncs but records calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.closed = 0
        self.busy = False
        self.cancelled = False
        self.cancel_called = threading.Event()  # for a test waiting on another thread's cancel

    def maybe_sync(self, inner_step: int) -> SyncReport | None:
        self.calls.append(inner_step)
        return None

    def cancel(self) -> None:
        self.cancelled = True
        self.cancel_called.set()

    def finish(self, timeout_s: float) -> SyncReport | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"revision": 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class Alone:
    """A swarm joined by nobody (a node's :class:`~node.core.links.Joining`): its links are a
    :class:`FakeExchange` and no sync."""

    def multiaddrs(self) -> list[str]:
        return []

    def links(self, model: Any) -> Any:
        from node.core.links import Links  # here, not at import: start-up probes count what is imported

        return Links(exchange=FakeExchange())

    def leave(self) -> None:
        pass
