"""A member that gives up on an all-reduce tells its partners (swarm/sync/notices.py).

Real hivemind P2P daemons on 127.0.0.1, each serving a real :class:`SyncService`, run rounds of one plan.
A member whose streams to the owners close after it served its own slice (a test transport,
:class:`_LosingStreams`: what a daemon that resets fresh streams under load does) gives up at once;
its partners, waiting for its parts, would end the round only at its deadline, which with the
deadline longer than the sync period costs the group the next epochs too. A peer outside the group,
or a notice naming another revision, ends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import torch
from hivemind.p2p import P2P

from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot, SyncService
from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.errors import PeerLost
from swarm.sync.hivemind_transport import HivemindStreams
from swarm.sync.notices import MAX_EARLY, EarlyNotices, cause_of, notice, worth_telling
from swarm.sync.points import RoundPoint
from swarm.sync.transport import Handler, Opened

N = 50_000
DEADLINE_S = 20.0
"""Each round's deadline: the time partners waited for a member that gave up silently."""


def _snapshot() -> Snapshot:
    zero = torch.zeros(N)
    return Snapshot(0, "0" * 64, zero, zero)


class _LosingStreams(HivemindStreams):
    """Streams that, while ``losing``, close each stream to an owner for a part (as a reset stream does)
    once this member has served its own slice to its ``partners``: they then wait for its parts."""

    def __init__(self, p2p: P2P, partners: int) -> None:
        super().__init__(p2p)
        self.losing, self._partners = True, partners
        self._parts = self._served = 0

    def observe(self, point: RoundPoint, revision: int) -> None:
        if point is RoundPoint.SEND and self.losing:  # the stream the service opens next carries a part
            self._parts += 1

    async def serve(self, name: str, handler: Handler) -> None:
        async def counted(sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(sender, reader, writer)
            finally:
                self._served += 1

        await super().serve(name, counted)

    async def open(self, peer: str, name: str) -> Opened:
        if not self._parts:
            return await super().open(peer, name)
        self._parts -= 1
        end = time.monotonic() + DEADLINE_S
        while self._served < self._partners and time.monotonic() < end:
            await asyncio.sleep(0.01)
        raise PeerLost("stream closed before a frame header")


@contextlib.asynccontextmanager
async def _services(n: int, losing: bool = False) -> AsyncIterator[list[SyncService]]:
    """``n`` connected daemons, each with a stream-only service (the first daemon bootstraps the others);
    with ``losing``, the last one's streams are :class:`_LosingStreams`."""
    first = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    seeds = [str(m) for m in await first.get_visible_maddrs()]
    p2ps = [first] + [await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=seeds) for _ in range(n - 1)]
    services = []
    for k, p2p in enumerate(p2ps):
        streams = _LosingStreams(p2p, n - 1) if losing and k == n - 1 else HivemindStreams(p2p)
        observe = streams.observe if isinstance(streams, _LosingStreams) else None
        me = p2p.peer_id.to_base58()
        services.append(SyncService(streams, "test.sync", me, 5.0, _snapshot, observe=observe))
    try:
        for s in services:
            await s.start()
        yield services
    finally:
        for s in services:
            await s.stop()
        for p2p in reversed(p2ps):
            await p2p.shutdown()
            child = getattr(p2p, "_child", None)  # see tests/swarm/test_sync_direct.py
            if child is not None:
                child._transport.close()


def _plan(members: Sequence[SyncService], revision: int = 0) -> RoundPlan:
    names = tuple(sorted(s._me for s in members))
    return RoundPlan("g" * 32, revision, names, N, "none", "mean", 0.2, time.time() + DEADLINE_S)


def _expect_each_other(services: Sequence[SyncService], revision: int = 0) -> None:
    for s in services:
        s.expect(revision, [o._me for o in services if o is not s])


async def _rounds(services: Sequence[SyncService], plan: RoundPlan) -> list[Any]:
    """Every service runs ``plan``; (result or the SyncAborted it raised, seconds it took) per service."""

    async def one(s: SyncService, k: int) -> tuple[Any, float]:
        t0 = time.monotonic()
        try:
            return await s.allreduce(plan, torch.full((N,), float(k)), 3), time.monotonic() - t0
        except SyncAborted as e:
            return e, time.monotonic() - t0

    return list(await asyncio.gather(*(one(s, k) for k, s in enumerate(services))))


async def _send_notice(sender: SyncService, to: SyncService, header: dict[str, Any]) -> bool:
    """Whether ``to`` took ``header`` from ``sender`` (its answer's ``ok``)."""
    return await sender.ask(to._me, header)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 90.0))


