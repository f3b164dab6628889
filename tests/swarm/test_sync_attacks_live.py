"""A live sync group against a flood of streams naming random groups, over real hivemind processes on 127.0.0.1.

Mallory is an outsider built from public modules (swarm.identity, swarm.membership,
swarm.sync.wire) and hivemind: she opens 200 streams naming random group ids to an
honest sync handler, and the attacked peer's CPU is measured beside its partner's.

Measured on main before the defence (two honest peers, ``--sync-every 3``): each
stream was held for up to 60 s; with the defence switched off here, up to 15.0 s.
Ghost join records, a member asked to leave before voting and one killed before
voting are rules of the sync's rounds: they play on the simulated network
(tests/swarm/test_sync_sim_ghosts.py, test_sync_sim_rounds.py, test_sync_sim.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import psutil
import pytest
from hivemind.p2p import PeerID

from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.errors import PeerLost
from swarm.sync.wire import read_header, write_frame
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

SWARM = "test-sync"


def _mallory(swarm: FaultSwarm, first: Peer) -> Membership:
    identity = load_or_create(swarm.root / "mallory.key")
    cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=(first.info["maddrs"][0],))
    return Membership(identity, cfg)


async def _refusal_times(
    mallory: Membership, target: str, name: str, revision: int, n: int
) -> list[tuple[float, bool]]:
    """Open ``n`` streams at once, each sending a part for a random group.

    Returns, per stream, the seconds from sending to refusal and whether the refusal was an explicit
    ``ok: false`` reply (True) or the stream being closed under the sender (False: 200 streams at once
    can meet the transport's own stream limits, which refuse just as well; seen once in CI as a
    broken pipe on the first write).
    """

    async def one() -> tuple[float, bool]:
        _, reader, writer = await mallory.p2p.call_binary_stream_handler(PeerID.from_base58(target), name)
        t0 = time.monotonic()
        try:
            header = {"op": "part", "group": secrets.token_hex(16), "revision": revision, "slice": 0, "weight": 0}
            await write_frame(writer, header, b"", 5.0)
            reply = await read_header(reader, 70.0)
            assert reply.get("ok") is False, reply
            return time.monotonic() - t0, True
        except (ConnectionError, PeerLost):
            return time.monotonic() - t0, False
        finally:
            writer.close()

    return list(await asyncio.gather(*(one() for _ in range(n))))


def _cpu(peers: list[Peer]) -> list[float]:
    return [sum(psutil.Process(p.proc.pid).cpu_times()[:2]) for p in peers]


def _assert_commits(peers: list[Peer], at_least: int) -> None:
    for p in peers:
        assert p.proc.alive(), f"{p.name} exited"
        syncs = p.syncs()
        print(p.name, [(s["committed"], s["group_size"], s["reason"]) for s in syncs])
        assert sum(s["committed"] for s in syncs) >= at_least, syncs
        assert all(s["group_size"] == 2 for s in syncs if s["committed"])
    assert all(len(h) == 1 for h in hashes_by_revision(peers).values())


def test_random_group_ids_are_refused_at_once(fault_swarm: FaultSwarm) -> None:
    """200 streams name random groups at a's revision: each refused at once; a's CPU stays b's."""
    args = ("--steps", "60", "--sync-every", "3", "--timeouts", "1.5,15,2,4,6")
    a, b = fault_swarm.start_many({"a": args, "b": args})
    fp = a.info["fingerprint"]
    with _mallory(fault_swarm, a) as mallory:
        fault_swarm.go()
        a.wait_for(lambda r: r.get("committed") is True, 30.0, "a first commit")
        cpu0, t0 = _cpu([a, b]), time.monotonic()
        revision = a.syncs()[-1]["revision"]
        outcomes = mallory.run(_refusal_times(mallory, a.info["peer"], f"{SWARM}.sync.{fp}", revision, 200), 90.0)
        times = sorted(t for t, _ in outcomes)
        explicit = sum(said for _, said in outcomes)
        print(f"refused in median {times[100] * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms; {explicit} said so")
        assert explicit >= 50, explicit  # the handler itself refuses: a good share of streams get its answer
        # defence off, each stream waits out register_timeout (15.0 s); the bounds sit well below it and
        # above a loaded 2-core machine (median 0.26 s in CI, 2.26 s at a load of 12, 0.06 s idle)
        assert times[100] < 5.0 and times[-1] < 12.0, times
        n = len(a.syncs())
        # a window of several syncs and seconds: with the early close one sync can take 0.2 s, too short
        # to compare CPU over (stop 22's fresh-clone run measured 0.20 vs 0.04 cores over 0.2 s)
        window = lambda r: len(a.syncs()) > n + 2 and time.monotonic() - t0 > 5.0  # noqa: E731
        a.wait_for(window, 40.0, "three more syncs, 5 s")
        cpu1, wall = _cpu([a, b]), time.monotonic() - t0
        cores = [(x1 - x0) / wall for x0, x1 in zip(cpu0, cpu1, strict=True)]
        print(f"cores over {wall:.1f} s: attacked a {cores[0]:.3f}, b {cores[1]:.3f}")
        assert cores[0] < cores[1] + 0.1, cores
        for p in (a, b):
            final_state(p, 60.0)
    _assert_commits([a, b], at_least=8)
