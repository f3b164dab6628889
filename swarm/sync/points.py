"""Points a sync round passes, told to an observer (tests and benchmarks time faults by them).

An observer only hears of a point: it cannot change what the round does. Faults are the
network's (a test's transport, tests/simnet.py) or the process's (a signal), never the sync's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class RoundPoint(enum.Enum):
    """A point of one round, on one member; the value names it on a test worker's command line."""

    MATCHMADE = "matchmade"
    """The group is decided (before the all-reduce)."""
    SEND = "send"
    """About to open the stream to one slice's owner."""
    SENT = "sent"
    """This member's part of one slice is all written."""
    REDUCED = "reduced"
    """This member's own slice is reduced."""
    ALLREDUCED = "allreduced"
    """The all-reduce ended (before the vote)."""
    VOTED = "voted"
    """This member's vote is published."""


Observer = Callable[[RoundPoint, int], None]
"""Called as ``observe(point, revision)`` on the thread or loop that passes the point."""
