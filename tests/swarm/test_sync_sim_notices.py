"""A member that gives up on an all-reduce tells its partners (swarm/sync/notices.py), on the simulated network.

Real :class:`SyncService` instances, one per member, run rounds of one plan over tests/simnet.py's
streams on one virtual clock: no daemons, and a 20 s deadline costs no wall time. A member whose
streams to the owners close after it served its own slice (:class:`_LosingStreams`: what a daemon
that resets fresh streams under load does) gives up at once; its partners, waiting for its parts,
would end the round only at its deadline, which with the deadline longer than the sync period costs
the group the next epochs too. A peer outside the group, or a notice naming another revision, ends
nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import torch

from protocol import SigningKey
from swarm.sync.allreduce import AllReduceResult, RoundPlan, Snapshot, SyncService
from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.errors import PeerLost
from swarm.sync.notices import notice
from swarm.sync.points import RoundPoint
from swarm.sync.transport import Handler, Opened
from tests.simnet import SimNet, SimStreams, VirtualLoop, one_cpu

N = 50_000
DEADLINE_S = 20.0
"""Each round's deadline: the time partners waited for a member that gave up silently."""


def _snapshot() -> Snapshot:
    zero = torch.zeros(N)
    return Snapshot(0, "0" * 64, zero, zero)


class _LosingStreams(SimStreams):
    """Streams that, while ``losing``, close each stream to an owner for a part (as a reset stream does)
    once this member has served its own slice to its ``partners``: they then wait for its parts."""

    def __init__(self, net: SimNet, me: str, partners: int) -> None:
        super().__init__(net, me)
        self._loop = net.loop
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
        end = self._loop.time() + DEADLINE_S
        while self._served < self._partners and self._loop.time() < end:
            await asyncio.sleep(0.01)  # virtual: the served slices arrive on the same clock
        raise PeerLost("stream closed before a frame header")


def _services(net: SimNet, n: int, losing: bool = False) -> list[SyncService]:
    """``n`` members on ``net``, each with a stream-only service; with ``losing``, the last one's streams are
    :class:`_LosingStreams`."""
    services = []
    for k in range(n):
        me = SigningKey(hashlib.sha256(f"m{k}".encode()).digest()).peer_id
        streams = net.add(me).streams
        if losing and k == n - 1:
            streams = _LosingStreams(net, me, n - 1)
        observe = streams.observe if isinstance(streams, _LosingStreams) else None
        services.append(SyncService(streams, "test.sync", me, 5.0, _snapshot, net.clock, observe=observe))
    return services


def _plan(net: SimNet, members: Sequence[SyncService], revision: int = 0) -> RoundPlan:
    names = tuple(sorted(s._me for s in members))
    return RoundPlan("g" * 32, revision, names, N, "none", "mean", 0.2, net.clock() + DEADLINE_S)


def _expect_each_other(services: Sequence[SyncService], revision: int = 0) -> None:
    for s in services:
        s.expect(revision, [o._me for o in services if o is not s])


async def _rounds(net: SimNet, services: Sequence[SyncService], plan: RoundPlan) -> list[tuple[Any, float]]:
    """Every service runs ``plan``; (result or the SyncAborted it raised, virtual seconds it took) per service."""

    async def one(s: SyncService, k: int) -> tuple[Any, float]:
        t0 = net.loop.time()
        try:
            return await s.allreduce(plan, torch.full((N,), float(k)), 3), net.loop.time() - t0
        except SyncAborted as e:
            return e, net.loop.time() - t0

    return list(await asyncio.gather(*(one(s, k) for k, s in enumerate(services))))


async def _send_notice(sender: SyncService, to: SyncService, header: dict[str, Any]) -> bool:
    """Whether ``to`` took ``header`` from ``sender`` (its answer's ``ok``)."""
    return await sender.ask(to._me, header)


async def _cancel_the_rest() -> None:
    left = asyncio.all_tasks() - {asyncio.current_task()}
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


def _run(n: int, body: Callable[[SimNet, list[SyncService]], Awaitable[None]], losing: bool = False) -> None:
    """``body`` on ``n`` started services of a fresh simulated network (stopped afterwards)."""
    loop = VirtualLoop()

    async def main() -> None:
        net = SimNet(loop)
        services = _services(net, n, losing)
        try:
            for s in services:
                await s.start()
            await body(net, services)
        finally:
            for s in services:
                await s.stop()

    try:
        with one_cpu():
            loop.run_until_complete(asyncio.wait_for(main(), 600.0))  # virtual seconds
    finally:
        loop.run_until_complete(_cancel_the_rest())  # a failed body's rounds: ended, as asyncio.run ends them
        loop.close()


def test_partners_of_a_member_that_gives_up_end_the_round_at_once() -> None:
    """c serves its own slice to a and b, then its streams to both owners close before its parts went out:
    a and b end the round in seconds, not at its 20 s deadline (defence off: both wait it out and end on
    an all-reduce timeout). The next round, without the fault, gives the same bits everywhere."""

    async def body(net: SimNet, services: list[SyncService]) -> None:
        _expect_each_other(services)
        outcome = await _rounds(net, services, _plan(net, services))
        c_streams = services[2]._streams
        assert isinstance(c_streams, _LosingStreams)
        c_streams.losing = False
        _expect_each_other(services, 1)
        after = await _rounds(net, services, _plan(net, services, 1))
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

    _run(3, body, losing=True)


def test_a_notice_from_outside_the_group_or_for_another_revision_ends_nothing() -> None:
    """While a waits for b's parts, a stranger (its own key, in no group) and b itself (naming another
    revision, and a group a has not registered) send a notice naming the round: each is refused, and the
    round commits once b runs it (defence off: any of them would end it)."""

    async def body(net: SimNet, services: list[SyncService]) -> None:
        a, b, stranger = services
        pair = [a, b]
        plan = _plan(net, pair)
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

    _run(3, body)


def test_a_notice_before_the_round_is_registered_ends_it_at_registration() -> None:
    """a's record reads finish later than c's: c's notice arrives while a still matchmakes (it read c's join
    record), and a's round then fails at once (defence off: it waits for the parts until the deadline); a
    notice from a peer a did not read is refused."""

    async def body(net: SimNet, services: list[SyncService]) -> None:
        a, b, c = services
        plan = _plan(net, [a, b, c])
        a.expect(0, [c._me])  # read c's join record only
        assert await _send_notice(c, a, notice(plan.group_id, 0, AbortCause.BAD_BYTES))
        assert not await _send_notice(b, a, notice(plan.group_id, 0, AbortCause.BAD_BYTES))
        t0 = net.loop.time()
        with pytest.raises(SyncAborted) as failed:
            await a.allreduce(plan, torch.ones(N), 3)
        assert failed.value.cause is AbortCause.ABORTED_BY_MEMBER, failed.value
        assert net.loop.time() - t0 < DEADLINE_S / 2

    _run(3, body)
