"""The rollout exchange without hivemind: config, selection, verification, stream framing and pace, and
whole collects over loopback TCP with an in-memory DHT and a fake clock."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hivemind.p2p import PeerID

import swarm.selection
from protocol import Descriptor, SigningKey, open_descriptor, payload_digest, seal_batch, seal_descriptor
from protocol.messages import DESCRIPTOR_KIND
from protocol.signing import seal
from swarm.exchange import (
    BatchRejection,
    ExchangeConfig,
    OpenedCache,
    RolloutExchange,
    Selection,
    select_descriptors,
    verify_payload,
    window_key,
)
from swarm.loop import LoopThread
from swarm.membership import Membership, MembershipConfig
from swarm.payload_stream import (
    HEADER,
    MAGIC,
    STATUS_OK,
    FetchError,
    FetchFailure,
    Pace,
    error_frame,
    fetch_many,
    fetch_one,
    serve_one,
)
from swarm.reputation import Offence, Reputation, ReputationConfig
from tests.swarm.exchange_worker import make_batch

A, B, C = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3))
NOW = 1_000_000.0


def _desc(key: SigningKey, created: float, digest: str = "ab" * 32, ttl: float = 300.0) -> Descriptor:
    return Descriptor(key.peer_id, 1, digest, 100, ("arith",), created, created + ttl)


def _entry(key: SigningKey, created: float, digest: str = "ab" * 32) -> tuple[str, bytes]:
    return key.peer_id, seal_descriptor(_desc(key, created, digest), key)


def _select(entries: list[tuple[Any, Any]], **kw: Any) -> Selection:
    args: dict[str, Any] = dict(own=A.peer_id, now=NOW, since=0.0, fetched=set(), limit=10, reputation=Reputation())
    args.update(kw)
    seed = args.pop("rng_seed", 0)
    return select_descriptors(entries, rng=random.Random(seed), **args)


def _digests(sel: Selection) -> set[str]:
    return {d.payload_digest[0] for d in sel.chosen}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window_s", 0),
        ("descriptor_ttl_s", 5000),
        ("max_served", 0),
        ("chunk_bytes", 10),
        ("min_rate_bps", 0),
        ("first_byte_timeout_s", -1),
        ("max_future_s", 500),
    ],
)
def test_config_rejects_bad_values_with_the_fix(field: str, value: float) -> None:
    bad: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        ExchangeConfig(**bad)


def test_window_key_is_time_bucketed() -> None:
    assert window_key("s", 61.0, 30.0) == "s:rollouts:2"


def test_select_drops_own_stale_and_fetched() -> None:
    entries = [
        _entry(A, NOW - 1, "a" * 64),  # own
        _entry(B, NOW - 5, "b" * 64),
        _entry(C, NOW - 2, "c" * 64),
        (B.peer_id, seal_descriptor(_desc(B, NOW - 400, "d" * 64), B)),  # expired
    ]
    sel = _select(entries)
    assert _digests(sel) == {"b", "c"} and sel.rejected == []
    assert _digests(_select(entries, since=NOW - 3)) == {"c"}
    assert _digests(_select(entries, fetched={(C.peer_id, "c" * 64)})) == {"b"}
    assert _digests(_select(entries, fetched={(B.peer_id, "c" * 64)})) == {"b", "c"}  # tried from B, not C
    assert len(_select(entries, limit=1).chosen) == 1


def test_select_rejects_forgeries_with_reasons() -> None:
    forged = seal(DESCRIPTOR_KIND, _desc(B, NOW - 1), C)  # claims B, signed by C
    entries = [
        (B.peer_id, forged),
        (B.peer_id, seal_descriptor(_desc(C, NOW - 1), C)),  # C's record under B's subkey
        (C.peer_id, b"garbage"),
        (C.peer_id, 42),
    ]
    sel = _select(entries)
    assert sel.chosen == []
    reasons = [r.reason for _, r in sel.rejected]
    assert reasons == [BatchRejection.BAD_DESCRIPTOR, BatchRejection.WRONG_SUBKEY] + [BatchRejection.BAD_DESCRIPTOR] * 2
    assert "signature" in sel.rejected[0][1].detail


def test_select_draws_unknown_publishers_at_random() -> None:
    keys = [SigningKey(bytes([i]) * 32) for i in range(10, 20)]
    entries = [_entry(k, NOW - 1, f"{i:064x}") for i, k in enumerate(keys)]
    orders = {tuple(d.publisher for d in _select(entries, rng_seed=seed).chosen) for seed in range(5)}
    assert len(orders) > 1


def _known_good(*keys: SigningKey) -> Reputation:
    rep = Reputation(ReputationConfig(exploration_slots=2))
    for k in keys:
        rep.judge(k.peer_id, NOW - 60, accepted=4, informative=2, refused=0)
    return rep


def _flood(n: int, created: float) -> list[tuple[str, bytes]]:
    """``n`` fresh keys, two descriptors each (as if under the current and the previous window key)."""
    out = []
    for i in range(n):
        key = SigningKey(i.to_bytes(4, "big") + b"\x07" * 28)
        out += [_entry(key, created, f"{i:060x}aaaa"), _entry(key, created - 1, f"{i:060x}bbbb")]
    return out


def test_future_dated_flood_is_refused_and_does_not_displace_known_good() -> None:
    honest = [_entry(B, NOW - 20, "b" * 64), _entry(C, NOW - 25, "c" * 64)]
    flood = _flood(300, NOW + 100)  # inside the protocol's 120 s skew, outside the exchange's 30 s
    sel = _select(flood + honest, limit=8, reputation=_known_good(B, C))
    assert _digests(sel) == {"b", "c"}
    assert len(sel.rejected) == 600
    assert {r.reason for _, r in sel.rejected} == {BatchRejection.FUTURE_DATED}


def test_flood_of_unknown_keys_gets_the_exploration_slots_only() -> None:
    honest = [_entry(B, NOW - 20, "b" * 64), _entry(C, NOW - 25, "c" * 64)]
    flood = _flood(300, NOW + 5)  # newer than the honest ones, within the skew: newness buys nothing
    for seed in range(5):
        sel = _select(flood + honest, limit=8, reputation=_known_good(B, C), rng_seed=seed)
        assert [d.publisher for d in sel.chosen[:2]] in ([B.peer_id, C.peer_id], [C.peer_id, B.peer_id])
        assert len(sel.chosen) == 4 and sel.rejected == []  # 2 known-good + the 2 exploration slots
        assert len({d.publisher for d in sel.chosen}) == 4  # one descriptor per publisher


def test_one_descriptor_per_publisher_its_freshest_untried() -> None:
    entries = [_entry(B, NOW - 30, "1" * 64), _entry(B, NOW - 10, "2" * 64), _entry(B, NOW - 20, "3" * 64)]
    assert _digests(_select(entries)) == {"2"}
    assert _digests(_select(entries, fetched={(B.peer_id, "2" * 64)})) == {"3"}


def test_banned_publishers_are_skipped_unopened_and_counted() -> None:
    rep = _known_good(C)
    for _ in range(2):
        rep.penalize(B.peer_id, Offence.DIGEST_MISMATCH, NOW - 5)
    assert rep.banned(B.peer_id, NOW) is Offence.DIGEST_MISMATCH
    entries = [_entry(B, NOW - 1, "b" * 64), (B.peer_id, b"garbage"), _entry(C, NOW - 1, "c" * 64)]
    sel = _select(entries, reputation=rep)
    assert _digests(sel) == {"c"} and sel.rejected == [] and sel.skipped_banned == 1
    after = NOW + rep.cfg.ban_s  # the ban is over: B is poor, so fetched last
    later = _select([_entry(B, after - 1, "d" * 64), _entry(C, after - 1, "e" * 64)], reputation=rep, now=after)
    assert [d.payload_digest[0] for d in later.chosen] == ["e", "d"] and later.skipped_banned == 0


def test_verify_payload(batch_factory: Callable[..., Any]) -> None:
    batch = batch_factory(B.peer_id, 4)
    payload = seal_batch(batch, B)
    desc = Descriptor(B.peer_id, 4, payload_digest(payload), len(payload), ("arith",), NOW, NOW + 60)
    assert verify_payload(desc, payload) == batch
    flipped = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(ValueError, match="digest mismatch"):
        verify_payload(desc, flipped)
    other_round = Descriptor(B.peer_id, 5, desc.payload_digest, len(payload), (), NOW, NOW + 60)
    with pytest.raises(ValueError, match="round mismatch"):
        verify_payload(other_round, payload)
    # bytes that match the digest but are signed by someone else than they claim
    forged = seal("rollout-batch", batch, C)
    fdesc = Descriptor(B.peer_id, 4, payload_digest(forged), len(forged), (), NOW, NOW + 60)
    with pytest.raises(ValueError, match="bad signature"):
        verify_payload(fdesc, forged)


class _TcpP2P:
    """Stands in for hivemind's P2P: opens a plain loopback TCP stream to a server."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def call_binary_stream_handler(self, _peer: Any, _name: str) -> tuple[None, Any, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return None, reader, writer


