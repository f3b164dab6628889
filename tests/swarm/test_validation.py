"""SignedRecordValidator on constructed DHT records and on records stored by the real publishing code (no network)."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer

from protocol import Descriptor, SigningKey, codec, limits, seal_descriptor, signing
from protocol.messages import DESCRIPTOR_KIND, ROLLOUT_BATCH_KIND
from protocol.signing import seal
from swarm.exchange import ExchangeConfig, RolloutExchange, window_key
from swarm.membership import Membership, MembershipConfig
from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import RoundPlan
from swarm.sync.dhtio import MAX_STATE_READ_PAUSE_S, STATE_READ_SHARE, SyncRecords
from swarm.sync.records import (
    JOIN_KIND,
    STATE_KIND,
    VOTE_KIND,
    JoinRecord,
    StateRecord,
    join_key,
    seal_record,
    state_key,
    vote_key,
)
from swarm.validation import (
    RecordRefusal,
    SignedRecordValidator,
    dht_key,
    rollout_validator,
    swarm_record_validator,
    sync_validator,
)
from tests.swarm.exchange_worker import make_batch

ALICE, MALLORY = SigningKey(b"a" * 32), SigningKey(b"m" * 32)
SWARM, WINDOW, NOW = "test-swarm", 30.0, 1_700_000_000.0
SYNC = OuterSyncConfig()


def clock() -> float:
    return NOW


def _validator() -> SignedRecordValidator:
    v = swarm_record_validator(SWARM, WINDOW, SYNC)
    v.clock = clock
    return v


def _desc(publisher: str, created: float = NOW, ttl: float = 300.0) -> Descriptor:
    return Descriptor(publisher, 3, "ab" * 32, 1000, ("arith",), created, created + ttl)


def _record(value: object, subkey: object, key: str, expiration: float) -> DHTRecord:
    return DHTRecord(dht_key(key), MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(value), expiration)


def _desc_record(desc: Descriptor, signer: SigningKey = ALICE, **kw: Any) -> DHTRecord:
    key = kw.get("key", window_key(SWARM, desc.created, WINDOW))
    return _record(
        seal(DESCRIPTOR_KIND, desc, signer), kw.get("subkey", desc.publisher), key, kw.get("exp", desc.expires)
    )


def _refusal(v: SignedRecordValidator, record: DHTRecord) -> RecordRefusal | None:
    before = v.refused.copy()
    if v.validate(record):
        return None
    (reason,) = (v.refused - before).keys()
    return reason


def test_accepts_own_descriptor_under_own_subkey_window_and_expiry() -> None:
    v = _validator()
    assert _refusal(v, _desc_record(_desc(ALICE.peer_id))) is None
    assert v.accepted == 1 and not v.refused


def test_replay_under_the_next_window_key_is_refused() -> None:
    desc = _desc(ALICE.peer_id)
    for t in (NOW + WINDOW, NOW - WINDOW):
        assert _refusal(_validator(), _desc_record(desc, key=window_key(SWARM, t, WINDOW))) is RecordRefusal.WRONG_KEY
    other_swarm = window_key("other-swarm", NOW, WINDOW)
    assert _refusal(_validator(), _desc_record(desc, key=other_swarm)) is RecordRefusal.WRONG_KEY


def test_dht_expiration_beyond_the_signed_expiry_is_refused() -> None:
    desc = _desc(ALICE.peer_id)
    v = _validator()
    assert _refusal(v, _desc_record(desc, exp=NOW + 3600.0)) is RecordRefusal.OUTLIVES_SIGNATURE
    assert _refusal(v, _desc_record(desc, exp=desc.expires + 0.001)) is RecordRefusal.OUTLIVES_SIGNATURE
    assert _refusal(v, _desc_record(desc, exp=desc.expires)) is None
    assert _refusal(v, _desc_record(desc, exp=float("inf"))) is RecordRefusal.OUTLIVES_SIGNATURE


def test_created_beyond_the_clock_skew_is_refused() -> None:
    late = _desc(ALICE.peer_id, created=NOW + limits.MAX_CLOCK_SKEW_S + 1.0)
    assert _refusal(_validator(), _desc_record(late)) is RecordRefusal.FROM_THE_FUTURE
    near = _desc(ALICE.peer_id, created=NOW + limits.MAX_CLOCK_SKEW_S - 1.0)
    assert _refusal(_validator(), _desc_record(near)) is None


def test_garbage_and_foreign_values_are_refused() -> None:
    v, key = _validator(), "junk-0123"
    cases = {
        RecordRefusal.OVERSIZED: _record(b"\x00" * 1_900_000, "x", key, NOW + 864_000),
        RecordRefusal.NOT_OURS: _record({"some": "other value"}, "x", key, NOW + 60),
    }
    for expected, record in cases.items():
        assert _refusal(v, record) is expected
    assert _refusal(v, _record(b"\xc1 not msgpack", ALICE.peer_id, key, NOW + 60)) is RecordRefusal.NOT_OURS
    assert _refusal(v, _record(12345, None, key, NOW + 60)) is RecordRefusal.NOT_OURS
    other_kind = seal(ROLLOUT_BATCH_KIND, _desc(ALICE.peer_id), ALICE)  # a kind that is not registered
    assert _refusal(v, _record(other_kind, ALICE.peer_id, key, NOW + 60)) is RecordRefusal.NOT_OURS
    assert v.refused[RecordRefusal.NOT_OURS] == 4 and v.accepted == 0


def test_subkey_signature_and_schema_rules() -> None:
    v, desc = _validator(), _desc(ALICE.peer_id)
    key = window_key(SWARM, NOW, WINDOW)
    sealed = seal_descriptor(desc, ALICE)
    regular = DHTRecord(dht_key(key), DHTProtocol.IS_REGULAR_VALUE, MSGPackSerializer.dumps(sealed), desc.expires)
    assert _refusal(v, regular) is RecordRefusal.NO_SUBKEY
    assert _refusal(v, _desc_record(desc, subkey=MALLORY.peer_id)) is RecordRefusal.WRONG_SUBKEY
    assert _refusal(v, _desc_record(desc, MALLORY)) is RecordRefusal.BAD_RECORD  # claims Alice, signed by Mallory
    tampered = _record(sealed.replace(b"arith", b"arixh"), ALICE.peer_id, key, desc.expires)
    assert _refusal(v, tampered) is RecordRefusal.BAD_RECORD
    too_long = _desc(ALICE.peer_id, ttl=limits.MAX_DESCRIPTOR_TTL_S + 1)  # TTL beyond the protocol's limit
    assert _refusal(v, _desc_record(too_long)) is RecordRefusal.BAD_RECORD


def test_without_a_swarm_id_only_the_key_is_unchecked() -> None:
    v = rollout_validator()
    v.clock = clock
    desc = _desc(ALICE.peer_id)
    assert v.validate(_desc_record(desc, key="anything"))
    assert not v.validate(_desc_record(desc, key="anything", exp=NOW + 3600.0))
    with pytest.raises(ValueError, match="window_s"):
        rollout_validator(SWARM, 0.0)


# ---- records as the real code paths store them ------------------------------------------------


class _Done:
    def __init__(self, value: object) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> object:
        return self.value

    def cancel(self) -> None:
        pass


class _CapturingDHT:
    """Records every store (key, value, expiration, subkey); every store succeeds, every read finds nothing."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes, float, str]] = []

    def store(self, key: str, value: bytes, expiration_time: float, subkey: str, **_: Any) -> _Done:
        self.stored.append((key, value, expiration_time, subkey))
        return _Done(True)

    def get(self, key: str, **_: Any) -> _Done:
        return _Done(None)


