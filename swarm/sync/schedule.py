"""When a peer starts its next outer sync: every H inner steps, or on a shared clock of wall-time epochs.

Why a shared clock: counted in inner steps, peers of one architecture on
different hardware reach "step H" at different times, so the fast one waits
in a gather window nobody else opens, and finds no partner about half the time
when speeds differ by a few times. Epochs are multiples of ``period_s`` since the Unix
epoch, so every peer computes the same boundaries from its own clock; each
starts a sync at its first round boundary past one, contributing whatever it
trained since the anchor. A peer whose round ends too late for the gather
window joins the next epoch instead of holding the group.

Pure: time is passed in.
"""

from __future__ import annotations

import math


def epoch_of(now: float, period_s: float) -> int:
    """The index of the wall-time epoch ``now`` falls in.

    >>> epoch_of(119.9, 60.0), epoch_of(120.0, 60.0)
    (1, 2)
    """
    return math.floor(now / period_s)


class Schedule:
    """Whether a sync is due at a round boundary: by inner steps (``period_s`` 0) or by wall-time epochs."""

    def __init__(self, every: int, period_s: float, now: float) -> None:
        if every < (0 if period_s else 1) or period_s < 0:
            raise ValueError(
                f"every={every}, period_s={period_s}; use every >= 1 (or 0 with a period) and period_s >= 0"
            )
        self.every = every
        self.period_s = period_s
        # the epoch running when the node started counts as done: the first sync is at the next boundary
        self._last_epoch = epoch_of(now, period_s) if period_s else 0

    def due(self, step: int, now: float) -> bool:
        """Whether the round boundary after inner step ``step`` (at ``now``) starts a sync.

        >>> s = Schedule(every=3, period_s=0.0, now=0.0)
        >>> [k for k in range(1, 10) if s.due(k, 0.0)]
        [3, 6, 9]
        >>> e = Schedule(every=1, period_s=10.0, now=101.0)
        >>> e.due(50, 109.9), e.due(1, 110.0)
        (False, True)
        """
        if self.period_s:
            return epoch_of(now, self.period_s) > self._last_epoch
        return step > 0 and step % self.every == 0

    def begun(self, now: float) -> None:
        """A sync started at ``now``: the next one is due in the next epoch (epochs missed are skipped)."""
        if self.period_s:
            self._last_epoch = epoch_of(now, self.period_s)
