"""The per-sender quota and the lookup-cache rule of the budgeted DHT storage (issue 51), without processes.

Issue 51: one host stored its own valid state records (its own key as subkey, so the owner rule keeps them)
under made-up fingerprints, one new key each, created 110 s ahead with the full 600 s lifetime. The total
budget evicts the soonest-expiring entries first, and those were every honest one. Each remote peer's
stores are now charged to it, and a peer over its quota loses its own soonest-expiring entries. The tests
are pure: hivemind's DHT clock is faked, expirations are explicit, the store handler is driven directly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.proto import dht_pb2
from hivemind.utils import MSGPackSerializer

from swarm.dht_storage import (
    KEY_OVERHEAD_BYTES,
    REGULAR,
    STORE_SENDER,
    BudgetedStorage,
    StorageBudget,
    StorageEvent,
    _name_store_senders,
    entry_bytes,
)
from swarm.membership import MembershipConfig

T0 = 1_000_000.0
Handler = Callable[..., Coroutine[Any, Any, Any]]
STATE_RECORD = bytes(311)
"""A sealed state record's size (the flood's records and honest ones alike)."""


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """hivemind's DHT clock (used by its storages and by ours), set by the test."""
    t = [T0]
    monkeypatch.setattr("hivemind.utils.timed_storage.get_dht_time", lambda: t[0])
    yield t


def _key(i: int | str) -> Any:
    return DHTID.generate(source=f"key-{i}")


def _peer(i: int | str) -> str:
    return f"12D3KooW{i:0>44}"


def _budget(**kw: Any) -> StorageBudget:
    base = {"total_bytes": 64 * 1024, "key_bytes": 16 * 1024, "key_subkeys": 1000}
    return StorageBudget(**{**base, "sender_entries": 5, "sender_bytes": 16 * 1024, **kw})


def _production(**kw: Any) -> StorageBudget:
    """The storage budget a node installs by default, with ``kw`` changed."""
    cfg = MembershipConfig().storage_budget()
    fields = ("total_bytes", "key_bytes", "key_subkeys", "max_keys", "owners_only", "sender_entries", "sender_bytes")
    return StorageBudget(**{**{f: getattr(cfg, f) for f in fields}, **kw})


def _as(sender: str | None, store: Callable[..., bool], *args: Any) -> bool:
    """``store(*args)`` as the store handler runs it for a store RPC from ``sender`` (None: this node's own write)."""
    token = STORE_SENDER.set(sender)
    try:
        return store(*args)
    finally:
        STORE_SENDER.reset(token)


def _held(storage: DHTLocalStorage) -> dict[tuple[Any, Any], tuple[bytes, float]]:
    """(key, subkey) -> (value, expiration) of everything ``storage`` holds, read from hivemind's containers."""
    out: dict[tuple[Any, Any], tuple[bytes, float]] = {}
    for key, item in storage.items():
        if isinstance(item.value, DictionaryDHTValue):
            out |= {(key, s): (v, e) for s, (v, e) in item.value.items()}
        else:
            out[(key, REGULAR)] = (item.value, item.expiration_time)
    return out


def held_bytes(storage: DHTLocalStorage) -> int:
    """Bytes charged for what ``storage`` actually holds, computed from hivemind's containers."""
    held = _held(storage)
    return KEY_OVERHEAD_BYTES * len({k for k, _ in held}) + sum(entry_bytes(s, v) for (_, s), (v, _) in held.items())


