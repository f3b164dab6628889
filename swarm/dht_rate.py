"""How many entries one peer's store RPCs may bring to this node per second, before any is checked.

Every record a peer stores here costs a signature check (hivemind's validator, then ours) whether
or not it is kept: a host sending its own valid records as fast as it can (6,800 a second on
a 2-core test machine) held the honest replicas' CPU and cut their commits per second to 0.41 of
the baseline while the storage quota kept every honest record. A token bucket per sender, spent
per entry and refilled at :data:`RATE` a second up to :data:`BURST`, refuses the excess before
hivemind sees it. An honest node stores a few records a round (its join, vote and state records
and its rollout descriptors, each to every replica of its key): tens a second in the tests'
sub-second rounds, far below the rate.
"""

from __future__ import annotations

from collections import OrderedDict

RATE = 100.0
"""Entries per second one sender's stores may bring, sustained."""
BURST = 1000.0
"""Entries one sender may bring at once (a node that rejoins refreshes all its records together)."""
MAX_SENDERS = 4096
"""Senders tracked; the least recently seen is forgotten first (it starts again with a full bucket)."""


class StoreRate:
    """Per-sender token buckets; pure given ``now`` (seconds on any monotonic clock)."""

    def __init__(self, rate: float = RATE, burst: float = BURST, max_senders: int = MAX_SENDERS) -> None:
        if not (rate > 0 and burst >= 1 and max_senders >= 1):
            raise ValueError(f"StoreRate(rate={rate}, burst={burst}, max_senders={max_senders}); use positive bounds")
        self.rate, self.burst, self.max_senders = rate, burst, max_senders
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, sender: str, entries: int, now: float) -> int:
        """How many of ``entries`` the sender may store now (the first ones of its request).

        >>> r = StoreRate(rate=10.0, burst=20.0)
        >>> r.allow("a", 25, now=0.0), r.allow("a", 5, now=0.2), r.allow("b", 5, now=0.2)
        (20, 2, 5)
        """
        tokens, last = self._buckets.pop(sender, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        allowed = max(0, min(entries, int(tokens)))
        self._buckets[sender] = (tokens - allowed, now)
        while len(self._buckets) > self.max_senders:
            self._buckets.popitem(last=False)
        return allowed
