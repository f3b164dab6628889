"""Membership on real hivemind processes (127.0.0.1 only), its config, and the budgeted DHT storage it installs.

The storage tests are pure: hivemind's DHT clock is faked, expirations are explicit.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.proto import dht_pb2
from hivemind.utils import MSGPackSerializer

from protocol import SigningKey
from swarm.addressbook import listen_port, save_port
from swarm.dht_storage import (
    KEY_OVERHEAD_BYTES,
    REGULAR,
    STORE_SENDER,
    BudgetedStorage,
    StorageBudget,
    StorageEvent,
    _carry_over,
    _refuse_foreign,
    _without,
    entry_bytes,
    foreign_entries,
)
from swarm.errors import BootstrapFailed, PortInUse
from swarm.identity import load_or_create
from swarm.maddr import peer_address_problem
from swarm.membership import Membership, MembershipConfig, parse_peer_multiaddr

network = pytest.mark.network


def cfg(**kw: Any) -> MembershipConfig:
    return MembershipConfig(host="127.0.0.1", bootstrap_attempts=2, bootstrap_backoff_s=0.1, **kw)


@network
def test_join_uses_our_identity_and_shuts_down_in_bounded_time(tmp_path: Path) -> None:
    a_id, b_id = load_or_create(tmp_path / "a.key"), load_or_create(tmp_path / "b.key")
    with Membership(a_id, cfg(dht_storage_bytes=2 * 1024 * 1024)) as a:
        addrs = a.visible_multiaddrs()
        assert addrs and all(a_id.peer_id in m for m in addrs)
        stats = a.dht_storage_stats()  # the budgeted storage and cache run in the DHT process
        assert set(stats) == {"storage", "cache"} and stats["storage"].used_bytes == 0
        b = Membership(b_id, cfg(initial_peers=tuple(addrs))).start()
        try:
            assert b.dht is not None and b.dht.peer_id.to_base58() == b_id.peer_id
        finally:
            t0 = time.monotonic()
            b.shutdown()
            # the documented bound: loop, P2P replica and DHT process each stop within shutdown_timeout_s
            assert time.monotonic() - t0 < 3 * b.cfg.shutdown_timeout_s
        assert b.dht is None


@network
def test_unreachable_initial_peer_fails_with_a_plain_message(tmp_path: Path) -> None:
    ghost = load_or_create(tmp_path / "ghost.key").peer_id
    m = Membership(load_or_create(tmp_path / "a.key"), cfg(initial_peers=(f"/ip4/127.0.0.1/tcp/1/p2p/{ghost}",)))
    t0 = time.monotonic()
    with pytest.raises(BootstrapFailed, match="none of the initial peers answered after 2 tries"):
        m.start()
    # the documented bound: each try within startup_timeout_s, backoff doubling between tries
    c = m.cfg
    backoff = sum(c.bootstrap_backoff_s * 2**i for i in range(c.bootstrap_attempts - 1))
    assert time.monotonic() - t0 < c.bootstrap_attempts * c.startup_timeout_s + backoff


@network
def test_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        m = Membership(load_or_create(tmp_path / "a.key"), cfg(port=port))
        with pytest.raises(PortInUse, match=f"port {port}"):
            m.start()


@network
def test_a_restarted_node_keeps_the_address_it_gave_out_and_falls_back_when_its_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start` prints a multiaddr operators hand to joiners; a restart on another free port would void it."""
    key = load_or_create(tmp_path / "a.key")
    with Membership(key, cfg()) as a:
        given = a.visible_multiaddrs()
    with Membership(key, cfg()) as a:
        assert a.visible_multiaddrs() == given
        with Membership(load_or_create(tmp_path / "b.key"), cfg(initial_peers=tuple(given))) as b:
            assert b.dht is not None  # joined through the address given out before the restart
    port = int(given[0].split("/")[4])
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with Membership(key, cfg()) as a:  # the port is taken: any free one, no error
            assert a.visible_multiaddrs() != given
        monkeypatch.setattr("swarm.addressbook.port_free", lambda host, port: True)  # taken between check and bind
        with Membership(key, cfg()) as a:
            assert a.visible_multiaddrs() != given


def test_the_remembered_port_is_read_with_bounds(tmp_path: Path) -> None:
    path = tmp_path / "a.key.port"
    assert listen_port(path, "127.0.0.1", 0) == 0  # nothing remembered
    assert listen_port(path, "127.0.0.1", 4242) == 4242  # a port asked for is the port used
    save_port(path, ["/ip4/127.0.0.1/tcp/4242/p2p/12D3KooWA"])
    assert listen_port(path, "127.0.0.1", 0) == 4242
    for junk in ("70000", "-1", "x" * 100, ""):
        path.write_text(junk)
        assert listen_port(path, "127.0.0.1", 0) == 0, junk