def test_a_sender_over_its_quota_loses_only_its_own_soonest_expiring_entries(now: list[float]) -> None:
    s = BudgetedStorage(_budget())
    honest = [_peer(f"h{i}") for i in range(3)]
    for i, peer in enumerate(honest):  # honest entries that expire long before the flood's
        assert _as(peer, s.store_subkey, _key("state"), peer, STATE_RECORD, T0 + 30 + i)
    assert s.store_subkey(_key("state"), _peer("self"), STATE_RECORD, T0 + 20)  # this node's own, no sender
    mallory = _peer("m")
    expirations = [T0 + 600 + (i * 7) % 20 for i in range(20)]  # shuffled: the quota picks by expiration
    for i, exp in enumerate(expirations):
        assert _as(mallory, s.store_subkey, _key(f"fp-{i}"), mallory, STATE_RECORD, exp)
        kept = {k for k, sub in _held(s) if sub == mallory}
        assert _key(f"fp-{i}") in kept  # the entry just stored is never the one evicted
    held = _held(s)
    assert {sub for _, sub in held} == {*honest, _peer("self"), mallory}  # no honest entry was touched
    assert s.sender_usage(mallory)[0] == 5 == sum(sub == mallory for _, sub in held)
    latest = sorted(e for (_, sub), (_, e) in held.items() if sub == mallory)
    assert latest == sorted([*sorted(expirations[:-1])[-4:], expirations[-1]])  # the latest, and the one just stored
    assert s.events[StorageEvent.EVICTED_SENDER_QUOTA] == 15 and not s.events[StorageEvent.EVICTED_BUDGET]
    assert s.used_bytes == held_bytes(s) and s.stats().senders == 4


def test_the_byte_quota_binds_on_large_entries_and_counts_replacements(now: list[float]) -> None:
    s, mallory = BudgetedStorage(_budget(sender_entries=1000)), _peer("m")
    for i in range(10):  # 4,000 B values: four (~17.5 KB) would be over the 16 KiB quota
        assert _as(mallory, s.store_subkey, _key(i), mallory, bytes(4000), T0 + 100 + i)
    entries, used = s.sender_usage(mallory)
    assert entries == 3 and used == 3 * entry_bytes(mallory, bytes(4000)) <= 16 * 1024
    assert s.events[StorageEvent.EVICTED_SENDER_QUOTA] == 7
    # a newer value under the same (key, subkey) is charged at its own size, not added to the old one
    assert _as(mallory, s.store_subkey, _key(9), mallory, bytes(10), T0 + 500)
    assert s.sender_usage(mallory) == (3, 2 * entry_bytes(mallory, bytes(4000)) + entry_bytes(mallory, bytes(10)))
    # this node's own write over the sender's entry takes it off the sender's quota
    assert s.store_subkey(_key(9), mallory, bytes(10), T0 + 501)
    assert s.sender_usage(mallory) == (2, 2 * entry_bytes(mallory, bytes(4000)))
    assert s.used_bytes == held_bytes(s)


def test_honest_entries_survive_a_one_owner_flood_of_50k_records(now: list[float]) -> None:
    """Issue 51 in one storage: 50k valid records of one host, each under its own made-up key, +110 s."""

    def run(budget: StorageBudget) -> tuple[BudgetedStorage, list[tuple[Any, str]], float]:
        s = BudgetedStorage(budget)
        honest: list[tuple[Any, str]] = []
        for i in range(4):  # four honest peers: a state record, and the join and vote records of a round
            peer = _peer(f"h{i}")
            for name, ttl in (("state", 600.0), (f"join-{i}", 36.0), (f"vote-{i}", 36.0)):
                assert _as(peer, s.store_subkey, _key(name), peer, STATE_RECORD, T0 + ttl)
                honest.append((_key(name), peer))
        assert s.store_subkey(_key("state"), _peer("self"), STATE_RECORD, T0 + 600)  # this node's own
        honest.append((_key("state"), _peer("self")))
        mallory, started = _peer("m"), time.perf_counter()
        token = STORE_SENDER.set(mallory)
        try:
            for i in range(50_000):
                s.store_subkey(_key(f"made-up-{i}"), mallory, STATE_RECORD, T0 + 110 + 600 + i * 1e-4)
        finally:
            STORE_SENDER.reset(token)
        return s, honest, time.perf_counter() - started

    s, honest, took = run(_production())
    held = _held(s)
    assert all(entry in held for entry in honest), [e for e in honest if e not in held]
    assert s.sender_usage(_peer("m"))[0] == 256 and not s.events[StorageEvent.EVICTED_BUDGET]
    assert s.events[StorageEvent.EVICTED_SENDER_QUOTA] == 50_000 - 256
    assert s.used_bytes == held_bytes(s) and len(s._heap) <= 2 * s.entries + 1024
    assert took < 20.0, took  # ~0.1 ms a store: the quota costs a flood nothing but its own entries

    # the same flood without the quota: the total budget evicts the soonest-expiring entries, every honest one
    s, honest, _ = run(_production(sender_entries=None, sender_bytes=None))
    assert not any(entry in _held(s) for entry in honest)
    assert s.events[StorageEvent.EVICTED_BUDGET] > 25_000 and s.used_bytes <= s.budget.total_bytes