class _P2P:
    async def add_binary_stream_handler(self, *_: Any) -> None:
        pass

    async def remove_binary_stream_handler(self, *_: Any) -> None:
        pass


def _membership(key: SigningKey) -> Any:
    return SimpleNamespace(
        identity=SimpleNamespace(key=key), peer_id=key.peer_id, cfg=MembershipConfig(swarm_id=SWARM),
        dht=_CapturingDHT(), p2p=_P2P(), run=lambda coro, timeout: asyncio.run(coro),
        visible_multiaddrs=lambda latest=False: [f"/ip4/127.0.0.1/tcp/31337/p2p/{key.peer_id}"],
    )  # fmt: skip


def _as_records(dht: _CapturingDHT) -> list[DHTRecord]:
    return [_record(value, subkey, key, exp) for key, value, exp, subkey in dht.stored]


def test_descriptors_published_by_the_exchange_are_accepted() -> None:
    member = _membership(ALICE)
    times = iter([NOW, NOW + 0.1, NOW + WINDOW - 0.01, NOW + WINDOW])  # two windows, publishes 0.1 s apart
    cfg = ExchangeConfig(window_s=WINDOW)
    ex = RolloutExchange(cast(Membership, member), cfg, clock=lambda: next(times), rng=random.Random(0)).start()
    for round_ in range(4):
        ex.publish(make_batch(ALICE.peer_id, round_))
    v = _validator()
    records = _as_records(member.dht)
    assert len(records) == 4 and [_refusal(v, r) for r in records] == [None] * 4
    assert len({r.key for r in records}) == 2


