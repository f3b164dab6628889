"""Live sync groups against ghosts, floods and a crash, over real hivemind processes on 127.0.0.1.

Mallory is an outsider built from public modules (swarm.identity, swarm.membership,
swarm.sync.records, swarm.sync.wire, protocol.signing) and hivemind. She reads the
honest join records and, in every gather window they open, signs join records for
keys that never come online (ghosts), fixed ones or fresh ones every window, the
latter ground to the lowest peer ids so that they would fill ``max_group_size``.
Or she opens 200 streams naming random group ids to an honest sync handler.

Measured on main before these defences (two honest peers, ``--sync-every 3``):
ghosts: 20 honest sync attempts, 0 commits in 45 s; a member SIGKILLed after the
all-reduce: the others waited for the vote deadline (70 s with the default
timeouts); random group ids: each stream was held for up to 60 s. With each
defence switched off here: fixed ghosts 2 of 8 rounds committed, fresh low-id
ghosts 0 of 8 ("not in group"), the dead member's round took 18.5 s (vote
deadline), random group ids were held up to 15.0 s.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

import psutil
import pytest
from hivemind.p2p import PeerID
from hivemind.utils.timed_storage import get_dht_time

from protocol import SigningKey
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.errors import PeerLost
from swarm.sync.records import (
    JOIN_KIND,
    STATE_KIND,
    JoinRecord,
    StateRecord,
    join_key,
    open_records,
    seal_record,
    state_key,
)
from swarm.sync.wire import read_header, write_frame
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

SWARM = "test-sync"


def _mallory(swarm: FaultSwarm, first: Peer) -> Membership:
    identity = load_or_create(swarm.root / "mallory.key")
    cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=(first.info["maddrs"][0],))
    return Membership(identity, cfg)


def _lowest_keys(n: int, tries: int = 64) -> list[SigningKey]:
    """``n`` fresh keys ground for low peer ids (the group takes the lowest ids first)."""
    return sorted((SigningKey.generate() for _ in range(tries)), key=lambda k: k.peer_id)[:n]


class Ghosts(threading.Thread):
    """Signs ghost join records into every honest gather window Mallory reads, until stopped."""

    def __init__(self, mallory: Membership, fp: str, fresh: bool, n: int = 3) -> None:
        super().__init__(daemon=True)
        self.m, self.fp, self.fresh, self.n = mallory, fp, fresh, n
        self.keys = _lowest_keys(n)
        self.windows: set[float] = set()
        self.ghosts: set[str] = set()
        self.halt = threading.Event()

    def _get(self, key: str) -> dict[Any, Any]:
        assert self.m.dht is not None
        found = self.m.dht.get(key, latest=True)
        return {} if found is None else {k: v.value for k, v in found.value.items()}

    def _poison(self) -> None:
        raw = self._get(state_key(SWARM, self.fp))
        states, _ = open_records(raw, STATE_KIND, StateRecord.from_wire, lambda r: None, time.time())
        for revision, state in {(r.revision, r.state_hash) for r in states.values()}:
            key = join_key(SWARM, self.fp, revision, state)
            joins, _ = open_records(self._get(key), JOIN_KIND, JoinRecord.from_wire, lambda r: None, time.time())
            for window in {r.window_start for p, r in joins.items() if p not in self.ghosts} - self.windows:
                self.windows.add(window)
                keys = _lowest_keys(self.n) if self.fresh else self.keys
                for k in keys:
                    record = JoinRecord(k.peer_id, self.fp, revision, state, window, time.time())
                    assert self.m.dht is not None
                    self.m.dht.store(key, seal_record(JOIN_KIND, record, k), get_dht_time() + 60, subkey=k.peer_id)
                    self.ghosts.add(k.peer_id)

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self._poison()


def _ghost_run(swarm: FaultSwarm, fresh: bool, *extra: str) -> tuple[list[Peer], Ghosts]:
    args = ("--steps", "24", "--sync-every", "3", *extra)
    a, b = swarm.start_many({"a": args, "b": args})
    with _mallory(swarm, a) as mallory:
        ghosts = Ghosts(mallory, a.info["fingerprint"], fresh)
        ghosts.start()
        t0 = time.monotonic()
        swarm.go()
        try:
            for p in (a, b):
                final_state(p, 55.0)
        finally:
            ghosts.halt.set()
            ghosts.join(10.0)
        print(f"{len(ghosts.ghosts)} ghosts in {len(ghosts.windows)} windows; 8 syncs in {time.monotonic() - t0:.1f} s")
    return [a, b], ghosts


def _assert_commits(peers: list[Peer], at_least: int) -> None:
    for p in peers:
        assert p.proc.alive(), f"{p.name} exited"
        syncs = p.syncs()
        print(p.name, [(s["committed"], s["group_size"], s["reason"]) for s in syncs])
        assert sum(s["committed"] for s in syncs) >= at_least, syncs
        assert all(s["group_size"] == 2 for s in syncs if s["committed"])
    assert all(len(h) == 1 for h in hashes_by_revision(peers).values())


def _assert_ghosts_met(swarm: FaultSwarm, at_least: int) -> None:
    """The attack reached honest windows: rounds in which a or b left ghosts out."""
    logs = (swarm.root / "a.log").read_text() + (swarm.root / "b.log").read_text()
    met = logs.count("did not answer a ping")
    print(f"rounds that met ghosts: {met}")
    assert met >= at_least, met


def test_fixed_ghosts_never_join_a_group(fault_swarm: FaultSwarm) -> None:
    """Three keys that never come online join every window: every honest round still commits."""
    peers, _ = _ghost_run(fault_swarm, fresh=False)
    _assert_commits(peers, at_least=7)  # defence off: 0 of 8 (all-reduce fails on the ghosts)
    _assert_ghosts_met(fault_swarm, at_least=4)


def test_fresh_low_id_ghosts_every_window(fault_swarm: FaultSwarm) -> None:
    """New ghost keys, ground to low ids, in every window, with max_group_size 2: still every round commits."""
    peers, ghosts = _ghost_run(fault_swarm, True, "--max-group", "2")
    assert len(ghosts.ghosts) >= 3 * 4, len(ghosts.ghosts)
    _assert_commits(peers, at_least=7)
    _assert_ghosts_met(fault_swarm, at_least=4)


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
        # defence off, each stream waits out register_timeout (15.0 s); the bounds sit far below it and far
        # above a loaded 2-core CI run (median 0.26 s there, 0.06 s on an idle machine)
        assert times[100] < 2.0 and times[-1] < 7.5, times
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


def test_a_member_asked_to_leave_before_voting_ends_the_round_for_everyone(fault_swarm: FaultSwarm) -> None:
    """c is asked to leave right after its second all-reduce: it votes abort, and nobody applies that round.

    A node asked to leave by a signal to its process group has lost its p2pd: had it voted and read its
    (now local, stale) votes, it could commit while its partners, seeing no vote and no ping answer,
    abort: both forks of a 30-minute chaos run. Defence off (c votes its digest): all three commit it.
    """
    timeouts = ("--timeouts", "1.5,15,2,4,6")
    specs = {n: ("--steps", "12", *timeouts) for n in "ab"}
    a, b, c = fault_swarm.start_many({**specs, "c": ("--steps", "12", *timeouts, "--fault", "allreduced:1:leave")})
    fault_swarm.go()
    for p in (a, b, c):
        final_state(p, 60.0)
        assert p.proc.alive(), f"{p.name} exited"
    second = [next(r for r in p.syncs() if r["step"] == 8) for p in (a, b, c)]
    print("round c left in:", [(r["committed"], r["group_size"], r["cause"], round(r["sync_s"], 2)) for r in second])
    assert all(r["group_size"] == 3 and not r["committed"] for r in second), second
    assert second[2]["cause"] == "shutting down", second[2]
    later = [[r for r in p.syncs() if r["step"] > 8] for p in (a, b)]
    assert all(r["committed"] and r["group_size"] == 2 for rs in later for r in rs), later
    assert all(len(h) == 1 for h in hashes_by_revision([a, b, c]).values())


def test_member_killed_before_voting(fault_swarm: FaultSwarm) -> None:
    """c dies right after its second all-reduce, before voting: a and b end that round within seconds."""
    timeouts = ("--timeouts", "1.5,15,2,4,6")  # vote deadline: w + 1.5 + 15 + 2
    specs = {n: ("--steps", "12", *timeouts) for n in "ab"}
    a, b, c = fault_swarm.start_many({**specs, "c": ("--steps", "12", *timeouts, "--fault", "allreduced:1:stop")})
    fault_swarm.go()
    c.wait_for(lambda r: r.get("event") == "phase", 30.0, "the fault")
    c.kill()
    for p in (a, b):
        final_state(p, 60.0)
        assert p.proc.alive(), f"{p.name} exited"
    second = [next(r for r in p.syncs() if r["step"] == 8) for p in (a, b)]
    print("round with the dead member:", [(r["committed"], r["cause"], round(r["sync_s"], 2)) for r in second])
    assert all(not r["committed"] and r["sync_s"] < 2.0 + 5.0 for r in second), second  # defence off: ~18.5 s
    assert any(r["cause"] == "member lost before voting" for r in second), second
    later = [[r for r in p.syncs() if r["step"] > 8] for p in (a, b)]
    assert all(r["committed"] and r["group_size"] == 2 for rs in later for r in rs), later
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values())