async def _roundtrip(served: dict[str, bytes], digest: str, expected: int) -> bytes:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_one(reader, writer, served.get, 4096)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        coro = fetch_one(_TcpP2P(port), B.peer_id, "h", digest, expected, 4096)
        return await asyncio.wait_for(coro, 5.0)
    finally:
        server.close()


def test_stream_framing_roundtrip_and_errors() -> None:
    payload = bytes(range(256)) * 1000
    digest = payload_digest(payload)
    assert asyncio.run(_roundtrip({digest: payload}, digest, len(payload))) == payload
    with pytest.raises(FetchError, match="unknown digest"):
        asyncio.run(_roundtrip({}, digest, len(payload)))
    with pytest.raises(FetchError, match="too large"):
        asyncio.run(_roundtrip({digest: payload}, digest, len(payload) - 1))
    with pytest.raises(FetchError, match="size mismatch"):
        asyncio.run(_roundtrip({digest: payload}, digest, len(payload) + 1))


def test_fetch_from_nowhere_is_unreachable() -> None:
    class Dead:
        async def call_binary_stream_handler(self, _p: Any, _n: str) -> Any:
            raise ConnectionRefusedError("dial failed")

    with pytest.raises(FetchError, match="peer unreachable"):
        asyncio.run(fetch_one(Dead(), B.peer_id, "h", "0" * 64, 10, 4096))