def test_multiaddr_validation() -> None:
    with pytest.raises(ValueError, match="not a multiaddr"):
        parse_peer_multiaddr("hello")
    with pytest.raises(ValueError, match="/p2p/"):
        parse_peer_multiaddr("/ip4/127.0.0.1/tcp/5")
    with pytest.raises(ValueError, match="port 70000"):
        MembershipConfig(port=70000)


def test_every_address_the_full_parser_takes_passes_the_quick_shape_check() -> None:
    """The command line checks a --peer's shape without hivemind; it must never refuse a good address."""
    a, b = (SigningKey.generate().peer_id for _ in range(2))
    good = [
        f"/ip4/203.0.113.5/tcp/31337/p2p/{a}", f"/ip6/::1/tcp/1/p2p/{a}", f"/dns4/node.example/tcp/1/p2p/{a}",
        f"/ip4/10.0.0.1/udp/4001/quic-v1/p2p/{a}", f"/ip4/10.0.0.1/tcp/1/p2p/{a}/p2p-circuit/p2p/{b}",
    ]  # fmt: skip
    for text in good:
        parse_peer_multiaddr(text)
        assert peer_address_problem(text) is None, text
    for bad in ("garbage", "/ip4/300.1.1.1/tcp/1/p2p/x", "/ip4/1.2.3.4/tcp/99999/p2p/x", "//tcp/1", ""):
        assert peer_address_problem(bad) is not None, bad
        with pytest.raises(ValueError):
            parse_peer_multiaddr(bad)


def test_dht_bounds_are_validated_and_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"dht_key_bytes=5000000; use 8192\.\.3145728"):
        MembershipConfig(dht_key_bytes=5_000_000)
    with pytest.raises(ValueError, match="raise dht_storage_bytes"):
        MembershipConfig(dht_storage_bytes=1024)
    with pytest.raises(ValueError, match="dht_cache_keys=0; use at least 1"):
        MembershipConfig(dht_cache_keys=0)
    budget = MembershipConfig().cache_budget()
    assert budget.max_keys == 512 and budget.key_bytes == 1024 * 1024


# ---- the budgeted storage (pure: fake DHT clock, explicit expirations) ----------------------------

T0 = 1_000_000.0


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """hivemind's DHT clock (used by its storages and by ours), set by the test."""
    t = [T0]
    monkeypatch.setattr("hivemind.utils.timed_storage.get_dht_time", lambda: t[0])
    yield t


def _key(i: int | str) -> Any:
    return DHTID.generate(source=f"key-{i}")


def _peer(i: int) -> str:
    return f"12D3KooW{i:044d}"


def held_bytes(storage: DHTLocalStorage) -> int:
    """Bytes charged for what ``storage`` actually holds, computed from hivemind's containers."""
    total = 0
    for _, item in storage.items():
        if isinstance(item.value, DictionaryDHTValue):
            total += KEY_OVERHEAD_BYTES + sum(entry_bytes(s, v) for s, (v, _) in item.value.items())
        else:
            total += KEY_OVERHEAD_BYTES + entry_bytes(REGULAR, item.value)
    return total


def _budget(**kw: Any) -> StorageBudget:
    return StorageBudget(**{"total_bytes": 64 * 1024, "key_bytes": 16 * 1024, "key_subkeys": 1000, **kw})


def test_total_budget_evicts_soonest_expiring_and_stays_bounded(now: list[float]) -> None:
    s, plain = BudgetedStorage(_budget()), DHTLocalStorage()
    for i in range(200):  # 200 keys x ~1.4 KiB charged, far more than 64 KiB; expirations shuffled
        exp = T0 + 100 + (i * 37) % 200
        before = {k: item.expiration_time for k, item in s.items()}
        for storage in (s, plain):
            assert storage.store_subkey(_key(i), _peer(i), bytes(1000), exp)
        after = {k: item.expiration_time for k, item in s.items()}
        evicted = [e for k, e in before.items() if k not in after]
        others = [e for k, e in after.items() if k != _key(i)]  # the entry just stored is never the victim
        assert not evicted or max(evicted) <= min(others), i
    assert s.used_bytes <= 64 * 1024 and s.used_bytes == held_bytes(s)
    assert held_bytes(plain) > 4 * 64 * 1024  # hivemind's own storage keeps everything
    assert s.events[StorageEvent.EVICTED_BUDGET] == 200 - len(list(s.items())) > 100


