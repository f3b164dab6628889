"""Outer sync over real hivemind processes on 127.0.0.1: the smoke tests of its paths on real daemons.

Every test ends by checking the survivors' state: equal state hashes wherever
the protocol promises equality. Timeouts are small (tests/sync_worker.py:
matchmaking 1.5 s, all-reduce 4 s, commit 2 s, DHT 4 s, state 6 s). A member
killed mid all-reduce, or frozen mid round and caught up after it resumes, is a
scenario of the sync's rules: it plays on the simulated network
(tests/swarm/test_sync_sim.py), where the fault lands exactly at its round point;
so do groups kept apart by their fingerprints, and forged records
(tests/swarm/test_sync_sim_records.py).
"""

from __future__ import annotations

import pytest

from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]


def _assert_within_bound(peers: list[Peer]) -> None:
    for p in peers:
        bound = p.info["bound_s"]
        for r in p.syncs():
            assert r["sync_s"] <= bound, (p.name, r)


def _assert_one_hash_per_revision(peers: list[Peer]) -> None:
    for revision, hashes in hashes_by_revision(peers).items():
        assert len(hashes) == 1, f"revision {revision} has {len(hashes)} different states"


def test_three_peers_sync_three_times(fault_swarm: FaultSwarm) -> None:
    peers = fault_swarm.start_many({n: ("--steps", "12") for n in "abc"})
    fault_swarm.go()
    finals = [final_state(p, 60.0) for p in peers]
    for p in peers:
        syncs = p.syncs()
        assert [s["committed"] for s in syncs] == [True, True, True], syncs
        assert [s["revision"] for s in syncs] == [1, 2, 3]
        assert all(s["group_size"] == 3 and s["bytes_sent"] > 0 for s in syncs)
        for s in syncs:  # a committed round went through every phase, and they add up to the whole
            assert list(s["phases"]) == ["catch_up", "matchmake", "allreduce", "vote"], s
            assert abs(sum(s["phases"].values()) - s["sync_s"]) < 0.01 and s["phases"]["allreduce"] > 0, s
    _assert_one_hash_per_revision(peers)
    assert len({(f["revision"], f["state_hash"]) for f in finals}) == 1
    _assert_within_bound(peers)


def test_late_joiner_catches_up(fault_swarm: FaultSwarm) -> None:
    """With a node's default outer step (plain averaging), whose state is the anchor alone (the simulated
    network's freeze test downloads a state with momentum)."""
    plain = ("--outer-lr", "1.0", "--outer-momentum", "0")
    peers = fault_swarm.start_many(
        {
            **{n: ("--steps", "24", *plain) for n in "abc"},
            "late": ("--steps", "8", "--go-file", str(fault_swarm.root / "go-late"), *plain),
        }
    )
    a, late = peers[0], peers[3]
    fault_swarm.go()
    a.wait_for(lambda r: r.get("revision") == 2 and r.get("committed") is True, 40.0, "revision 2")
    (fault_swarm.root / "go-late").touch()
    first = late.wait_for(lambda r: r.get("event") == "sync", 30.0, "the late joiner's first sync")
    finals = [final_state(p, 60.0) for p in peers[:3]]
    assert first["caught_up"] and first["revision"] >= 2, first
    group = hashes_by_revision(peers[:3])
    assert first["state_hash"] in group[first["revision"]], (first, group)
    _assert_one_hash_per_revision(peers)
    assert len({f["state_hash"] for f in finals}) == 1
    _assert_within_bound(peers)
