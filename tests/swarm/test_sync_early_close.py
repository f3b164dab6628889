"""The gather window closes as soon as every expected member joined (real hivemind processes on 127.0.0.1).

Three peers sync three times with a long gather window (M = 8 s). Each peer
expects the peers whose state records report its own state (all three start
from the same weights, so the first round too) and the joiners of its last
round, closes its join record once they joined, and the group is decided as
soon as every record of the window is closed. With the close off every sync
takes the whole window (8.1 s).
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
    took: list[float] = []
    for p in peers:
        syncs = p.syncs()
        assert [s["committed"] for s in syncs] == [True, True, True], syncs
        assert all(s["group_size"] == 3 for s in syncs), syncs
        took += [s["sync_s"] for s in syncs]
    print(f"window {WINDOW_S} s: syncs took {sorted(took)}")
    # a whole sync (catch-up check, gather, all-reduce, vote) well under half the window
    assert max(took) < WINDOW_S / 2, took
    for revision, hashes in hashes_by_revision(peers).items():
        assert len(hashes) == 1, f"revision {revision} committed {len(hashes)} different states"
    assert len({(f["revision"], f["state_hash"]) for f in finals}) == 1
