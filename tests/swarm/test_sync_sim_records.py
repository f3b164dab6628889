"""Who meets whom, by the records: fingerprints that keep groups apart, and forged records, on the simulated network.

Members are tests/swarm/test_sync_sim.py's real :class:`OuterSync` instances. Records in the
simulation are signed by its keyed hash under each signer's own key, so a record one key signs
for another peer id fails to open exactly as an Ed25519 one does (tests/simnet.py, ``KeyedHash``).
These ran over real processes before (tests/swarm/test_sync_network.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from protocol import SigningKey
from protocol.signing import seal
from swarm.fingerprint import model_fingerprint, sync_fingerprint
from swarm.sync import OuterSync, SyncReport
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.records import (
    JOIN_KIND,
    STATE_KIND,
    JoinRecord,
    StateRecord,
    join_key,
    open_records,
    seal_record,
    state_key,
)
from swarm.sync.tensors import flatten, state_hash
from tests.simnet import SimNet, SimStreams
from tests.swarm.test_sync_sim import CFG, WALL_S, Member, Plan, _histories, _model, simulate

SWARM = "sim"
"""The swarm id of tests/swarm/test_sync_sim.py's members."""


@pytest.mark.parametrize("differ", ["architecture", "outer rule"])
def test_two_architectures_form_two_groups(tmp_path: Path, differ: str) -> None:
    """Members whose models differ, or whose outer steps would turn one average into different states, never
    meet: every round pairs the two members of one kind, and each pair ends on a state of its own (one
    fingerprint for every model and rule: the kinds read each other's state records, and n1, joined through
    w1, tries to catch up across them)."""
    names = ["w1", "w2", "n1", "n2"]
    shapes = {"n1": (4, 4), "n2": (4, 4)} if differ == "architecture" else {}
    plain = replace(CFG, outer_lr=1.0, outer_momentum=0.0)  # a node's default: no momentum in its state
    cfgs = {"n1": plain, "n2": plain} if differ == "outer rule" else {}
    members, net, wall = simulate(tmp_path, names, Plan(rounds=2, train_s=0.2), cfgs=cfgs, shapes=shapes)
    print(f"two kinds ({differ}): {wall:.3f} s wall\n" + "\n".join(net.trace))
    w1, w2, n1, n2 = (members[n] for n in names)
    for m in members.values():
        shown = [(r.committed, r.group_size, r.cause) for r in m.reports]
        print(m.name, shown)
        assert [r.group_size for r in m.reports] == [2, 2], shown
        assert all(r.committed for r in m.reports), shown
    assert w1.states[-1] == w2.states[-1] and n1.states[-1] == n2.states[-1]
    assert {r.group_id for r in w1.reports}.isdisjoint({r.group_id for r in n1.reports})
    assert all(len(h) == 1 for h in _histories([w1, w2]).values())
    assert all(len(h) == 1 for h in _histories([n1, n2]).values())
    assert wall < 2 * WALL_S


