"""The gather window closes as soon as every expected member joined (real hivemind processes on 127.0.0.1).

Three peers sync three times with a long gather window (M = 8 s). The first
round has no expectation (no group formed yet) and runs the whole window;
from the second on, each peer expects the members of its last group that
report its own state, closes its join record once they joined, and the group
is decided as soon as every record of the window is closed.
"""

from __future__ import annotations

import pytest

from tests.faults import FaultSwarm, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

WINDOW_S = 8.0
TIMEOUTS = f"{WINDOW_S},4,2,4,6"  # matchmaking, all-reduce, commit, DHT, state (tests/sync_worker.py)


def test_window_closes_early_once_the_last_group_rejoined(fault_swarm: FaultSwarm) -> None:
    peers = fault_swarm.start_many({n: ("--steps", "12", "--timeouts", TIMEOUTS) for n in "abc"})
    fault_swarm.go()
    finals = [final_state(p, 90.0) for p in peers]
    later: list[float] = []
    for p in peers:
        syncs = p.syncs()
        assert [s["committed"] for s in syncs] == [True, True, True], syncs
        assert all(s["group_size"] == 3 for s in syncs), syncs
        # round 1: nobody expected, the window runs to its end (the opener waits all of it)
        later += [s["sync_s"] for s in syncs[1:]]
    first = max(p.syncs()[0]["sync_s"] for p in peers)
    print(f"window {WINDOW_S} s: first sync (no expectation) {first:.2f} s; later syncs {sorted(later)}")
    assert first >= WINDOW_S * 0.75, first
    # a whole sync (catch-up check, gather, all-reduce, vote) well under half the window
    assert max(later) < WINDOW_S / 2, later
    for revision, hashes in hashes_by_revision(peers).items():
        assert len(hashes) == 1, f"revision {revision} committed {len(hashes)} different states"
    assert len({(f["revision"], f["state_hash"]) for f in finals}) == 1
