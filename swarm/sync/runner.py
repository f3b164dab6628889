"""Drive the outer sync from a training loop: on schedule, beside training, never half-applied.

Why beside training: a blocking sync stops training for the whole gather
window, all-reduce and commit vote, most of the wall time when rounds are
short. Here :meth:`SyncRunner.maybe_sync`, called at every round boundary,
starts a due sync on a thread with a :class:`~swarm.sync.job.SyncJob` taken
on the training thread (the anchor and the weights then), and returns at
once; rounds go on. At the first round boundary after the sync thread ends,
its outcome is applied on the training thread (:meth:`OuterSync.apply`): the
new anchor plus the steps trained meanwhile, so the update lands one step
late (PCCL's async DiLoCo, "eager updates") and no inner step is lost. The
anchor itself is the group's committed state, bit-identical on every member.

Only the training thread touches the weights and the applied state
(checkpoints save it); the sync thread touches only the state it serves.
With ``eager`` off every due sync runs in the caller, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from swarm.sync.config import OuterSyncConfig, SyncReport
from swarm.sync.job import RoundOutcome, SyncJob
from swarm.sync.schedule import Schedule

logger = logging.getLogger(__name__)


class Rounds(Protocol):
    """What the runner drives (:class:`swarm.sync.outer.OuterSync`)."""

    cfg: OuterSyncConfig

    @property
    def revision(self) -> int: ...

    def prepare(self, inner_step: int | None = None) -> SyncJob: ...

    def run(self, job: SyncJob) -> RoundOutcome: ...

    def apply(self, outcome: RoundOutcome) -> None: ...

    def cancel(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SyncRunner:
    """Starts due syncs (on a thread when ``sync.cfg.eager``) and applies their outcomes at round boundaries."""

    def __init__(self, sync: Rounds, clock: Callable[[], float] = time.time) -> None:
        self.sync = sync
        self._clock = clock
        self._schedule = Schedule(sync.cfg.sync_every, sync.cfg.sync_period_s, clock())
        self._thread: threading.Thread | None = None
        self._outcome: RoundOutcome | None = None
        self.skipped_busy = 0
        """Due syncs skipped because the previous one was still running (its epoch is taken by it)."""

    @property
    def busy(self) -> bool:
        """A sync is running on the sync thread (or has ended and waits to be applied)."""
        return self._thread is not None

    def maybe_sync(self, inner_step: int) -> SyncReport | None:
        """Apply a finished sync, and start one if due; the finished sync's report, or a blocking one's."""
        report = self._apply_finished()
        now = self._clock()
        if not self._schedule.due(inner_step, now):
            return report
        self._schedule.begun(now)
        if self._thread is not None:
            self.skipped_busy += 1
            logger.info("outer sync due after step %d while the last one still runs: skipped", inner_step)
            return report
        if not self.sync.cfg.eager:
            outcome = self.sync.run(self.sync.prepare(inner_step))
            self.sync.apply(outcome)
            return outcome.report
        self._start(inner_step)
        return report

    def cancel(self) -> None:
        """Leaving was asked for: a sync not yet in a group ends, one that has not voted votes abort.

        Called when the leave is requested, not when training next reaches a boundary: the signal that
        asked may have stopped this process's p2pd too (see OuterSync's vote), and no sync started after
        it (the node starts none while leaving). Thread-safe.
        """
        self.sync.cancel()

    def finish(self, timeout_s: float) -> SyncReport | None:
        """Leaving: end a sync not yet in a group, wait at most ``timeout_s`` for one that is, and apply it.

        None if no sync ended.
        """
        if self._thread is not None:
            self.sync.cancel()
            if not self.ended(timeout_s):
                logger.warning("an outer sync still runs %.0fs after leaving began; leaving without it", timeout_s)
                return None
        return self._apply_finished()

    def ended(self, timeout_s: float = 0.0) -> bool:
        """Whether no sync runs on the sync thread, waiting at most ``timeout_s`` for one that does to end.

        An ended sync's outcome still waits for the next round boundary to be applied.
        """
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def state_dict(self) -> dict[str, Any]:
        return self.sync.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("cannot load outer-sync state while a sync runs")
        self.sync.load_state_dict(state)

    def close(self) -> None:
        """Stop serving; a sync still running is abandoned (its thread is a daemon and its outcome unapplied)."""
        self.sync.close()

    def _start(self, inner_step: int) -> None:
        job = self.sync.prepare(inner_step)  # on the training thread: the weights as of this boundary

        def work() -> None:
            try:
                self._outcome = self.sync.run(job)
            except Exception:  # run() reports every failure it knows; anything else is a bug, never fatal
                logger.exception("outer sync after step %d failed", inner_step)

        self._thread = threading.Thread(target=work, name="swarm-node-sync", daemon=True)
        self._thread.start()

    def _apply_finished(self) -> SyncReport | None:
        thread = self._thread
        if thread is None or thread.is_alive():
            return None
        thread.join()
        self._thread = None
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            return None
        self.sync.apply(outcome)
        return outcome.report
