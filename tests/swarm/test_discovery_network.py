"""Sharded discovery on real hivemind DHTs on 127.0.0.1: descriptors land under their publishers' shard keys
(the unsharded key stays empty), the validating DHT refuses another shard, and readers find every peer."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.messages import DESCRIPTOR_KIND
from protocol.signing import seal
from swarm import discovery
from swarm.exchange import ExchangeConfig, RolloutExchange, window_key
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.validation import rollout_validator
from tests.procs import wait_for
from tests.swarm.exchange_worker import make_batch

pytestmark = pytest.mark.network
SWARM = "test-shards"
SHARDS = 4


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[list[RolloutExchange]]:
    """Three validating peers whose swarm runs at 4 shard keys per window; every reader reads all 4."""
    cfg = ExchangeConfig(min_shards=SHARDS, discovery_reads=SHARDS, collect_timeout_s=8.0)
    exchanges: list[RolloutExchange] = []
    try:
        for i in range(3):
            boot = tuple(exchanges[0].membership.visible_multiaddrs()[:1]) if exchanges else ()
            member_cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=boot)
            validator = rollout_validator(SWARM, cfg.window_s)
            member = Membership(load_or_create(tmp_path / f"{i}.key"), member_cfg, [validator]).start()
            exchanges.append(RolloutExchange(member, cfg).start())
        yield exchanges
    finally:
        for ex in exchanges:
            ex.close()
            ex.membership.shutdown()


def test_descriptors_live_under_shard_keys_and_every_reader_finds_every_peer(trio: list[RolloutExchange]) -> None:
    t0 = time.time()
    descs = [ex.publish(make_batch(ex.peer_id, 1, created=time.time())) for ex in trio]
    reader = trio[0]
    window = int(descs[0].created // reader.cfg.window_s)

    def found_by_all() -> bool:
        return all({d.publisher for d, _ in ex.collect(since=t0 - 1, limit=8).accepted} >= others(ex) for ex in trio)

    def others(ex: RolloutExchange) -> set[str]:
        return {d.publisher for d in descs} - {ex.peer_id}

    wait_for(found_by_all, 60, "every peer's batch collected through the shard keys", poll=0.5)
    dht = reader.membership.dht
    assert dht is not None
    base = dht.get(window_key(SWARM, descs[0].created, reader.cfg.window_s), latest=True)
    in_base = set(base.value) if base is not None else set()
    for d in descs:  # each under its own shard key
        found = dht.get(discovery.publisher_key(SWARM, d.publisher, window, SHARDS), latest=True)
        assert found is not None and d.publisher in found.value
    for d in descs:  # the base key is shard 0 of every level: it holds shard 0's publishers only (nothing is
        # stored below the configured 4 shards, though 3 publishers are far below 4 shards' worth)
        assert (d.publisher in in_base) == (discovery.shard_of(d.publisher, window, SHARDS) == 0)
    assert {ex.shards for ex in trio} == {SHARDS}  # 3 publishers: the count stays at the configured floor


def test_a_descriptor_under_another_shard_is_refused_by_the_validating_dht(trio: list[RolloutExchange]) -> None:
    mallory, victim = trio[2], trio[0]
    desc = victim.publish(make_batch(victim.peer_id, 2, created=time.time()))
    window = int(desc.created // victim.cfg.window_s)
    own = discovery.shard_of(mallory.peer_id, window, SHARDS)
    crowded = discovery.descriptor_key(SWARM, window, SHARDS, own % (SHARDS - 1) + 1)  # not hers, not the base key
    forged = dataclasses.replace(desc, publisher=mallory.peer_id)  # her own, signed, but in another's shard
    sealed = seal(DESCRIPTOR_KIND, forged, mallory.membership.identity.key)
    dht = mallory.membership.dht
    assert dht is not None
    dht.store(crowded, sealed, desc.expires, subkey=mallory.peer_id)
    found = victim.membership.dht.get(crowded, latest=True) if victim.membership.dht else None
    assert found is None or mallory.peer_id not in found.value
