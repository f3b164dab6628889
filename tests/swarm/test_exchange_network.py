"""The rollout exchange on real hivemind processes on 127.0.0.1.

Four worker processes (``swarm4``) are shared by the whole module; a victim
worker and an in-process attacker join them where a test needs one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protocol import Descriptor, SigningKey, payload_digest, seal_descriptor
from protocol.messages import DESCRIPTOR_KIND
from protocol.signing import seal
from swarm.exchange import BatchRejection, ExchangeConfig, RolloutExchange, window_key
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.payload_stream import HEADER, MAGIC, STATUS_OK
from tests.procs import Procs
from tests.swarm.workers import WorkerProc, start_workers

pytestmark = pytest.mark.network
SWARM = "test-swarm"
# the workers' bounds (tests/swarm/exchange_worker.py defaults: --fetch-timeout, --collect-timeout)
FETCH_TIMEOUT_S, COLLECT_TIMEOUT_S = 5.0, 10.0


def _publish_all(workers: list[WorkerProc], round_: int, **shape: Any) -> dict[str, dict[str, Any]]:
    for w in workers:
        w.send(cmd="publish", round=round_, **shape)
    return {w.peer_id: w.reply() for w in workers}


def _collect_all(workers: list[WorkerProc], since: float, limit: int = 16) -> dict[str, dict[str, Any]]:
    for w in workers:
        w.send(cmd="collect", since=since, limit=limit)
    return {w.peer_id: w.reply(30.0) for w in workers}


@pytest.fixture(scope="module")
def mallory(swarm4: list[WorkerProc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutExchange]:
    """An in-process peer that runs no record validator (an attacker would not)."""
    key = load_or_create(tmp_path_factory.mktemp("mallory") / "m.key")
    cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=(swarm4[0].maddr,))
    member = Membership(key, cfg).start()
    ex = RolloutExchange(member, ExchangeConfig(fetch_timeout_s=3.0, collect_timeout_s=6.0)).start()
    try:
        yield ex
    finally:
        ex.close()
        member.shutdown()


def test_every_peer_collects_the_other_three(swarm4: list[WorkerProc]) -> None:
    since = time.time() - 0.5
    published = _publish_all(swarm4, round_=1)
    results = _collect_all(swarm4, since)
    for w in swarm4:
        got = {pub: digest for pub, digest, _, _ in results[w.peer_id]["accepted"]}
        others = {p: r["digest"] for p, r in published.items() if p != w.peer_id}
        assert got == others, results[w.peer_id]
        assert results[w.peer_id]["rejected"] == [] and results[w.peer_id]["failed"] == []
    # a second collect does not fetch the same batches again
    again = swarm4[0].request(cmd="collect", since=since, limit=16)
    assert again["accepted"] == [] and again["rejected"] == []


def test_one_megabyte_payload(swarm4: list[WorkerProc]) -> None:
    since = time.time() - 0.5
    big = swarm4[0].request(cmd="publish", round=2, groups=16, completions=16, chars=4000)
    assert big["size"] > 1_000_000
    res = swarm4[1].request(cmd="collect", since=since, limit=4)
    assert [a[1] for a in res["accepted"]] == [big["digest"]], res
    assert res["failed"] == [] and res["rejected"] == [], res
    assert res["elapsed_s"] <= COLLECT_TIMEOUT_S  # the documented bound on a whole collect()
    stats = swarm4[1].request(cmd="stats")
    assert stats["bytes_in"] >= big["size"] and stats["fetch_failed"] == 0


def test_sigkilled_publisher_fails_fast_others_succeed(swarm4: list[WorkerProc], procs: Procs) -> None:
    victim = start_workers(procs, 1, first=swarm4[0], tag="victim")[0]  # reaped with `procs`
    since = time.time() - 0.5
    victim.request(cmd="publish", round=3)
    alive = _publish_all(swarm4[1:3], round_=3)
    victim.kill()
    res = swarm4[0].request(cmd="collect", since=since, limit=16)
    assert {a[1] for a in res["accepted"]} == {r["digest"] for r in alive.values()}, res
    reasons = dict(res["failed"])  # unreachable is an availability failure, not a trust failure
    assert victim.peer_id in reasons and res["rejected"] == [], res
    assert any(word in reasons[victim.peer_id] for word in ("unreachable", "timeout", "closed")), reasons
    # "fails fast" is the property under test: the dead peer fails at dial time (measured ~0.05 s)
    # instead of waiting out the fetch timeout
    assert res["elapsed_s"] < FETCH_TIMEOUT_S, res


def test_forged_descriptors_are_refused_at_store_time(mallory: RolloutExchange, swarm4: list[WorkerProc]) -> None:
    victim_id, now = swarm4[1].peer_id, time.time()
    key = window_key(SWARM, now, mallory.cfg.window_s)
    dht = mallory.membership.dht
    assert dht is not None
    own = Descriptor(mallory.peer_id, 1, "ab" * 32, 100, ("arith",), now, now + 60)
    claims_victim = Descriptor(victim_id, 1, "cd" * 32, 100, ("arith",), now, now + 60)
    attempts = {
        "own record, own subkey": (seal_descriptor(own, mallory.membership.identity.key), mallory.peer_id),
        "own record, victim's subkey": (seal_descriptor(own, mallory.membership.identity.key), victim_id),
        "forged signature": (seal(DESCRIPTOR_KIND, claims_victim, mallory.membership.identity.key), victim_id),
    }
    stored = {
        what: dht.store(key, value, now + 60, subkey=sub, exclude_self=True, return_future=True).result(10)
        for what, (value, sub) in attempts.items()
    }
    assert stored == {"own record, own subkey": True, "own record, victim's subkey": False, "forged signature": False}


def test_forged_descriptors_are_rejected_at_read_time(
    mallory: RolloutExchange, swarm4: list[WorkerProc], monkeypatch: pytest.MonkeyPatch
) -> None:
    victim_id, now, carol = swarm4[1].peer_id, time.time(), SigningKey.generate()
    mkey = mallory.membership.identity.key
    forged = seal(DESCRIPTOR_KIND, Descriptor(victim_id, 1, "cd" * 32, 100, (), now, now + 60), mkey)
    replayed = seal_descriptor(Descriptor(carol.peer_id, 1, "ef" * 32, 100, (), now - 100, now + 60), carol)
    expired = seal_descriptor(Descriptor(carol.peer_id, 1, "12" * 32, 100, (), now - 90, now - 30), carol)
    injected = [(victim_id, forged), (victim_id, replayed), (carol.peer_id, replayed), (carol.peer_id, expired)]
    monkeypatch.setattr(mallory, "_read_entries", lambda now, deadline: injected)
    res = mallory.collect(since=now - 10, limit=8)
    assert res.accepted == [] and res.seen == 4
    reasons = [r for _, r in res.rejected]
    assert [r.reason for r in reasons] == [BatchRejection.BAD_DESCRIPTOR, BatchRejection.WRONG_SUBKEY], reasons
    assert "signature" in reasons[0].detail, reasons  # replayed/expired under carol's own subkey: dropped


def test_tampered_payload_and_replayed_descriptor(
    mallory: RolloutExchange, swarm4: list[WorkerProc], batch_factory: Callable[..., Any]
) -> None:
    since = time.time() - 0.5
    desc = mallory.publish(batch_factory(mallory.peer_id, 7))
    _serve_tampered(mallory, desc)
    res = swarm4[2].request(cmd="collect", since=since, limit=16)
    assert [mallory.peer_id, "digest mismatch", ""] in res["rejected"], res
    assert all(a[0] != mallory.peer_id for a in res["accepted"])
    # replay: an old (but validly signed and unexpired) descriptor stored again is dropped by `since`
    old = Descriptor(mallory.peer_id, 6, "ab" * 32, 100, (), since - 100, since - 100 + 3500)
    key = window_key(SWARM, time.time(), mallory.cfg.window_s)
    sealed = seal_descriptor(old, mallory.membership.identity.key)
    assert mallory.membership.dht is not None
    store = mallory.membership.dht.store(key, sealed, old.expires, subkey=mallory.peer_id, return_future=True)
    assert store.result(10)  # it outlives the fresh descriptor, so it replaces it
    res = swarm4[3].request(cmd="collect", since=since, limit=16)
    assert all(p != mallory.peer_id for p, *_ in res["rejected"]), res
    assert all(a[0] != mallory.peer_id for a in res["accepted"]), res


def _serve_tampered(ex: RolloutExchange, desc: Descriptor) -> None:
    """Replace ``ex``'s handler with one that serves bytes of the right size but wrong digest."""
    bogus = b"\x00" * desc.payload_size
    assert payload_digest(bogus) != desc.payload_digest

    async def handler(_info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(64)
        writer.write(HEADER.pack(MAGIC, STATUS_OK, len(bogus)) + bogus)
        await writer.drain()
        writer.close()

    async def swap() -> None:
        await ex.membership.p2p.remove_binary_stream_handler(ex.handler_name)
        await ex.membership.p2p.add_binary_stream_handler(ex.handler_name, handler)

    ex.membership.run(swap(), 10.0)