def test_ledger_stays_consistent_under_mixed_operations(now: list[float]) -> None:
    """Stores by several senders and this node, replacements, whole keys, expiry, and every kind of eviction."""
    rng = random.Random(51)
    # the owner rule off, so that senders also replace each other's entries and store regular values
    budget = _budget(total_bytes=64 * 1024, key_subkeys=4, sender_entries=8, sender_bytes=16 * 1024, owners_only=False)
    s = BudgetedStorage(budget)
    senders: list[str | None] = [None, *(_peer(f"s{i}") for i in range(5))]
    sent_by: dict[tuple[Any, Any], str | None] = {}  # who last stored each (key, subkey) that was kept
    subkey: Any
    for step in range(4000):
        now[0] = T0 + step * 0.1
        sender, key, exp = rng.choice(senders), _key(rng.randrange(16)), now[0] + rng.uniform(1, 60)
        value = bytes(rng.randrange(1, 3000))
        roll, subkey = rng.random(), None
        if roll < 0.08:  # a regular value: replaces a whole dictionary key
            stored, subkey = _as(sender, s.store, key, value, exp), REGULAR
        elif roll < 0.12 and sender is None:  # a whole dictionary, as hivemind caches a lookup result
            found = DictionaryDHTValue()
            for j in range(3):
                found.store(_peer(f"d{j}"), bytes(200), exp)
            stored = s.store(key, found, exp)
            if stored:
                sent_by |= {(key, _peer(f"d{j}")): None for j in range(3)}
        else:
            subkey = sender if sender is not None and rng.random() < 0.5 else _peer(f"s{rng.randrange(5)}")
            stored = _as(sender, s.store_subkey, key, subkey, value, exp)
        if stored and subkey is not None:
            sent_by[(key, subkey)] = sender
        if rng.random() < 0.2:
            s.purge_expired(now[0])
        held = _held(s)
        assert s.used_bytes == held_bytes(s) <= 64 * 1024, step
        assert s.entries == len(held), step
        usage: dict[str, list[int]] = {}
        for (k, sub), (v, _) in held.items():
            who = sent_by[(k, sub)]
            if who is not None:
                usage.setdefault(who, [0, 0])
                usage[who][0] += 1
                usage[who][1] += entry_bytes(sub, v)
        assert set(s._senders) == set(usage), step  # a sender with nothing held is forgotten
        for who, (entries, used) in usage.items():
            assert s.sender_usage(who) == (entries, used) and entries <= 8 and used <= 16 * 1024, (step, who)
    assert all(s.events[e] > 0 for e in (StorageEvent.EVICTED_SENDER_QUOTA, StorageEvent.EVICTED_KEY_FULL))
    assert s.events[StorageEvent.EVICTED_BUDGET] > 0
    for ledger in s._senders.values():
        assert len(ledger.heap) <= 2 * ledger.entries + 64  # stale heap items do not pile up
    s.purge_expired(T0 + 10_000)
    assert s.used_bytes == 0 and not s._senders and not s.data


