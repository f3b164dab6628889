"""The per-sender store rate (swarm.dht_rate): what one host's stores may cost a replica before any check."""

from __future__ import annotations

import pytest

from swarm.dht_rate import BURST, RATE, StoreRate


def test_one_sender_is_held_to_its_rate_and_others_keep_theirs() -> None:
    r = StoreRate()
    now = 1000.0
    assert r.allow("flood", 50_000, now) == BURST  # the burst, then nothing more at once
    took = sum(r.allow("flood", 1_000, now + 0.01 * k) for k in range(1, 1001))  # 10 s at 100k entries/s asked
    assert took == pytest.approx(10 * RATE, abs=2)  # with the rule off: 1,000,000
    assert r.allow("honest", 20, now + 10) == 20  # a full bucket: an honest refresh is not held back


def test_senders_tracked_are_bounded_and_a_forgotten_one_starts_afresh() -> None:
    r = StoreRate(rate=1.0, burst=2.0, max_senders=3)
    for k in range(10):
        assert r.allow(f"s{k}", 5, 0.0) == 2
    assert len(r._buckets) == 3
    assert r.allow("s9", 5, 0.0) == 0  # still tracked: its bucket is empty


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        StoreRate(rate=0.0)
