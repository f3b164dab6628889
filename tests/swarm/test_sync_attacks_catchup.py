"""Catch-up to a forged history, over real hivemind processes on 127.0.0.1.

Mallory is an outsider built from public modules (swarm.identity, swarm.membership,
swarm.sync, protocol.signing) and hivemind: with fresh keys she signs state records
claiming revision 1,000,000 (five keys vouching for the same made-up state) and serves
a made-up anchor on the sync stream handler. Before this defence both honest peers
"caught up" to it (median distance to the fake anchor 0.0). Now they must keep their
own history, and an honest late joiner must still catch up to the honest group.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from hivemind.utils.timed_storage import get_dht_time

from protocol import SigningKey
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.hivemind_transport import HivemindStreams
from swarm.sync.records import STATE_KIND, StateRecord, seal_record, state_key
from swarm.sync.tensors import flatten, state_hash
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

FAKE_REVISION = 1_000_000


def _initial_anchor() -> torch.Tensor:
    """The workers' initial weights (tests/sync_worker.py: --arch 32,32,8, --init-seed 0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in itertools.pairwise([32, 32, 8])))
    return flatten(model)


def _fake_state(n: int) -> Snapshot:
    """A made-up model of the honest weights' scale (~0.1 per weight) and no momentum."""
    anchor = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(666))
    momentum = torch.zeros(n)
    return Snapshot(FAKE_REVISION, state_hash(anchor, momentum), anchor, momentum)


def _vouch(mallory: Membership, keys: list[SigningKey], fp: str, fake: Snapshot) -> None:
    """Every key signs (1,000,000, fake hash) under its own subkey; Mallory's own record is the freshest."""
    expires = get_dht_time() + 600
    assert mallory.dht is not None
    for i, key in enumerate(keys):
        record = StateRecord(key.peer_id, fp, FAKE_REVISION, fake.state_hash, time.time() + 0.001 * i)
        value = seal_record(STATE_KIND, record, key)
        mallory.dht.store(state_key("test-sync", fp), value, expires, subkey=key.peer_id)


def _served(mallory: Membership, service: SyncService, peer: Peer, n: int) -> Snapshot:
    """What ``peer`` now serves as its state (fetched the way any catching-up peer would)."""
    snap: Snapshot = mallory.run(service.fetch_state(peer.info["peer"], n, 10.0), 12.0)
    return snap


def test_forged_revision_claimed_by_many_keys_is_not_adopted(fault_swarm: FaultSwarm) -> None:
    late_go = fault_swarm.root / "go-late"
    a, b, late = fault_swarm.start_many(
        {"a": ("--steps", "24"), "b": ("--steps", "24"), "late": ("--steps", "8", "--go-file", str(late_go))}
    )
    initial = _initial_anchor()
    fp, n = a.info["fingerprint"], initial.numel()
    fake = _fake_state(n)
    identity = load_or_create(fault_swarm.root / "mallory.key")
    cfg = MembershipConfig(swarm_id="test-sync", host="127.0.0.1", initial_peers=(a.info["maddrs"][0],))
    with Membership(identity, cfg) as mallory:
        service = SyncService(HivemindStreams(mallory.p2p), f"test-sync.sync.{fp}", mallory.peer_id, 2.0, lambda: fake)
        mallory.run(service.start(), 5.0)
        fault_swarm.go()
        for p in (a, b):
            p.wait_for(lambda r: r.get("revision") == 2 and r.get("committed") is True, 40.0, "revision 2")
        sybils = [SigningKey.generate() for _ in range(4)]
        _vouch(mallory, [*sybils, identity.key], fp, fake)
        late_go.touch()
        finals = [final_state(p, 90.0) for p in (a, b, late)]
        served = [_served(mallory, service, p, n) for p in (a, b, late)]
    assert all(p.proc.alive() for p in (a, b, late)), "a peer exited"
    anchors = [s.anchor for s in served]
    distances = [float((x - fake.anchor).norm() / fake.anchor.norm()) for x in anchors]
    shifts = [float((x - initial).norm() / initial.norm()) for x in anchors]
    print(f"relative distance to the fake anchor (a, b, late): {[round(d, 4) for d in distances]}")
    print(f"honest shift from the initial weights (a, b, late): {[round(d, 4) for d in shifts]}")
    print(f"revisions served (a, b, late): {[s.revision for s in served]}")
    assert min(distances) > 1.0, distances  # defence off: 0.20-0.58 (and r=1,000,004)
    assert all(s.revision < 100 for s in served), [s.revision for s in served]
    group = hashes_by_revision([a, b])
    for p, final in zip((a, b), finals[:2], strict=True):
        syncs = p.syncs()
        assert not any(s["caught_up"] for s in syncs), (p.name, syncs)
        committed = [s["revision"] for s in syncs if s["committed"]]
        assert committed == list(range(1, len(committed) + 1)) and len(committed) >= 4, (p.name, syncs)
        assert final["revision"] == committed[-1] < 100
        assert syncs[-1]["catch_up_refused"].get("claimed by no trusted peer", 0) > 0, syncs[-1]  # counted
    assert float((anchors[0] - anchors[1]).norm()) == 0.0  # a and b still share one history
    first = next(s for s in late.syncs())
    assert first["caught_up"] and 2 <= first["revision"] < 100, first
    assert first["state_hash"] in group[first["revision"]], (first, group)
    logs = (fault_swarm.root / "a.log").read_text() + (fault_swarm.root / "b.log").read_text()
    assert "claimed by no trusted peer" in logs