@pytest.mark.process
def test_partners_of_a_member_that_gives_up_end_the_round_at_once() -> None:
    """c serves its own slice to a and b, then its streams to both owners close before its parts went out:
    a and b end the round in seconds, not at its 20 s deadline (defence off: both wait it out and end on
    an all-reduce timeout). The next round, without the fault, gives the same bits everywhere."""

    async def body() -> None:
        async with _services(3, losing=True) as services:
            _expect_each_other(services)
            outcome = await _rounds(services, _plan(services))
            c_streams = services[2]._streams
            assert isinstance(c_streams, _LosingStreams)
            c_streams.losing = False
            _expect_each_other(services, 1)
            after = await _rounds(services, _plan(services, 1))
        shown = [(type(r).__name__, getattr(r, "cause", ""), round(t, 2)) for r, t in outcome]
        print("round with c's lost streams:", shown)
        (ra, ta), (rb, tb), (rc, _) = outcome
        assert isinstance(rc, SyncAborted) and rc.cause is AbortCause.PEER_LOST, rc
        for r in (ra, rb):
            assert isinstance(r, SyncAborted) and r.cause is not AbortCause.ALLREDUCE_TIMEOUT, r
        assert max(ta, tb) < DEADLINE_S / 2, (ta, tb)
        assert any(isinstance(r, SyncAborted) and r.cause is AbortCause.ABORTED_BY_MEMBER for r in (ra, rb)), outcome
        results = [r for r, _ in after]
        assert all(isinstance(r, AllReduceResult) for r in results), results
        assert all(r.average.tobytes() == results[0].average.tobytes() for r in results)

    _run(body)


@pytest.mark.process
def test_a_notice_from_outside_the_group_or_for_another_revision_ends_nothing() -> None:
    """While a waits for b's parts, a stranger (its own daemon and key, in no group) and b itself (naming
    another revision, and a group a has not registered) send a notice naming the round: each is refused,
    and the round commits once b runs it (defence off: any of them would end it)."""

    async def body() -> None:
        async with _services(3) as (a, b, stranger):
            pair = [a, b]
            plan = _plan(pair)
            _expect_each_other(pair)
            first = asyncio.ensure_future(a.allreduce(plan, torch.ones(N), 3))
            while plan.group_id not in a._rounds:
                await asyncio.sleep(0.01)
            gid, cause = plan.group_id, AbortCause.PEER_LOST
            assert not await _send_notice(stranger, a, notice(gid, 0, cause))
            assert not await _send_notice(b, a, notice(gid, 1, cause))
            assert not await _send_notice(b, a, notice("h" * 32, 1, cause))
            assert not await _send_notice(stranger, a, {"op": "abort", "group": [1, 2], "revision": 0})
            second = await b.allreduce(plan, torch.zeros(N), 3)
            got = await first
        assert isinstance(got, AllReduceResult) and isinstance(second, AllReduceResult)
        assert got.average.tobytes() == second.average.tobytes()

    _run(body)


@pytest.mark.process
def test_a_notice_before_the_round_is_registered_ends_it_at_registration() -> None:
    """a's DHT reads finish later than c's: c's notice arrives while a still matchmakes (it read c's join
    record), and a's round then fails at once; a notice from a peer a did not read is refused."""

    async def body() -> None:
        async with _services(3) as (a, b, c):
            plan = _plan([a, b, c])
            a.expect(0, [c._me])  # read c's join record only
            assert await _send_notice(c, a, notice(plan.group_id, 0, AbortCause.BAD_BYTES))
            assert not await _send_notice(b, a, notice(plan.group_id, 0, AbortCause.BAD_BYTES))
            t0 = time.monotonic()
            with pytest.raises(SyncAborted) as failed:
                await a.allreduce(plan, torch.ones(N), 3)
            assert failed.value.cause is AbortCause.ABORTED_BY_MEMBER, failed.value
            assert time.monotonic() - t0 < DEADLINE_S / 2

    _run(body)


def test_who_tells_and_what_a_notice_may_name() -> None:
    assert worth_telling(AbortCause.BAD_BYTES, 5.0)
    assert not worth_telling(AbortCause.ABORTED_BY_MEMBER, 5.0)  # a notice does not echo around the group
    assert not worth_telling(AbortCause.PEER_LOST, 0.1)  # at the deadline everyone ends the round anyway
    assert cause_of(notice("g", 0, AbortCause.PEER_LOST)) == "peer lost"
    assert cause_of({"cause": "x" * 4000}) == cause_of({"cause": 7}) == cause_of({}) == "unknown"


def test_early_notices_are_bounded_and_only_a_members_counts() -> None:
    early = EarlyNotices()
    for k in range(3 * MAX_EARLY):  # a flood of notices for groups never registered
        early.keep(f"group-{k}", f"peer-{k % 7}", "peer lost")
    assert len(early) == MAX_EARLY
    assert early.take("group-0", ["peer-0"]) is None  # the oldest went first
    last = 3 * MAX_EARLY - 1
    assert early.take(f"group-{last}", ["someone-else"]) is None  # not a member of that round
    assert early.take(f"group-{last}", [f"peer-{last % 7}"]) is None  # taken (and forgotten) just above
    early.keep("g", "m", "bad bytes")
    assert early.take("g", ["x", "m"]) == ("m", "bad bytes")