def test_sync_records_stored_by_dhtio_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    t = [NOW]
    # the DHT adapter's expiration clock, faked
    monkeypatch.setattr("swarm.sync.hivemind_transport.get_dht_time", lambda: t[0])

    def sleep(s: float) -> None:
        t[0] += max(s, 0.01)

    for cfg in (
        SYNC,
        OuterSyncConfig(matchmaking_timeout_s=1.5, allreduce_timeout_s=4.0, dht_timeout_s=4.0, record_ttl_s=60.0),
    ):
        member = _membership(ALICE)
        records = SyncRecords(cast(Membership, member), "0123456789abcdef", cfg, clock=lambda: t[0], sleep=sleep)
        assert records.publish_state(2, "cd" * 32)
        assert records.matchmake(2, "cd" * 32).status == "no partner"  # alone: joins, waits the window out
        plan = RoundPlan("ef" * 16, 2, (ALICE.peer_id, MALLORY.peer_id), 10, "none", "mean", 0.0, t[0] + 9)
        assert records.vote(plan, "ab" * 32)
        v = swarm_record_validator(SWARM, WINDOW, cfg)
        v.clock = lambda: t[0]
        stored = _as_records(member.dht)
        kinds = {codec.unpack(MSGPackSerializer.loads(r.value), 4096)["kind"] for r in stored}
        assert len(stored) == 3 and len(kinds) == 3
        assert [_refusal(v, r) for r in stored] == [None] * 3, cfg


def test_matchmaking_ends_at_once_when_the_node_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    t = [NOW]
    monkeypatch.setattr("swarm.sync.hivemind_transport.get_dht_time", lambda: t[0])

    def sleep(s: float) -> None:
        t[0] += max(s, 0.01)

    records = SyncRecords(cast(Membership, _membership(ALICE)), "0123456789abcdef", SYNC, lambda: t[0], sleep)
    polls = iter([False, False, True])  # the signal comes while the window is open: no group formed yet
    decision = records.matchmake(2, "cd" * 32, leaving=lambda: next(polls))
    assert decision.status == "leaving" and t[0] - NOW < SYNC.matchmaking_timeout_s


def test_peers_that_just_moved_to_this_state_or_the_one_left_are_expected_in_the_window() -> None:
    # a slow peer sealed out of the last window caught up to the state this peer just left (or to this
    # one) during the last round: it comes next round, so the window waits for it (the uneven-peers test's
    # first-epoch misses); one sitting there since before the last round (frozen, paused) is not waited for
    records = SyncRecords(cast(Membership, _membership(ALICE)), "0123456789abcdef", SYNC, lambda: NOW)
    h1, h2, h3 = "a1" * 32, "b2" * 32, "c3" * 32
    at = [("old", 1, h1, 0), ("slow", 2, h2, 5), ("here", 3, h3, 15), ("fork", 3, h1, 15), ("frozen", 3, h3, 5)]
    records.states = {p: StateRecord(p, "0123456789abcdef", rev, h, NOW + t) for p, rev, h, t in at}
    assert records._nearby(2, h2, NOW + 10) == ["slow"]  # a first matchmaking: any record at this state
    assert records._nearby(3, h3, NOW + 20) == ["here"]  # "frozen" moved to 3 before the last matchmaking
    records.states["slow"] = StateRecord("slow", "0123456789abcdef", 2, h2, NOW + 25)  # sealed out, caught up
    assert records._nearby(3, h3, NOW + 30) == ["slow"]  # a round at the same state
    assert records._nearby(4, h1, NOW + 40) == []  # nothing new since


class _FloodedDHT:
    """A state key holding ``entries`` records; each read costs ``per_entry_s`` of the fake clock per record."""

    def __init__(self, t: list[float], entries: dict[str, bytes], per_entry_s: float) -> None:
        self.t, self.per_entry_s, self.reads = t, per_entry_s, 0
        self.found = SimpleNamespace(value={sub: SimpleNamespace(value=v) for sub, v in entries.items()})

    def get(self, key: str, **_: Any) -> _Done:
        self.reads += 1
        self.t[0] += self.per_entry_s * len(self.found.value)
        return _Done(self.found)


