"""A state-download flood against a live sync pair, over real hivemind processes on 127.0.0.1.

Mallory is an outsider built from public modules (swarm.identity, swarm.membership,
swarm.sync.wire, swarm.sync.allreduce) and hivemind. She opens 48 streams to an
honest member's sync handler at once, asks each for the state and never reads
(``swarm.sync.serving`` bounds what that costs), then asks once more and reads;
then 6 more keys of hers (P2P hosts without a DHT) ask 8 times each.

Measured before the budget (issue 51): each ask built its own copy of the state
and held it while every chunk's drain waited out ``chunk_timeout_s``: +18-20 MB
of resident memory per ask on a 1.75M-parameter model, +1.9 GB for 96 asks.
Here (2.1M parameters, 16.9 MB of state): +36-65 MB with either flood, 1 and 4
served; with the budget off and the copy per ask back: +960-966 MB, 48 of 48 served.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import torch
from hivemind.p2p import P2P, PeerID

from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.config import SyncAborted
from swarm.sync.hivemind_transport import HivemindStreams
from swarm.sync.wire import read_header, write_frame
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [
    pytest.mark.network,
    pytest.mark.timeout(150),
    pytest.mark.filterwarnings("ignore:path is deprecated:DeprecationWarning"),  # hivemind's P2P.create
]

SWARM = "test-sync"
ARCH = "1024,1024,1024,8"
N_PARAMS = 2 * (1024 * 1024 + 1024) + 1024 * 8 + 8
STATE_MB = 8 * N_PARAMS / 1e6
"""Anchor and momentum, float32: 16.9 MB."""
ASKS = 48
SYBILS = 6
"""Keys of Mallory's that ask at once in the second flood: more than the budget, so it is what binds."""
SERVES = 4
"""OuterSyncConfig.max_state_serves's default: the budget the growth is bounded by."""
SLACK_MB = 64.0
"""The honest pair's own rounds (parts, replies, allocator) move a member's memory by tens of MB."""
HOLD_S = 12.0
"""How long Mallory holds her streams: past the honest member's state deadline (8.4 s for this model)."""


def _mallory(swarm: FaultSwarm, first: Peer) -> Membership:
    identity = load_or_create(swarm.root / "mallory.key")
    cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=(first.info["maddrs"][0],))
    return Membership(identity, cfg)


def _rss_mb(pid: int) -> float:
    """Resident memory of the worker and its children (its DHT process, its p2pd), MB."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 1e6


async def _flood(p2ps: list[P2P], target: str, name: str, per: int, hold_s: float) -> dict[str, int]:
    """Ask ``target`` for its state on ``per`` streams from each of ``p2ps`` at once, read nothing for
    ``hold_s``, then tally the replies."""
    peer = PeerID.from_base58(target)

    async def ask(p2p: P2P) -> tuple[Any, Any]:
        _, reader, writer = await p2p.call_binary_stream_handler(peer, name)
        await write_frame(writer, {"op": "state"}, b"", 5.0)
        return reader, writer

    streams = await asyncio.gather(*(ask(p2p) for p2p in p2ps for _ in range(per)))
    await asyncio.sleep(hold_s)
    tally: dict[str, int] = {}
    for reader, writer in streams:
        try:
            reply = await read_header(reader, 1.0)
            what = "served" if reply.get("ok") else str(reply.get("error"))
        except Exception as e:  # a stream the honest side cut: what the tally says is enough
            what = type(e).__name__
        finally:
            writer.close()
        tally[what] = tally.get(what, 0) + 1
    return tally


class _Flood(threading.Thread):
    """Runs :func:`_flood` on Mallory's loop while the worker's peak memory is sampled."""

    def __init__(self, mallory: Membership, p2ps: list[P2P], a: Peer, name: str, per: int) -> None:
        super().__init__(daemon=True)
        self.m, self.p2ps, self.a, self.name, self.per = mallory, p2ps, a, name, per
        self.tally: dict[str, int] = {}
        self.peak = _Peak(a.proc.pid)

    def run(self) -> None:
        self.peak.start()
        try:
            self.tally = self.m.run(_flood(self.p2ps, self.a.info["peer"], self.name, self.per, HOLD_S), 60.0)
        finally:
            self.peak.halt.set()
            self.peak.join(5.0)


@contextlib.contextmanager
def _sybils(mallory: Membership, swarm: FaultSwarm, a: Peer, n: int) -> Iterator[list[P2P]]:
    """``n`` more P2P hosts of Mallory's, each its own key, connected to ``a`` (no DHT: streams are enough)."""
    p2ps: list[P2P] = []
    try:
        for i in range(n):
            key = load_or_create(swarm.root / f"sybil{i}.key")
            create = P2P.create(
                identity_path=str(key.path), initial_peers=[a.info["maddrs"][0]], check_if_identity_free=False
            )
            p2ps.append(mallory.run(create, 30.0))
        yield p2ps
    finally:
        for p2p in p2ps:
            with contextlib.suppress(Exception):
                mallory.run(p2p.shutdown(), 10.0)


