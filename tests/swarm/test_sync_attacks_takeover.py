"""Catch-up takeover by a partner of one honest round, over real hivemind processes on 127.0.0.1.

Mallory is tests/sync_worker.py with ``--poison takeover``: she syncs honestly with a and b until her
first commit, so both trust her as a partner (swarm.sync.catchup). Then she stops syncing, signs a state
record one revision past every honest peer's (followed on her word: contested while the other partner
still reports the same state, lone when nobody else is ahead), and serves a made-up state that claims
revision +1,000,000. Before the defence the distance bound of a catch-up was scaled by the revision gap
the served state claimed: both honest nodes adopted her anchor (median distance to it 0.125 -> 0.0007)
and spread it. Now the bound is the vouched target's, capped by each node's own pace since its last
commit, one trusted word moves a node no further than its own recent outer steps allow, and a partner
whose one word named a target but who serves a state far past it is passed over at once (new claims
would otherwise hold each round for RETRY_S). With catch-up's defence switched off here, both honest
nodes served revision 1,000,079 at the end (they adopted hers and trained on from it); with it, they
served revision 925 of their own history, 2.69 of her anchor's norm away, 14 commits each after she
turned, every one of her 14 claims refused as out of reach.
"""

from __future__ import annotations

import pytest
import torch

from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.hivemind_transport import HivemindStreams
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

FAKE_AT = 1_000_000
"""tests/sync_worker.py's TAKEOVER_REVISION: a revision at or past it is Mallory's made-up state."""


def _served(mallory: Membership, service: SyncService, peer: Peer, n: int) -> Snapshot:
    """What ``peer`` serves as its state now (fetched the way any catching-up peer would)."""
    snap: Snapshot = mallory.run(service.fetch_state(peer.info["peer"], n, 10.0), 12.0)
    return snap


def test_a_partner_claiming_a_far_revision_moves_no_honest_anchor(fault_swarm: FaultSwarm) -> None:
    honest = ("--steps", "60", "--linger", "60")
    a, b, m = fault_swarm.start_many(
        {
            "a": (*honest, "--update-seed", "1"),
            "b": (*honest, "--update-seed", "2"),
            "m": ("--steps", "60", "--update-seed", "3", "--poison", "takeover", "--linger", "90"),
        }
    )
    fault_swarm.go()
    hijack = m.wait_for(lambda r: r.get("event") == "hijack", 60.0, "the takeover")
    finals = [final_state(p, 90.0) for p in (a, b)]
    fake = torch.load(str(m.report) + ".fake.pt")
    identity = load_or_create(fault_swarm.root / "observer.key")
    cfg = MembershipConfig(swarm_id="test-sync", host="127.0.0.1", initial_peers=(a.info["maddrs"][0],))
    fp = a.info["fingerprint"]
    with Membership(identity, cfg) as observer:
        nothing = Snapshot(0, "", torch.zeros(0), torch.zeros(0))  # the observer serves nothing of interest
        service = SyncService(
            HivemindStreams(observer.p2p), f"test-sync.sync.{fp}", observer.peer_id, 2.0, lambda: nothing
        )
        served = [_served(observer, service, p, fake.numel()) for p in (a, b)]
    distances = [float((s.anchor - fake).norm() / fake.norm()) for s in served]
    claims = m.records("claim")
    mine = [s for s in m.syncs() if s["committed"]]
    after = {p.name: [s for s in p.syncs() if s["committed"] and s["time"] > hijack["time"]] for p in (a, b)}
    refused = {p.name: p.syncs()[-1]["catch_up_refused"] for p in (a, b)}
    print(f"Mallory committed {len(mine)} round(s) with them, then claimed revisions {[c['revision'] for c in claims]}")
    print(f"relative distance of a's and b's anchors to her made-up one: {[round(d, 4) for d in distances]}")
    print(f"revisions served (a, b): {[s.revision for s in served]}; commits after the takeover: ")
    print(f"  { {k: len(v) for k, v in after.items()} }; refusals counted: {refused}")
    assert len(mine) >= 1 and mine[0]["group_size"] == 3, mine  # she was a partner of an honest round
    assert claims, "Mallory published no claim"
    assert min(distances) > 0.5, distances  # defence off: both adopted hers (distance 0.0)
    assert all(s.revision < FAKE_AT for s in served) and all(f["revision"] < FAKE_AT for f in finals)
    assert all(s["state_hash"] != hijack["state_hash"] for p in (a, b) for s in p.syncs()), "a node took hers"
    assert all(len(v) >= 2 for v in after.values()), after  # the honest pair syncs on without her
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values()), hashes_by_revision([a, b])
    tried = [sum(r.values()) for r in refused.values()]
    assert max(tried) > 0, refused  # her claim was read and refused, not missed