def test_a_key_stays_under_its_byte_and_subkey_caps(now: list[float]) -> None:
    s = BudgetedStorage(_budget(key_subkeys=8))
    for i in range(20):
        assert s.store_subkey(_key("window"), _peer(i), bytes(100), T0 + 100 + i)
    entries = dict(s.get(_key("window")).value.items())
    assert sorted(entries) == [_peer(i) for i in range(12, 20)]  # the 8 expiring last; the newest always kept
    assert s.events[StorageEvent.EVICTED_KEY_FULL] == 12
    for i in range(20, 40):  # larger values: now the byte cap binds first
        assert s.store_subkey(_key("window"), _peer(i), bytes(3000), T0 + 100 + i)
    assert s.used_bytes <= 16 * 1024 and s.used_bytes == held_bytes(s)


def test_a_value_that_cannot_fit_a_key_is_refused(now: list[float]) -> None:
    s = BudgetedStorage(_budget())
    assert not s.store_subkey(_key(1), _peer(1), bytes(1_900_000), T0 + 864_000)
    assert not s.store(_key(2), bytes(20_000), T0 + 60)
    assert s.events[StorageEvent.REFUSED_TOO_BIG] == 2 and s.used_bytes == 0 and not list(s.items())


def test_an_older_replay_is_refused_and_cannot_make_the_newer_value_vanish(now: list[float]) -> None:
    s, key = BudgetedStorage(_budget()), _key("window")
    assert s.store_subkey(key, _peer(1), b"newer record", T0 + 300)
    assert not s.store_subkey(key, _peer(1), b"same expiration", T0 + 300)
    assert not s.store_subkey(key, _peer(1), b"older record, replayed", T0 + 10)
    assert s.events[StorageEvent.REFUSED_NOT_NEWER] == 2
    now[0] = T0 + 20  # past the replay's expiration: hivemind's TimedStorage would now drop the newer value
    held = s.get(key).value.get(_peer(1))
    assert held is not None and held.value == b"newer record"
    assert s.store_subkey(key, _peer(1), b"newest record", T0 + 301)
    assert s.get(key).value.get(_peer(1)).value == b"newest record" and s.used_bytes == held_bytes(s)


def test_a_record_another_peer_sends_is_kept_only_if_that_peer_is_its_subkey(now: list[float]) -> None:
    # one host sending records named by minted keys (a flood) gets none stored; each its own, and the node's
    # own writes (no sender), are kept; the rule off, the host stores one record per minted key
    for owners_only, kept in ((True, 2), (False, 13)):
        s, key = BudgetedStorage(_budget(owners_only=owners_only)), _key("state")
        token = STORE_SENDER.set(_peer(0))
        try:
            assert s.store_subkey(key, _peer(0), b"its own record", T0 + 60)
            stored = [s.store_subkey(key, _peer(i), b"a minted key's record", T0 + 60) for i in range(1, 11)]
            stored.append(s.store(key, b"the same, through store()", T0 + 60, subkey=_peer(11)))
        finally:
            STORE_SENDER.reset(token)
        assert s.store_subkey(key, _peer(99), b"this node's own write", T0 + 60)
        assert sum(stored) == kept - 2 and len(s.get(key).value) == kept
        assert s.events[StorageEvent.REFUSED_NOT_OWNER] == (11 if owners_only else 0)
        assert s.used_bytes == held_bytes(s)


def test_a_store_request_loses_its_foreign_entries_before_any_signature_check(now: list[float]) -> None:
    # what the store handler does before hivemind validates: entries naming another peer are dropped and
    # counted where they were bound; its own entry, a regular value and a whole dictionary go on
    own, other = _peer(1), _peer(2)
    tags = [MSGPackSerializer.dumps(own), MSGPackSerializer.dumps(other), DHTProtocol.IS_REGULAR_VALUE]
    tags += [DHTProtocol.IS_DICTIONARY, MSGPackSerializer.dumps(_peer(3))]
    request = dht_pb2.StoreRequest(
        keys=[b"k%d" % i for i in range(5)], subkeys=tags, values=[b"v%d" % i for i in range(5)],
        expiration_time=[T0 + 60] * 5, in_cache=[False, False, False, False, True],
    )  # fmt: skip
    assert foreign_entries(request, own) == {1, 4}
    kept = _without(request, {1, 4})
    assert list(kept.keys) == [b"k0", b"k2", b"k3"] and list(kept.values) == [b"v0", b"v2", b"v3"]
    assert list(kept.subkeys) == [tags[0], tags[2], tags[3]] and len(kept.in_cache) == 3
    protocol = SimpleNamespace(storage=BudgetedStorage(_budget()), cache=BudgetedStorage(_budget()))
    assert _refuse_foreign(cast(Any, protocol), request, own) == {1, 4}
    assert protocol.storage.events[StorageEvent.REFUSED_NOT_OWNER] == 1
    assert protocol.cache.events[StorageEvent.REFUSED_NOT_OWNER] == 1
    lenient = SimpleNamespace(storage=BudgetedStorage(_budget(owners_only=False)), cache=protocol.cache)
    assert _refuse_foreign(cast(Any, lenient), request, own) == {4}  # the rule off: that storage takes them