class _FakeP2P:
    """What :func:`_name_store_senders` needs of hivemind's P2P: it captures the handler it registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    async def remove_protobuf_handler(self, name: str) -> None:
        self.handlers.pop(name, None)

    async def add_protobuf_handler(self, name: str, handler: Handler, _type: Any) -> None:
        self.handlers[name] = handler


def _store_handler(storage: BudgetedStorage, cache: BudgetedStorage) -> Handler:
    """hivemind's own ``rpc_store`` on these storages (no validator), wrapped as a started node wraps it."""
    protocol: Any = DHTProtocol.__new__(DHTProtocol)
    protocol.storage, protocol.cache, protocol.record_validator = storage, cache, None
    protocol.serializer, protocol.node_info = MSGPackSerializer, dht_pb2.NodeInfo()
    p2p = protocol.p2p = _FakeP2P()
    protocol.client_mode, protocol.authorizer = False, None
    asyncio.run(_name_store_senders(protocol))
    return p2p.handlers[DHTProtocol._get_handle_name(None, "rpc_store")]


def _request(entries: list[tuple[str, str, bool]]) -> dht_pb2.StoreRequest:
    """A store request of (key name, subkey, in_cache) entries, each a 100-byte value for 60 s."""
    return dht_pb2.StoreRequest(
        keys=[_key(k).to_bytes() for k, _, _ in entries],
        subkeys=[MSGPackSerializer.dumps(sub) for _, sub, _ in entries],
        values=[bytes(100)] * len(entries),
        expiration_time=[T0 + 60] * len(entries),
        in_cache=[c for _, _, c in entries],
    )


def test_remote_stores_never_write_the_lookup_cache_and_are_charged_to_their_sender(now: list[float]) -> None:
    storage, cache = BudgetedStorage(_budget()), BudgetedStorage(_budget())
    handle = _store_handler(storage, cache)
    mallory = _peer("m")
    context = SimpleNamespace(remote_id=SimpleNamespace(to_base58=lambda: mallory))
    entries = [("a", mallory, True), ("b", mallory, False), ("c", _peer("x"), True), ("d", mallory, True)]
    response = asyncio.run(handle(_request(entries), context))
    assert list(response.store_ok) == [False, True, False, False]
    assert not cache.data and cache.events[StorageEvent.REFUSED_REMOTE_CACHE] == 3
    assert not cache.events[StorageEvent.REFUSED_NOT_OWNER]  # dropped once, counted once
    assert list(_held(storage)) == [(_key("b"), mallory)] and storage.sender_usage(mallory)[0] == 1
    # the quota applies to what the handler stores: 12 keys from one sender leave its 5 latest
    flood = [(f"fp-{i}", mallory, False) for i in range(12)]
    assert all(asyncio.run(handle(_request(flood), context)).store_ok)
    assert storage.sender_usage(mallory)[0] == 5 and storage.events[StorageEvent.EVICTED_SENDER_QUOTA] == 8
    # this node's own writes (no store RPC) are charged to no one and may fill its cache as before
    assert cache.store_subkey(_key("a"), mallory, bytes(100), T0 + 60) and not cache._senders


def test_the_quota_bounds_are_validated_and_name_the_fix() -> None:
    with pytest.raises(ValueError, match="dht_sender_entries=0; use at least 1"):
        MembershipConfig(dht_sender_entries=0)
    with pytest.raises(ValueError, match="raise dht_sender_bytes"):
        MembershipConfig(dht_sender_bytes=64 * 1024)
    with pytest.raises(ValueError, match="raise sender_bytes"):
        _budget(sender_bytes=8192)
    with pytest.raises(ValueError, match="sender_entries=0"):
        _budget(sender_entries=0)
    budget = MembershipConfig().storage_budget()
    assert (budget.sender_entries, budget.sender_bytes) == (256, 1024 * 1024)