def test_forged_records_are_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Mallory, on the network before anyone syncs, overwrites both members' state records (as they published
    them at start) with ones claiming revision 50 that she signed herself, and slips a join record for a peer
    that does not exist into their gather window. Both members ignore all of it: no catch-up, and groups of
    exactly the two of them (with signatures unchecked, they find no partner)."""
    model = _model()
    n = sum(p.numel() for p in model.parameters())
    fp = sync_fingerprint(model_fingerprint(model), CFG.rule())
    h0 = state_hash(flatten(model), torch.zeros(CFG.momentum_elems(n)))
    mallory = SigningKey(hashlib.sha256(b"mallory").digest())

    async def forge(net: SimNet, members: dict[str, Member]) -> None:
        net.add("mallory")
        victims = {m.peer for m in members.values()}
        while not victims <= set(net.read("mallory", state_key(SWARM, fp))):
            await asyncio.sleep(0.001)  # their own records first: hers, stored later, outlive them (overwrite)
        now, sig = net.clock(), net.signatures
        for victim in (m.peer for m in members.values()):
            forged = seal(STATE_KIND, StateRecord(victim, fp, 50, "f" * 64, now), mallory, sig)
            net.put("mallory", state_key(SWARM, fp), victim, forged, 600.0)
        ghost = SigningKey(hashlib.sha256(b"ghost").digest()).peer_id
        forged_join = seal(JOIN_KIND, JoinRecord(ghost, fp, 0, h0, now, now), mallory, sig)
        net.put("mallory", join_key(SWARM, fp, 0, h0), ghost, forged_join, 600.0)

    with caplog.at_level(logging.DEBUG, logger="swarm.sync"):
        members, net, wall = simulate(tmp_path, ["a", "b"], Plan(rounds=2, train_s=0.2), forge)
    print(f"forged records: {wall:.3f} s wall\n" + "\n".join(net.trace))
    a, b = members["a"], members["b"]
    for m in (a, b):
        got = [(r.committed, r.group_size, r.caught_up) for r in m.reports]
        assert got == [(True, 2, False)] * 2, [(r.cause, r.outcome, r.catch_up_refused) for r in m.reports]
    assert a.states[-1] == b.states[-1]
    assert any("bad signature" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert wall < WALL_S


FAKE_REVISION = 1_000_000
ROUNDS = 15
"""Syncs of each member in the takeover (the daemon test's: 60 steps, a sync every 4)."""


def test_a_forged_revision_claimed_by_many_keys_is_not_adopted(tmp_path: Path) -> None:
    """Once a and b committed revision 2, Mallory signs state records with five fresh keys (her own among them)
    vouching for a made-up state at revision 1,000,000, and serves its made-up anchor on the sync's stream
    handler. a and b keep their own history (none of them is a trusted peer: they count the claim as refused),
    and a late joiner, through a, still catches up to the honest group (trust off: the fake's distance from
    their anchors still keeps a and b, but the late joiner, torn between a's claim and five, never catches up).
    """
    model = _model()
    n = sum(p.numel() for p in model.parameters())
    initial = flatten(model)
    fp = sync_fingerprint(model_fingerprint(model), CFG.rule())
    anchor = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(666))  # a made-up model's scale
    fake = Snapshot(FAKE_REVISION, state_hash(anchor, torch.zeros(n)), anchor, torch.zeros(n))
    vouched: list[float] = []
    syncs: dict[str, OuterSync] = {}

    def keep(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:
            syncs[m.name] = sync
            if m.name == "late":  # a late joiner: it starts syncing once the forged claim is out
                while not vouched:
                    sync._net.loop.sleep(0.1)

        return setup

    async def vouch(net: SimNet, members: dict[str, Member]) -> None:
        mallory = SigningKey(hashlib.sha256(b"mallory").digest())
        net.add(mallory.peer_id)
        streams = SimStreams(net, mallory.peer_id)
        service = SyncService(streams, f"{SWARM}.sync.{fp}", mallory.peer_id, 2.0, lambda: fake, net.clock)
        await service.start()
        a, b = members["a"], members["b"]
        while not all(any(r.committed and r.revision == 2 for r in m.reports) for m in (a, b)):
            await asyncio.sleep(0.05)
        keys = [SigningKey(hashlib.sha256(f"sybil-{i}".encode()).digest()) for i in range(4)] + [mallory]
        for i, key in enumerate(keys):  # Mallory's own record the freshest
            record = StateRecord(key.peer_id, fp, FAKE_REVISION, fake.state_hash, net.clock() + 0.001 * i)
            sealed = seal_record(STATE_KIND, record, key, net.signatures)
            net.put(mallory.peer_id, state_key(SWARM, fp), key.peer_id, sealed, 600.0)
        vouched.append(net.clock())

    setups = {name: keep for name in ("a", "b", "late")}
    members, net, wall = simulate(tmp_path, ["a", "b", "late"], Plan(rounds=6, train_s=0.2), vouch, setups=setups)
    print(f"forged revision: {wall:.3f} s wall\n" + "\n".join(net.trace))
    a, b, late = members["a"], members["b"], members["late"]
    for m in members.values():
        print(m.name, [(r.revision, r.committed, r.caught_up, r.catch_up_refused) for r in m.reports])
    served = [syncs[name].state_dict() for name in ("a", "b", "late")]  # what each serves a catching-up peer
    distances = [float((s["anchor"] - fake.anchor).norm() / fake.anchor.norm()) for s in served]
    print(f"relative distance to the fake anchor (a, b, late): {[round(d, 4) for d in distances]}")
    assert min(distances) > 1.0, distances
    assert all(s["revision"] < 100 for s in served), [s["revision"] for s in served]
    assert all(bool((s["anchor"] - initial).norm() > 0) for s in served)  # an honest history went on
    for m in (a, b):
        assert not any(r.caught_up for r in m.reports), m.reports
        committed = [r.revision for r in m.reports if r.committed]
        assert committed == list(range(1, len(committed) + 1)) and len(committed) >= 4, m.reports
        assert m.reports[-1].catch_up_refused.get("claimed by no trusted peer", 0) > 0, m.reports[-1]  # counted
    assert a.states[-1] == b.states[-1]  # a and b still share one history
    first = late.reports[0]
    assert first.caught_up and 2 <= first.revision < 100, first
    assert first.state_hash in _histories([a, b])[first.revision], first
    assert wall < 2 * WALL_S


def test_a_partner_claiming_a_far_revision_moves_no_honest_anchor(tmp_path: Path) -> None:
    """m syncs honestly with a and b until its first commit, so both trust it as a partner. Then it stops
    syncing, signs a state record one revision past every honest peer's (followed on its word: contested while
    the other partner reports the same state, lone when nobody else is ahead), and serves a made-up state that
    claims revision +1,000,000. The distance bound of a catch-up is the vouched target's, capped by each
    member's own pace, so neither a nor b takes its anchor: they sync on as a pair, refusing every claim
    (the downloaded state's checks off: both adopt it and train on from it, 0.15 of its norm away)."""
    hijacked: list[Snapshot] = []
    syncs: dict[str, OuterSync] = {}

    def keep(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        return lambda sync: syncs.__setitem__(m.name, sync)

    def take_over(net: SimNet, m: Member) -> Callable[[OuterSync], None]:
        def setup(sync: OuterSync) -> None:
            honest = sync.sync_now
            last: list[SyncReport] = []

            def sync_now(inner_step: int | None = None) -> SyncReport:
                if hijacked:  # it only serves its made-up state now
                    return last[-1]
                last.append(honest(inner_step))
                if last[-1].committed:
                    snap = sync._snap
                    n = snap.anchor.numel()
                    anchor = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(666))
                    momentum = torch.zeros(snap.momentum.numel())
                    revision = snap.revision + FAKE_REVISION
                    fake = Snapshot(revision, state_hash(anchor, momentum, snap.origin), anchor, momentum, snap.origin)
                    sync._snap = fake  # what its sync service serves from now on
                    hijacked.append(fake)
                return last[-1]

            sync.sync_now = sync_now  # type: ignore[method-assign]  # an attacker runs whatever code it likes

        return setup

    claims: list[int] = []

    async def claim(net: SimNet, members: dict[str, Member]) -> None:
        """Once m turned: a state record one revision past every honest peer's, again whenever they move."""
        m = members["m"]
        while not hijacked:
            await asyncio.sleep(0.05)
        fp = syncs["a"].fingerprint
        key = state_key(SWARM, fp)
        while not all(len(members[name].reports) >= ROUNDS for name in "ab"):
            raw = net.read(m.peer, key)
            states, _ = open_records(
                raw, STATE_KIND, StateRecord.from_wire, lambda r: None, net.clock(), None, net.signatures
            )
            honest = [r.revision for p, r in states.items() if p != m.peer and r.revision < FAKE_REVISION]
            ahead = max(honest, default=0) + 1
            if not claims or claims[-1] != ahead:  # one record just past theirs: the state it "moved on" from
                record = StateRecord(m.peer, fp, ahead, os.urandom(32).hex(), net.clock(), hijacked[0].origin)
                net.put(m.peer, key, m.peer, seal_record(STATE_KIND, record, m.key, net.signatures), 600.0)
                claims.append(ahead)
            await asyncio.sleep(0.1)

    setups = {"a": keep, "b": keep, "m": take_over}
    members, _, wall = simulate(tmp_path, ["a", "b", "m"], Plan(rounds=ROUNDS, train_s=0.2), claim, setups=setups)
    print(f"takeover: {wall:.3f} s wall; claims {claims}")
    a, b, m = members["a"], members["b"], members["m"]
    for x in (a, b, m):
        print(x.name, [(r.revision, r.committed, r.group_size, r.catch_up_refused) for r in x.reports])
    fake = hijacked[0]
    served = [syncs[name].state_dict() for name in "ab"]  # what each serves a catching-up peer
    distances = [float((s["anchor"] - fake.anchor).norm() / fake.anchor.norm()) for s in served]
    print(f"relative distance of a's and b's anchors to the made-up one: {[round(d, 4) for d in distances]}")
    mine = [r for r in m.reports if r.committed]
    assert len(mine) >= 1 and mine[0].group_size == 3, mine  # it was a partner of an honest round
    assert claims, "m published no claim"
    assert min(distances) > 0.5, distances
    assert all(s["revision"] < FAKE_REVISION for s in served)
    assert all(r.state_hash != fake.state_hash for x in (a, b) for r in x.reports), "a member took its state"
    turned = mine[0].time
    assert all(sum(r.committed and r.time > turned for r in x.reports) >= 2 for x in (a, b))  # on without it
    assert all(len(h) == 1 for h in _histories([a, b]).values())
    assert a.states[-1] == b.states[-1]
    assert max(sum(x.reports[-1].catch_up_refused.values()) for x in (a, b)) > 0  # its claim read and refused
    assert wall < 3 * WALL_S
