"""A node's time: wall seconds for records and collect windows, monotonic seconds for phases and pacing.

One object answers both, and waits on the node's stop event, so a test replaces all
of a node's time at once (``tests.fakes.FakeClock``) and a paced round runs on it
without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall and monotonic seconds, and a wait that ends early when an event is set."""

    def __call__(self) -> float:
        """Wall-clock seconds (Unix time): what records carry and peers compare."""
        ...

    def monotonic(self) -> float:
        """Seconds for measuring durations and deadlines: they never go back."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait at most ``seconds`` for ``event``; True if it is set (the wait ends as soon as it is)."""
        ...


class SystemClock:
    """The real clock: :func:`time.time`, :func:`time.monotonic` and :meth:`threading.Event.wait`."""

    def __call__(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


SYSTEM_CLOCK = SystemClock()