# ---- pace: silent and dribbling publishers ---------------------------------------------------

QUICK = Pace(dial_timeout_s=0.5, first_byte_timeout_s=0.3, min_rate_bps=64 * 1024, grace_s=0.3)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _silent(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    """Accepts the stream and the request, never answers (until the client gives up)."""
    await reader.read()


def _dribbler(payload: bytes, step: int = 64, every_s: float = 0.05) -> Handler:
    """Serves ``payload`` correctly, but at ``step / every_s`` bytes per second (1.3 KB/s by default)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(64)
        writer.write(HEADER.pack(MAGIC, STATUS_OK, len(payload)))
        for start in range(0, len(payload), step):
            writer.write(payload[start : start + step])
            await writer.drain()
            await asyncio.sleep(every_s)

    return handle


async def _timed_fetch(handler: Handler, size: int, pace: Pace) -> tuple[bytes | FetchError, float]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t0 = time.monotonic()
    try:
        got: bytes | FetchError = await fetch_one(_TcpP2P(port), B.peer_id, "h", "0" * 64, size, 4096, pace)
    except FetchError as e:
        got = e
    finally:
        server.close()
    return got, time.monotonic() - t0


def test_silent_publisher_is_cut_at_the_first_byte_timeout() -> None:
    got, took = asyncio.run(_timed_fetch(_silent, 5000, QUICK))
    assert isinstance(got, FetchError) and got.kind is FetchFailure.TOO_SLOW, got
    assert "no response within 0.3 s" in got.reason
    assert 0.25 < took < 2.5, took  # half the 5 s fetch timeout that would bound it without the cut


def test_dribbling_publisher_is_cut_below_the_minimum_rate() -> None:
    payload = bytes(50_000)
    got, took = asyncio.run(_timed_fetch(_dribbler(payload), len(payload), QUICK))
    assert isinstance(got, FetchError) and got.kind is FetchFailure.TOO_SLOW, got
    assert "below 65536 B/s" in got.reason
    # the whole fetch timeout would have let it run 5 s (38 s to finish); pace cuts it after the grace
    assert 0.25 < took < 2.5, took


def test_a_publisher_that_keeps_pace_is_not_cut() -> None:
    payload = bytes(range(256)) * 40  # 10 KB in 160 writes of 64 B at 64 KB/s: inside 0.3 s + 10 KB / 64 KiB/s
    got, _ = asyncio.run(_timed_fetch(_dribbler(payload, every_s=0.001), len(payload), QUICK))
    assert got == payload


def test_pace_deadlines() -> None:
    pace = Pace(dial_timeout_s=2.0, first_byte_timeout_s=1.0, min_rate_bps=1000.0, grace_s=1.0)
    assert pace.budget_s(5000) == 9.0
    assert pace.body_deadline(100.0, 0) == 101.0 and pace.body_deadline(100.0, 2000) == 103.0


def test_fetch_many_does_not_wait_on_a_straggler() -> None:
    payload = bytes(range(256)) * 100
    digest = payload_digest(payload)

    async def run() -> tuple[dict[tuple[str, str], bytes | FetchError], float]:
        async def honest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve_one(reader, writer, {digest: payload}.get, 4096)
            writer.close()

        servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (honest, _silent)]
        p2p = _Routed({k.peer_id: s.sockets[0].getsockname()[1] for k, s in zip((B, C), servers, strict=True)})
        t0 = time.monotonic()
        wanted = [(B.peer_id, digest, len(payload)), (C.peer_id, "f" * 64, 100)]
        got = await fetch_many(p2p, "h", wanted, budget_s=10.0, parallel=8, chunk_bytes=4096, pace=QUICK)
        for s in servers:
            s.close()
        return got, time.monotonic() - t0

    got, took = asyncio.run(run())
    assert got[(B.peer_id, digest)] == payload
    silent = got[(C.peer_id, "f" * 64)]
    assert isinstance(silent, FetchError) and silent.kind is FetchFailure.TOO_SLOW
    assert took < 2.5, took  # the straggler is cut at its first-byte timeout (0.3 s), not the 10 s budget


# ---- a whole collect() on loopback streams, a fake clock and an in-memory DHT ----------------


class _Routed:
    """Stands in for hivemind's P2P: a loopback TCP stream to each publisher's own server."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports

    async def call_binary_stream_handler(self, peer: PeerID, _name: str) -> tuple[None, Any, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[peer.to_base58()])
        return None, reader, writer

    async def list_peers(self) -> list[Any]:
        return []


class _Loopback:
    """Stands in for Membership: a real loop thread, the routed streams above, a one-window DHT."""

    def __init__(self) -> None:
        self.identity = SimpleNamespace(key=A)
        self.cfg = MembershipConfig(swarm_id="unit", host="127.0.0.1")
        self.loop = LoopThread("unit-exchange")
        self.p2p = _Routed({})
        self.dht = self
        self.records: dict[str, Any] = {}  # subkey -> sealed descriptor
        self.hits: Counter[str] = Counter()

    @property
    def peer_id(self) -> str:
        return A.peer_id

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        return self.loop.run(coro, timeout)

    def get(self, key: str, latest: bool, return_future: bool) -> concurrent.futures.Future[Any]:
        current = key == window_key("unit", NOW, 30.0)
        items = {sub: SimpleNamespace(value=v) for sub, v in self.records.items()}
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(SimpleNamespace(value=items) if current else None)
        return fut

    def announce(self, key: SigningKey, round_: int, handler: Callable[[bytes], Handler]) -> str:
        """Publish a fresh batch of ``key``'s, served by ``handler(payload)``; returns its digest."""
        payload = seal_batch(make_batch(key.peer_id, round_, created=NOW - 5), key)
        digest = payload_digest(payload)
        desc = Descriptor(key.peer_id, round_, digest, len(payload), ("arith",), NOW - 5, NOW + 300)
        self.records[key.peer_id] = seal_descriptor(desc, key)
        serve = handler(payload)

        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits[key.peer_id] += 1
            try:
                await serve(reader, writer)
            finally:
                writer.close()

        async def start() -> int:
            server = await asyncio.start_server(counted, "127.0.0.1", 0)
            return int(server.sockets[0].getsockname()[1])

        self.p2p.ports[key.peer_id] = self.loop.run(start(), 5.0)
        return digest

    def squat(self, key: SigningKey, victim: SigningKey, handler: Handler) -> None:
        """Announce, signed by ``key``, the digest and size of ``victim``'s descriptor, served by ``handler``."""
        theirs = open_descriptor(self.records[victim.peer_id])
        desc = Descriptor(key.peer_id, theirs.round, theirs.payload_digest, theirs.payload_size, ("arith",),
                          NOW - 4, NOW + 300)  # fmt: skip
        self.records[key.peer_id] = seal_descriptor(desc, key)

        async def start() -> int:
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            return int(server.sockets[0].getsockname()[1])

        self.p2p.ports[key.peer_id] = self.loop.run(start(), 5.0)


def _honest(payload: bytes) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_one(reader, writer, {payload_digest(payload): payload}.get, 4096)

    return handle


def _tampered(payload: bytes) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(64)
        writer.write(HEADER.pack(MAGIC, STATUS_OK, len(payload)) + bytes(len(payload)))
        await writer.drain()

    return handle


@pytest.fixture
def loopback() -> Iterator[_Loopback]:
    lb = _Loopback()
    try:
        yield lb
    finally:
        lb.loop.stop(2.0)


HONEST, LIAR, SILENT, SLOW = (SigningKey(bytes([i]) * 32) for i in (40, 41, 42, 43))


def test_collect_cuts_slow_and_silent_once_and_never_refetches_a_bad_digest(loopback: _Loopback) -> None:
    cfg = ExchangeConfig(
        dial_timeout_s=0.5, first_byte_timeout_s=0.3, rate_grace_s=0.3, reputation=ReputationConfig(exploration_slots=4)
    )
    ex = RolloutExchange(cast(Membership, loopback), cfg, clock=lambda: NOW, rng=random.Random(0))
    loopback.announce(HONEST, 1, _honest)
    loopback.announce(LIAR, 1, _tampered)
    loopback.announce(SILENT, 1, lambda _p: _silent)
    loopback.announce(SLOW, 1, _dribbler)
    first = ex.collect(since=NOW - 60, limit=8)
    assert [d.publisher for d, _ in first.accepted] == [HONEST.peer_id]
    assert [(p, r.reason) for p, r in first.rejected] == [(LIAR.peer_id, BatchRejection.DIGEST_MISMATCH)]
    reasons = dict(first.failed)
    assert set(reasons) == {SILENT.peer_id, SLOW.peer_id} and all(r.startswith("too slow") for r in reasons.values())
    assert first.elapsed_s < 2.5, first.elapsed_s  # cut after 0.3 s + 0.3 s grace; the fetch timeout is 5 s
    hits = dict(loopback.hits)
    again = [ex.collect(since=NOW - 60, limit=8) for _ in range(2)]
    for res in again:  # nothing tried before is fetched again: no stream, no wait
        assert (res.accepted, res.rejected, res.failed) == ([], [], []), res
        assert res.elapsed_s < 0.2, res.elapsed_s
    assert dict(loopback.hits) == hits == dict.fromkeys((HONEST.peer_id, LIAR.peer_id, SILENT.peer_id, SLOW.peer_id), 1)
    assert ex.stats()["fetch_too_slow"] == 2
    assert ex.reputation_summary() == {"tracked": 4, "banned": 0, "bans_by_reason": {}}


def test_a_publisher_that_lies_twice_is_banned_and_skipped(loopback: _Loopback) -> None:
    ex = RolloutExchange(cast(Membership, loopback), clock=lambda: NOW, rng=random.Random(0))
    loopback.announce(HONEST, 1, _honest)
    loopback.announce(LIAR, 1, _tampered)
    ex.collect(since=NOW - 60, limit=8)
    ex.judge(HONEST.peer_id, accepted=2, informative=1, refused=0)
    loopback.announce(LIAR, 2, _tampered)  # a new digest: poor, so fetched only in a free slot
    second = ex.collect(since=NOW - 60, limit=8)
    assert [(p, r.reason) for p, r in second.rejected] == [(LIAR.peer_id, BatchRejection.DIGEST_MISMATCH)]
    assert ex.reputation_summary() == {"tracked": 2, "banned": 1, "bans_by_reason": {"digest or size mismatch": 1}}
    loopback.announce(LIAR, 3, _tampered)
    third = ex.collect(since=NOW - 60, limit=8)
    assert third.skipped_banned == 1 and third.rejected == [] and loopback.hits[LIAR.peer_id] == 2


def test_future_dated_descriptors_are_refused_and_penalised(loopback: _Loopback) -> None:
    ex = RolloutExchange(cast(Membership, loopback), clock=lambda: NOW, rng=random.Random(0))
    ahead = Descriptor(LIAR.peer_id, 1, "ab" * 32, 100, ("arith",), NOW + 100, NOW + 400)
    loopback.records[LIAR.peer_id] = seal_descriptor(ahead, LIAR)
    res = [ex.collect(since=NOW - 60, limit=8) for _ in range(4)]
    assert [[r.reason for _, r in x.rejected] for x in res[:3]] == [[BatchRejection.FUTURE_DATED]] * 3
    assert res[3].rejected == [] and res[3].skipped_banned == 1  # 3 offences of 3.0: banned at -9
    assert ex.reputation_summary()["bans_by_reason"] == {"future-dated descriptor": 1}
    assert loopback.hits[LIAR.peer_id] == 0


def test_each_dht_entry_is_opened_once_across_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    # a flood of validly signed descriptors is read every round: its signatures are checked once, not every round
    opens = Counter[str]()
    real = open_descriptor

    def counting(value: bytes) -> Descriptor:
        opens["n"] += 1
        return real(value)

    monkeypatch.setattr(swarm.selection, "open_descriptor", counting)
    keys = [SigningKey.generate() for _ in range(50)]
    entries: list[tuple[Any, Any]] = [_entry(k, NOW - 1, f"{i:064x}") for i, k in enumerate(keys)]
    entries.append((keys[0].peer_id, b"not a descriptor"))
    cache = OpenedCache(capacity=1000)
    first = _select(entries, opened=cache)
    for _ in range(4):
        again = _select(entries, opened=cache)
        assert [d.payload_digest for d in again.chosen] or not first.chosen
        assert [r.reason for _, r in again.rejected] == [BatchRejection.BAD_DESCRIPTOR]
    assert opens["n"] == len(entries)
    small = OpenedCache(capacity=10)
    _select(entries, opened=small)
    assert len(small) == 10  # bounded


async def _unknown_digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readexactly(64)
    writer.write(error_frame(f"unknown digest {request[:12].decode()}"))
    await writer.drain()
    writer.close()


def _header_too_long(size: int) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(64)
        writer.write(HEADER.pack(MAGIC, STATUS_OK, size + 1))
        await writer.drain()
        writer.close()

    return handle


SQUATTER = SigningKey(bytes([44]) * 32)


@pytest.mark.parametrize("answer", ["unknown digest", "header one byte too long"])
def test_a_peer_that_names_anothers_digest_neither_censors_nor_gets_it_charged(
    loopback: _Loopback, answer: str
) -> None:
    """A squatter signs a descriptor of its own with an honest publisher's digest and size: each fetch goes
    to the publisher that signed the descriptor, so the honest batch arrives and only the squatter pays."""
    for seed in range(8):  # the order in which the two are chosen is random: every order must hold
        loopback.records.clear()
        digest = loopback.announce(HONEST, 1, _honest)
        size = open_descriptor(loopback.records[HONEST.peer_id]).payload_size
        handler = _unknown_digest if answer == "unknown digest" else _header_too_long(size)
        loopback.squat(SQUATTER, HONEST, handler)
        cfg = ExchangeConfig(reputation=ReputationConfig(exploration_slots=4))
        ex = RolloutExchange(cast(Membership, loopback), cfg, clock=lambda: NOW, rng=random.Random(seed))
        res = ex.collect(since=NOW - 60, limit=8)
        assert [(d.publisher, d.payload_digest) for d, _ in res.accepted] == [(HONEST.peer_id, digest)], (seed, res)
        assert [p for p, _ in res.failed] == [SQUATTER.peer_id], (seed, res)
        rep = ex._reputation
        assert rep.score(HONEST.peer_id, NOW) > 0 and rep.score(SQUATTER.peer_id, NOW) <= 0, seed
