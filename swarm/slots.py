"""Slots held per key under a total bound: how a relay serves peers with many keys within fixed limits."""

from __future__ import annotations

from collections import Counter


class Slots:
    """At most ``total`` slots held at once, at most ``each`` per key (a requester, a relay)."""

    def __init__(self, total: int, each: int) -> None:
        self.total, self.each = total, each
        self.held: Counter[str] = Counter()

    def take(self, key: str) -> bool:
        """Take a slot for ``key``; False (nothing taken) when either bound is reached.

        >>> s = Slots(total=3, each=2)
        >>> [s.take("a"), s.take("a"), s.take("a"), s.take("b"), s.take("c")]
        [True, True, False, True, False]
        """
        if sum(self.held.values()) >= self.total or self.held[key] >= self.each:
            return False
        self.held[key] += 1
        return True

    def give(self, key: str) -> None:
        """Give back one of ``key``'s slots."""
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]
