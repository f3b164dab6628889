"""The round's network steps (publish, collect) on threads beside the rounds.

Why: a round's own work can take milliseconds (tiny models) while the DHT and
peers answer in tens to hundreds of milliseconds, more under a flood that
keeps every honest DHT process busy. A round that waits for its publish and
collect runs at the network's pace (several times slower under a flood, all of
it in publish and collect). Here a round asks for a collect
when it starts, so the collect runs while it generates; hands its batch to a
publisher thread; and before training takes the collect's result, waiting at
most a fixed ``wait_s`` for it. A slower collect is ingested by a later
round, which SAPO's off-policy sharing tolerates by design. So the network
costs a round at most ``wait_s`` whatever an attacker does to it, and a node
whose rounds are shorter than a collect still learns from peers each round
instead of racing ahead on its own groups alone.

Publishing and collecting run on separate threads: a DHT store that a hostile
replica answers slowly must not delay the collect, nor the other way round.
Only the network runs there: ingesting (re-verifying groups with the node's
tasks and tokenizer, filling the pool) stays on the round's thread, so
nothing else in the node is shared between threads.

``inline=True`` runs each step in the caller, in the order publish then
collect, for tests that script a round exactly and for ``--wait-network``.

A round waits only for a collect expected to land within its budget
(:func:`wait_budget`): under a flood every collect takes several rounds, and
a round that waited its whole budget for one that cannot finish in it loses
that time for nothing (rounds at 2.05-2.26x their baseline on a slow 2-core
machine when every round waits).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.core.links import Exchange
from protocol import RolloutBatch
from swarm.exchange import CollectResult

logger = logging.getLogger(__name__)


def wait_budget(now: float, started: float, recent_s: Sequence[float], wait_s: float) -> float:
    """Seconds worth waiting for a collect that began at ``started``: ``wait_s``, or 0 if it cannot land in time.

    ``recent_s`` are the last collects' durations; their median predicts this
    one's end. With no history every collect is worth its budget.
    """
    if not recent_s:
        return wait_s
    expected_end = started + statistics.median(recent_s)
    return wait_s if expected_end <= now + wait_s else 0.0


@dataclass(frozen=True)
class CollectJob:
    """Collect up to ``limit`` batches announced since ``since``."""

    since: float
    limit: int


class NetworkWorker:
    """Publishes and collects for a node; ``request_collect``, ``publish`` and ``take`` once a round.

    At most ``max_pending`` batches wait to be published: a publisher far
    behind drops the oldest (counted in ``dropped_batches``), because the
    freshest rollouts are the ones peers want. At most one collect result
    waits to be taken, and a collect starts only once the previous result was
    taken, so results never pile up; a newer request replaces one not started.
    """

    def __init__(
        self,
        exchange: Exchange,
        *,
        inline: bool = False,
        max_pending: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending}; use 1 or more")
        self._exchange = exchange
        self._inline = inline
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._batches: list[RolloutBatch] = []
        self._job: CollectJob | None = None
        self._result: CollectResult | None = None
        self._publishing = self._collecting = False
        self._clock = clock
        self._collect_started = 0.0
        self._durations: deque[float] = deque(maxlen=8)  # the last collects', to predict the next one's end
        self._closed = False
        self.dropped_batches = 0
        self._threads: list[threading.Thread] = []
        if not inline:
            for name, target in (("publish", self._publish_loop), ("collect", self._collect_loop)):
                thread = threading.Thread(target=target, name=f"swarm-node-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def request_collect(self, job: CollectJob) -> None:
        """Start collecting ``job`` (or queue it, replacing a request not started); inline, ``take`` runs it."""
        with self._cond:
            self._job = job
            self._cond.notify_all()

    def publish(self, batch: RolloutBatch) -> None:
        """Publish ``batch`` soon (inline: now)."""
        if self._inline:
            self._publish(batch)
            return
        with self._cond:
            self._batches.append(batch)
            while len(self._batches) > self._max_pending:
                self._batches.pop(0)
                self.dropped_batches += 1
            self._cond.notify_all()

    def take(self, wait_s: float) -> CollectResult | None:
        """The newest finished collect, waiting at most ``wait_s`` for the one under way; None if none is ready.

        The wait is skipped when recent collects say the one under way will not
        finish within ``wait_s`` (:func:`wait_budget`). Inline, the requested
        collect runs now, however long it takes.
        """
        if self._inline:
            with self._cond:
                job, self._job = self._job, None
            return self._collect(job) if job is not None else None
        with self._cond:
            now = self._clock()
            started = self._collect_started if self._collecting else now
            budget = wait_budget(now, started, list(self._durations), wait_s)
            self._cond.wait_for(self._taken_or_nothing_coming, budget)
            result, self._result = self._result, None
            self._cond.notify_all()
        return result

    def close(self, timeout_s: float) -> bool:
        """Stop after the steps under way (unsent batches are dropped); False if they did not end in ``timeout_s``."""
        with self._cond:
            self._closed = True
            self._batches.clear()
            self._job = None
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)
        if any(t.is_alive() for t in self._threads):  # daemon threads: they cannot keep the process alive
            logger.warning("a network step is still running %.0fs after leaving; not waiting for it", timeout_s)
            return False
        return True

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or under way; False after ``timeout_s`` (for tests and benchmarks)."""
        with self._cond:
            return self._cond.wait_for(self._idle, timeout_s)

    def _idle(self) -> bool:
        pending_job = self._job is not None and self._result is None
        return not (self._publishing or self._collecting or self._batches or pending_job)

    def _taken_or_nothing_coming(self) -> bool:
        busy = self._collecting or self._ready_job() is not None
        return self._result is not None or self._closed or not busy

    def _ready_job(self) -> CollectJob | None:
        """The pending collect, unless the last result is still untaken (caller holds the lock)."""
        return self._job if self._result is None else None

    # ---- the threads -----------------------------------------------------------------------

    def _publish_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._batches))
                if self._closed:
                    return
                batch = self._batches.pop(0)
                self._publishing = True
            try:
                self._publish(batch)
            finally:
                with self._cond:
                    self._publishing = False
                    self._cond.notify_all()

    def _collect_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._ready_job() is not None)
                if self._closed:
                    return
                job, self._job = self._job, None
                self._collecting = True
                self._collect_started = self._clock()
            result: CollectResult | None = None
            try:
                assert job is not None
                result = self._collect(job)
            finally:
                with self._cond:
                    self._durations.append(self._clock() - self._collect_started)
                    self._collecting = False
                    self._result = result
                    self._cond.notify_all()

    def _publish(self, batch: RolloutBatch) -> None:
        try:
            self._exchange.publish(batch)
        except Exception as e:  # network trouble skips sharing this batch; training goes on
            logger.warning("publish of round %d failed: %s", batch.round, e or type(e).__name__)

    def _collect(self, job: CollectJob) -> CollectResult | None:
        try:
            return self._exchange.collect(since=job.since, limit=job.limit)
        except Exception as e:  # collect bounds itself; anything else is a bug, logged, never fatal to the round
            logger.error("collect failed: %s", e or type(e).__name__, exc_info=True)
            return None