def _fetch(mallory: Membership, target: str, name: str) -> Snapshot:
    """Mallory's own download that reads: what any newcomer's catch-up does (hash and finiteness checked)."""
    unused = Snapshot(0, "", torch.zeros(0), torch.zeros(0))
    service = SyncService(HivemindStreams(mallory.p2p), name, mallory.peer_id, 10.0, lambda: unused)
    got: Snapshot = mallory.run(service.fetch_state(target, N_PARAMS, 30.0), 40.0)
    return got


def _commits(p: Peer) -> int:
    return sum(1 for s in p.syncs() if s["committed"])


def _sample(pid: int, seconds: float) -> float:
    """The largest resident memory seen over ``seconds``."""
    peak, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, _rss_mb(pid))
        time.sleep(0.2)
    return peak


class _Peak(threading.Thread):
    """The largest resident memory of a worker seen until stopped, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.halt = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self.peak = max(self.peak, _rss_mb(self.pid))


def _check_flood(flood: _Flood, before: float, served: int) -> None:
    growth = flood.peak.peak - before
    print(f"rss before {before:.0f} MB, peak {flood.peak.peak:.0f} MB: +{growth:.0f} MB ({STATE_MB:.1f} MB a state)")
    print(f"replies to the flood: {flood.tally}")
    assert growth < SERVES * STATE_MB + SLACK_MB, growth  # defence off: +960-966 MB
    assert flood.tally.get("served", 0) <= served and sum(flood.tally.values()) == ASKS, flood.tally


def _sybil_flood(mallory: Membership, swarm: FaultSwarm, a: Peer, name: str) -> None:
    """The same 48 asks from 6 keys: the budget in all (4) binds, not the one per key."""
    with _sybils(mallory, swarm, a, SYBILS) as p2ps:
        before, commits0 = _sample(a.proc.pid, 2.0), _commits(a)
        flood = _Flood(mallory, p2ps, a, name, ASKS // SYBILS)
        flood.start()
        flood.join(30.0)
        print(f"{SYBILS} keys, commits during it: {_commits(a) - commits0}")
        _check_flood(flood, before, served=SERVES)  # defence off: 48 served
        assert flood.tally.get("served", 0) == SERVES, flood.tally
        assert _commits(a) - commits0 >= 2


def test_a_flood_of_stalled_state_downloads_costs_the_budget_not_a_copy_per_ask(fault_swarm: FaultSwarm) -> None:
    """48 asks that never read, from one key and then from 6: a's memory grows by at most 4 states + slack,
    the pair commits throughout, a reader is served once the stalled asks are cut off."""
    halt = fault_swarm.root / "halt"
    args: tuple[str, ...] = ("--arch", ARCH, "--steps", "100000", "--sync-every", "3", "--halt-file", str(halt))
    args += ("--timeouts", "1.5,15,2,4,6,10")  # chunk_timeout_s 10 s (the default): a stall is held that long
    a, b = fault_swarm.start_many({"a": args, "b": args})
    name = f"{SWARM}.sync.{a.info['fingerprint']}"
    with _mallory(fault_swarm, a) as mallory:
        fault_swarm.go()
        a.wait_for(lambda r: r.get("committed") is True, 40.0, "a first commit")
        before, commits0 = _sample(a.proc.pid, 4.0), _commits(a)
        flood = _Flood(mallory, [mallory.p2p], a, name, ASKS)
        flood.start()
        time.sleep(2.0)  # every ask is in: the budget's slot for Mallory is taken
        try:  # by a stalled ask: a second one of hers, though it reads, is refused
            refused = f"served rev {_fetch(mallory, a.info['peer'], name).revision}"
        except SyncAborted as e:
            refused = e.reason
        flood.join(30.0)
        commits1 = _commits(a)
        got = _fetch(mallory, a.info["peer"], name)  # the stalled asks are over: a reader is served at once
        print(f"a second ask during it: {refused}; commits during it: {commits1 - commits0}; after: rev {got.revision}")
        _check_flood(flood, before, served=1)  # defence off: 48 served
        assert "a state download to this peer is under way" in refused, refused  # defence off: served
        assert commits1 - commits0 >= 2, (commits0, commits1)
        assert got.revision >= 1 and got.anchor.numel() == N_PARAMS
        _sybil_flood(mallory, fault_swarm, a, name)
    halt.touch()
    for p in (a, b):
        final_state(p, 60.0)
        assert p.proc.alive(), f"{p.name} exited"
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values())