def _read_share(records: int, pacing: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[float, int, int]:
    """(share of 60 s spent reading state records, reads, rounds) with a key of ``records`` minted records."""
    if not pacing:
        monkeypatch.setattr("swarm.sync.dhtio.FREE_STATE_RECORDS", 10**9)
    t = [NOW]
    keys = [SigningKey.generate() for _ in range(records)]
    made = {k: StateRecord(k.peer_id, "0123456789abcdef", 0, "ab" * 32, NOW) for k in keys}
    sealed = {k.peer_id: seal(STATE_KIND, record, k) for k, record in made.items()}
    dht = _FloodedDHT(t, sealed, 1e-3)  # 0.4 s a read, about what a full key (1,485) costs live
    member = _membership(ALICE)
    member.dht = dht
    records_ = SyncRecords(cast(Membership, member), "0123456789abcdef", SYNC, clock=lambda: t[0])
    reading, rounds = 0.0, 0
    while t[0] < NOW + 60.0:
        before, rounds = t[0], rounds + 1
        assert len(records_.read_states()) == records  # the view serves between reads
        reading += t[0] - before
        t[0] += 0.1  # the rest of a round
    return reading / (t[0] - NOW), dht.reads, rounds


def test_a_flooded_state_key_takes_a_bounded_share_of_a_peers_time(monkeypatch: pytest.MonkeyPatch) -> None:
    share, reads, _ = _read_share(400, True, monkeypatch)
    assert share <= STATE_READ_SHARE + 0.01 and reads >= 60.0 / MAX_STATE_READ_PAUSE_S, (share, reads)
    _, few_reads, rounds = _read_share(30, True, monkeypatch)  # a swarm's own records: read every round
    assert few_reads == rounds, (few_reads, rounds)
    unpaced, _, _ = _read_share(400, False, monkeypatch)  # what the pacing prevents: reads fill the rounds
    assert unpaced > 0.7, unpaced


def _state_record(exp_after: float, key: str | None = None) -> DHTRecord:
    record = StateRecord(ALICE.peer_id, "0123456789abcdef", 4, "cd" * 32, NOW)
    key = key or state_key(SWARM, "0123456789abcdef")
    return _record(seal(STATE_KIND, record, ALICE), ALICE.peer_id, key, NOW + exp_after)


def test_sync_records_are_bound_to_their_key_and_lifetime() -> None:
    v = _validator()
    assert _refusal(v, _state_record(SYNC.record_ttl_s)) is None
    assert _refusal(v, _state_record(SYNC.record_ttl_s + 5.0)) is RecordRefusal.OUTLIVES_SIGNATURE
    assert _refusal(v, _state_record(60.0, vote_key(SWARM, "0123456789abcdef", "ef" * 16))) is RecordRefusal.WRONG_KEY
    assert _refusal(v, _state_record(60.0, state_key(SWARM, "fedcba9876543210"))) is RecordRefusal.WRONG_KEY


# ---- merging ---------------------------------------------------------------------------------


def test_merge_unions_kinds_and_keeps_conflicting_rules_apart() -> None:
    a, b = rollout_validator(SWARM, WINDOW), sync_validator(SWARM, SYNC)
    assert a.merge_with(b) and set(a.rules) == {DESCRIPTOR_KIND, *b.rules} and VOTE_KIND in a.rules
    other_window = rollout_validator(SWARM, 60.0)
    before = dict(a.rules)
    assert not a.merge_with(other_window) and a.rules == before
    assert a.merge_with(rollout_validator(SWARM, WINDOW))  # equal rules merge


def test_strict_validators_registered_separately_still_accept_each_others_kinds() -> None:
    """hivemind merges validators it is given; unmerged, each strict one would refuse the other's kinds."""
    composite = CompositeValidator([rollout_validator(SWARM, WINDOW), sync_validator(SWARM, SYNC)])
    desc = _desc(ALICE.peer_id, created=time.time())  # their clock is the real one
    assert composite.validate(_desc_record(desc))
    assert not composite.validate(_record(b"junk", "x", "junk", desc.expires))


def test_a_check_that_raises_is_a_counted_refusal() -> None:
    def broken() -> float:
        raise OSError("clock gone")

    v = _validator()
    v.clock = broken
    assert not v.validate(_desc_record(_desc(ALICE.peer_id)))
    assert v.refused[RecordRefusal.BAD_RECORD] == 1


def test_an_envelope_is_verified_once_but_every_rule_of_its_record_runs_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hivemind validates every entry of every lookup reply: the signature of the same bytes is checked once."""
    import swarm.validation as validation

    opened: list[bytes] = []
    real = signing.open_envelope

    def counting(data: bytes, *args: Any) -> Any:
        opened.append(data)
        return real(data, *args)

    monkeypatch.setattr(validation, "open_envelope", counting)
    v, desc = _validator(), _desc(ALICE.peer_id)
    good = _desc_record(desc)
    for _ in range(5):
        assert _refusal(v, good) is None
    assert len(opened) == 1 and v.opened_hits == 4
    # the same (cached) envelope under another key, subkey, expiration or clock is judged afresh
    later = window_key(SWARM, NOW + WINDOW, WINDOW)
    assert _refusal(v, _desc_record(desc, key=later)) is RecordRefusal.WRONG_KEY
    assert _refusal(v, _desc_record(desc, subkey=MALLORY.peer_id)) is RecordRefusal.WRONG_SUBKEY
    assert _refusal(v, _desc_record(desc, exp=NOW + 3600.0)) is RecordRefusal.OUTLIVES_SIGNATURE
    v.clock = lambda: NOW - limits.MAX_CLOCK_SKEW_S - 1.0  # this node's clock is behind: the record is ahead
    assert _refusal(v, good) is RecordRefusal.FROM_THE_FUTURE
    assert len(opened) == 1
    # a forged envelope is remembered as forged
    forged = _desc_record(desc, MALLORY)
    assert _refusal(v, forged) is RecordRefusal.BAD_RECORD and _refusal(v, forged) is RecordRefusal.BAD_RECORD
    assert len(opened) == 2


def test_the_envelope_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import swarm.validation as validation

    monkeypatch.setattr(validation, "OPENED_CACHE", 8)
    v = _validator()
    keys = [SigningKey(bytes([i]) * 32) for i in range(20)]
    for key in keys:  # a flood of distinct genuine envelopes only evicts
        assert _refusal(v, _desc_record(_desc(key.peer_id), key)) is None
    assert len(v._opened) == 8 and v.accepted == 20


class _Records:
    """A record store in a dict (the seam of swarm.sync.transport): what is stored is read back at once."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, bytes]] = {}

    def get(self, key: str, timeout: float) -> dict[Any, Any]:
        return dict(self.values.get(key, {}))

    def store(self, key: str, subkey: str, value: bytes, ttl: float, timeout: float) -> bool:
        self.values.setdefault(key, {})[subkey] = value
        return True

    def addresses(self) -> list[str]:
        return []


def test_a_member_yields_to_its_partners_group_under_way_and_returns_when_it_commits() -> None:
    """A group of this member's history is running from its state (their window closed to joiners): the
    member opens no group that would be superseded at its vote; it waits for their commit, then returns."""
    t = [NOW]
    h2, h3, fp = "cd" * 32, "ef" * 32, "0123456789abcdef"
    partner, other = SigningKey(b"p" * 32), SigningKey(b"q" * 32)
    store = _Records()
    key = join_key(SWARM, fp, 2, h2, SYNC.compression)
    for k in (partner, other):  # their window opened 4 s ago: closed to joiners after 0.75 x 5 s
        join = JoinRecord(k.peer_id, fp, 2, h2, NOW - 4.0, NOW - 4.0)
        store.store(key, k.peer_id, seal_record(JOIN_KIND, join, k), 60.0, 1.0)

    def sleep(s: float) -> None:
        t[0] += max(s, 0.01)
        if t[0] >= NOW + 2.0:  # their commit's state record appears 2 s in
            done = StateRecord(partner.peer_id, fp, 3, h3, t[0])
            store.store(state_key(SWARM, fp), partner.peer_id, seal_record(STATE_KIND, done, partner), 60.0, 1.0)

    records = SyncRecords(cast(Membership, _membership(ALICE)), fp, SYNC, lambda: t[0], sleep, store)
    decision = records.matchmake(2, h2, trusted=frozenset({partner.peer_id}))
    assert decision.status == "yielded" and set(decision.members) == {partner.peer_id, other.peer_id}
    assert NOW + 2.0 <= t[0] <= NOW + 3.0, t[0] - NOW  # back once the commit showed, not after a window
    assert ALICE.peer_id not in store.get(key, 1.0)  # it never joined a window of its own
    # the same window of strangers only: nobody to wait for, so it opens its own
    t[0] = NOW
    stranger = SyncRecords(cast(Membership, _membership(MALLORY)), fp, SYNC, lambda: t[0], sleep, store)
    assert stranger.matchmake(2, h2, trusted=frozenset()).status == "no partner"