def test_expired_entries_leave_the_ledger_and_memory(now: list[float]) -> None:
    s = BudgetedStorage(_budget())
    for i in range(10):
        s.store_subkey(_key(i % 3), _peer(i), bytes(500), T0 + 10 * (i + 1))
    s.purge_expired(T0 + 55)  # the first five expired
    assert s.entries == 5 and s.used_bytes == held_bytes(s)
    assert sum(len(item.value.data) for _, item in s.data.items()) == 5  # deleted, not just hidden
    s.purge_expired(T0 + 1000)
    assert s.used_bytes == 0 and s.entries == 0 and not s.data


def test_cache_holds_at_most_max_keys_and_whole_dictionaries_are_charged(now: list[float]) -> None:
    cache = BudgetedStorage(_budget(max_keys=3))
    for i in range(5):
        found = DictionaryDHTValue()
        for j in range(3):
            found.store(_peer(j), bytes(200), T0 + 100 + i)
        assert cache.store(_key(i), found, T0 + 100 + i)  # how hivemind caches a lookup result
    assert sorted(int(k) for k in cache.data) == sorted(int(_key(i)) for i in (2, 3, 4))
    assert cache.events[StorageEvent.EVICTED_KEY_COUNT] == 6 and cache.entries == 9  # entries, 3 per key
    assert cache.used_bytes == held_bytes(cache)
    cache.store_subkey(_key(4), _peer(9), bytes(200), T0 + 500)  # an own store updates a cached dictionary
    assert cache.entries == 10 and cache.used_bytes == held_bytes(cache)


def test_ledger_matches_what_is_held_under_random_operations(now: list[float]) -> None:
    rng = random.Random(7)
    s = BudgetedStorage(_budget(total_bytes=40 * 1024, key_subkeys=6))
    for step in range(3000):
        now[0] = T0 + step * 0.1
        key, exp = _key(rng.randrange(8)), now[0] + rng.uniform(-1, 30)
        if rng.random() < 0.1:
            s.store(key, bytes(rng.randrange(1, 4000)), exp)  # a regular value replaces a dictionary
        else:
            s.store_subkey(key, _peer(rng.randrange(12)), bytes(rng.randrange(1, 4000)), exp)
        s.purge_expired(now[0])
        assert s.used_bytes == held_bytes(s) <= 40 * 1024, step
    assert len(s._heap) <= 2 * s.entries + 1024  # replaced entries do not pile up in the heap


def test_install_carries_over_what_the_dht_stored_before(now: list[float]) -> None:
    plain = DHTLocalStorage()
    plain.store_subkey(_key(1), _peer(1), b"a", T0 + 50)
    plain.store_subkey(_key(1), _peer(2), b"b", T0 + 60)
    plain.store(_key(2), b"regular", T0 + 70)
    budgeted = _carry_over(plain, BudgetedStorage(_budget()))
    assert dict(budgeted.get(_key(1)).value.items()) == dict(plain.get(_key(1)).value.items())
    assert budgeted.get(_key(2)).value == b"regular" and budgeted.used_bytes == held_bytes(budgeted)


def test_a_lookup_merging_into_what_get_returned_cannot_write_around_the_budget(now: list[float]) -> None:
    """hivemind's lookup merges other nodes' answers into the dictionary it got from local storage."""
    s = BudgetedStorage(_budget())
    s.store_subkey(_key(1), _peer(1), b"held", T0 + 50)
    found = s.get(_key(1))
    found.value.store(_peer(2), bytes(5000), T0 + 60)  # what _SearchState.add_candidate does
    assert _peer(2) not in s.data[_key(1)].value.data and s.used_bytes == held_bytes(s)
    assert s.get(_key(1)).value.get(_peer(1)).value == b"held"


def _p2pd_cmdline(dht_pid: int) -> str:
    """The command line of the p2pd daemon the DHT process ``dht_pid`` started."""
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == dht_pid and "p2pd" in cmdline:
            return cmdline
    return ""


@network
def test_a_node_serves_as_a_relay_within_its_bounds(tmp_path: Path) -> None:
    """p2pd's own relay defaults would let one peer with many keys claim gigabytes of buffers."""
    from swarm.membership import RELAY_LIMITS

    with Membership(load_or_create(tmp_path / "a.key"), cfg()) as a:
        assert a.dht is not None
        line = _p2pd_cmdline(a.dht.pid)
        assert "-relay=1" in line, line
        for flag, value in RELAY_LIMITS.items():
            assert f"-{flag}={value}" in line, line
    with Membership(load_or_create(tmp_path / "b.key"), cfg(use_relay=False)) as b:
        assert b.dht is not None
        assert "relayMaxReservations" not in _p2pd_cmdline(b.dht.pid)
