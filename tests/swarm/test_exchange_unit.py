"""Pure parts of the rollout exchange: config, selection, verification, stream framing."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from protocol import Descriptor, SigningKey, payload_digest, seal_batch, seal_descriptor
from protocol.messages import DESCRIPTOR_KIND
from protocol.signing import seal
from swarm.exchange import BatchRejection, ExchangeConfig, Refusal, select_descriptors, verify_payload, window_key
from swarm.payload_stream import FetchError, fetch_one, serve_one

A, B, C = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3))
NOW = 1_000_000.0


def _desc(key: SigningKey, created: float, digest: str = "ab" * 32, ttl: float = 300.0) -> Descriptor:
    return Descriptor(key.peer_id, 1, digest, 100, ("arith",), created, created + ttl)


def _entry(key: SigningKey, created: float, digest: str = "ab" * 32) -> tuple[str, bytes]:
    return key.peer_id, seal_descriptor(_desc(key, created, digest), key)


def _select(entries: list[tuple[Any, Any]], **kw: Any) -> tuple[list[Descriptor], list[tuple[str, Refusal]]]:
    args: dict[str, Any] = dict(own=A.peer_id, now=NOW, since=0.0, fetched=set(), limit=10)
    args.update(kw)
    return select_descriptors(entries, rng=random.Random(0), **args)


@pytest.mark.parametrize(
    ("field", "value"),
    [("window_s", 0), ("descriptor_ttl_s", 5000), ("max_served", 0), ("chunk_bytes", 10)],
)
def test_config_rejects_bad_values_with_the_fix(field: str, value: float) -> None:
    bad: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        ExchangeConfig(**bad)


def test_window_key_is_time_bucketed() -> None:
    assert window_key("s", 61.0, 30.0) == "s:rollouts:2"


def test_select_drops_own_stale_and_fetched_newest_first() -> None:
    entries = [
        _entry(A, NOW - 1, "a" * 64),  # own
        _entry(B, NOW - 5, "b" * 64),
        _entry(C, NOW - 2, "c" * 64),
        (B.peer_id, seal_descriptor(_desc(B, NOW - 400, "d" * 64), B)),  # expired
    ]
    chosen, rejected = _select(entries)
    assert [d.payload_digest[0] for d in chosen] == ["c", "b"] and rejected == []
    chosen, _ = _select(entries, since=NOW - 3)
    assert [d.payload_digest[0] for d in chosen] == ["c"]
    chosen, _ = _select(entries, fetched={"c" * 64})
    assert [d.payload_digest[0] for d in chosen] == ["b"]
    assert len(_select(entries, limit=1)[0]) == 1


def test_select_rejects_forgeries_with_reasons() -> None:
    forged = seal(DESCRIPTOR_KIND, _desc(B, NOW - 1), C)  # claims B, signed by C
    entries = [
        (B.peer_id, forged),
        (B.peer_id, seal_descriptor(_desc(C, NOW - 1), C)),  # C's record under B's subkey
        (C.peer_id, b"garbage"),
        (C.peer_id, 42),
    ]
    chosen, rejected = _select(entries)
    assert chosen == []
    reasons = [r.reason for _, r in rejected]
    assert reasons == [BatchRejection.BAD_DESCRIPTOR, BatchRejection.WRONG_SUBKEY] + [BatchRejection.BAD_DESCRIPTOR] * 2
    assert "signature" in rejected[0][1].detail


def test_select_ties_are_shuffled_by_the_rng() -> None:
    keys = [SigningKey(bytes([i]) * 32) for i in range(10, 20)]
    entries = [_entry(k, NOW - 1, f"{i:064x}") for i, k in enumerate(keys)]
    orders = {tuple(d.publisher for d in _select_seeded(entries, 3, seed)) for seed in range(5)}
    assert len(orders) > 1


def _select_seeded(entries: list[tuple[Any, Any]], limit: int, seed: int) -> list[Descriptor]:
    return select_descriptors(entries, own="", now=NOW, since=0, fetched=set(), limit=limit, rng=random.Random(seed))[0]


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
