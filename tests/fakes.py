"""Test doubles shared by in-process tests (no processes, no network).

One clock: time that moves only when a test says so, or by ``step`` on every
read (code that measures its own elapsed time then sees it pass without a
real sleep). Pass it wherever the code under test takes a clock, wall or monotonic.
"""

from __future__ import annotations


class FakeClock:
    """Seconds that move by ``step`` on each read and by whatever a test adds to ``now``."""

    def __init__(self, now: float = 1_700_000_000.0, step: float = 0.0) -> None:
        self.now, self.step = now, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
