"""Outer sync over real hivemind processes on 127.0.0.1: the smoke tests of its paths on real daemons.

Every test ends by checking the survivors' state: equal state hashes wherever
the protocol promises equality. Timeouts are small (tests/sync_worker.py:
matchmaking 1.5 s, all-reduce 4 s, commit 2 s, DHT 4 s, state 6 s). A member
killed mid all-reduce, or frozen mid round and caught up after it resumes, is a
scenario of the sync's rules: it plays on the simulated network
(tests/swarm/test_sync_sim.py), where the fault lands exactly at its round point.
"""

from __future__ import annotations

import time

import pytest
from hivemind.utils.timed_storage import get_dht_time

from protocol import SigningKey
from protocol.signing import seal
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.records import JOIN_KIND, STATE_KIND, JoinRecord, StateRecord, join_key, state_key
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


@pytest.mark.parametrize("differ", ["architecture", "outer rule"])
def test_two_architectures_form_two_groups(fault_swarm: FaultSwarm, differ: str) -> None:
    """Peers whose models differ, or whose outer steps would turn one average into different states, never meet."""
    wide: tuple[str, ...] = ("--steps", "8", "--arch", "32,32,8")
    narrow: tuple[str, ...] = ("--steps", "8", "--arch", "16,24,8")
    if differ == "outer rule":
        # the same model as `wide`; plain averaging (a node's default) keeps no momentum in its state
        narrow = ("--steps", "8", "--outer-lr", "1.0", "--outer-momentum", "0")
    peers = fault_swarm.start_many({"w1": wide, "w2": wide, "n1": narrow, "n2": narrow})
    fault_swarm.go()
    finals = {p.name: final_state(p, 60.0) for p in peers}
    assert peers[0].info["fingerprint"] == peers[1].info["fingerprint"] != peers[2].info["fingerprint"]
    for p in peers:
        # grouping is what this test is about: every attempt pairs the two peers of one architecture. A round
        # may still abort (a stream lost under the suite's load: seen once in ~20 runs, the next round
        # committed), and an aborted round applies nothing, which the state hashes below check
        assert [s["group_size"] for s in p.syncs()] == [2, 2], p.syncs()
        assert any(s["committed"] for s in p.syncs()), p.syncs()
    assert finals["w1"]["state_hash"] == finals["w2"]["state_hash"]
    assert finals["n1"]["state_hash"] == finals["n2"]["state_hash"]
    assert {s["group_id"] for s in peers[0].syncs()}.isdisjoint({s["group_id"] for s in peers[2].syncs()})
    _assert_one_hash_per_revision(peers[:2])
    _assert_one_hash_per_revision(peers[2:])


def test_forged_records_are_rejected(fault_swarm: FaultSwarm) -> None:
    """Mallory overwrites the peers' state records with forged ones claiming revision 50,
    and slips a forged join record for a peer that does not exist into their gather window.
    Both peers must ignore all of it: no catch-up, and a group of exactly the two of them."""
    a, b = fault_swarm.start_many({n: ("--steps", "8") for n in "ab"})
    fp, h0 = a.info["fingerprint"], a.info["state_hash"]
    identity = load_or_create(fault_swarm.root / "mallory.key")
    cfg = MembershipConfig(swarm_id="test-sync", host="127.0.0.1", initial_peers=(a.info["maddrs"][0],))
    with Membership(identity, cfg) as mallory:
        assert mallory.dht is not None
        now, expires = time.time(), get_dht_time() + 600
        for victim in (a.info["peer"], b.info["peer"]):
            forged = seal(STATE_KIND, StateRecord(victim, fp, 50, "f" * 64, now), identity.key)
            mallory.dht.store(state_key("test-sync", fp), forged, expires, subkey=victim)
        ghost = SigningKey.generate().peer_id
        forged_join = seal(JOIN_KIND, JoinRecord(ghost, fp, 0, h0, now, now), identity.key)
        mallory.dht.store(join_key("test-sync", fp, 0, h0), forged_join, expires, subkey=ghost)
        fault_swarm.go()
        finals = [final_state(p, 60.0) for p in (a, b)]
    for p in (a, b):
        assert [(s["committed"], s["group_size"], s["caught_up"]) for s in p.syncs()] == [(True, 2, False)] * 2
    assert finals[0]["state_hash"] == finals[1]["state_hash"]
    logs = (fault_swarm.root / "a.log").read_text() + (fault_swarm.root / "b.log").read_text()
    assert "bad signature" in logs
