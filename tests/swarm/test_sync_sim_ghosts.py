"""Live sync groups against ghosts, on the simulated network.

Mallory is a member of the network that runs no sync: she reads the honest join records and, in
every gather window they open, signs join records for keys that never come online (ghosts), fixed
ones or fresh ones every window, the latter ground to the lowest peer ids so that they would fill
``max_group_size``. Her records are signed by the simulation's scheme under each ghost's own key,
so they verify as any member's do: only the liveness filter (a joiner is a member only if it
answered its ping, :mod:`swarm.sync.liveness`) keeps them out. Measured over real processes before
the defence: 0 commits in 20 honest sync attempts.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from protocol import SigningKey
from swarm.fingerprint import model_fingerprint, sync_fingerprint
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
from tests.simnet import SimNet
from tests.swarm.test_sync_sim import CFG, WALL_S, Member, Plan, _histories, _model, simulate

SWARM = "sim"
"""The swarm id of tests/swarm/test_sync_sim.py's members."""
MALLORY = "mallory"
GHOST_TTL_S = 60.0
SYNCS = 8
"""Each honest member's syncs (the daemon test's: 24 steps, a sync every 3)."""


def _keys(start: int) -> Iterator[SigningKey]:
    """Fresh keys, one after another (seeded: a scenario replays)."""
    n = start
    while True:
        yield SigningKey(hashlib.sha256(f"ghost-{n}".encode()).digest())
        n += 1


class Ghosts:
    """Signs ghost join records into every honest gather window Mallory reads (a task on the loop)."""

    def __init__(self, net: SimNet, fresh: bool, n: int = 3) -> None:
        self.net, self.fresh, self.n = net, fresh, n
        self.fp = sync_fingerprint(model_fingerprint(_model()), CFG.rule())
        self._keys = _keys(0)
        self.fixed = self._lowest()
        self.windows: set[float] = set()
        self.ghosts: set[str] = set()

    def _lowest(self, tries: int = 64) -> list[SigningKey]:
        """``n`` fresh keys ground for low peer ids (the group takes the lowest ids first)."""
        return sorted((next(self._keys) for _ in range(tries)), key=lambda k: k.peer_id)[: self.n]

    def _states(self) -> list[StateRecord]:
        raw = self.net.read(MALLORY, state_key(SWARM, self.fp))
        now, sig = self.net.clock(), self.net.signatures
        return list(
            open_records(raw, STATE_KIND, StateRecord.from_wire, lambda r: None, now, signatures=sig)[0].values()
        )

    def _joins(self, key: str) -> list[JoinRecord]:
        raw = self.net.read(MALLORY, key)
        now, sig = self.net.clock(), self.net.signatures
        return list(open_records(raw, JOIN_KIND, JoinRecord.from_wire, lambda r: None, now, signatures=sig)[0].values())

    def poison(self) -> None:
        for revision, state in {(r.revision, r.state_hash) for r in self._states()}:
            key = join_key(SWARM, self.fp, revision, state)
            for window in {r.window_start for r in self._joins(key) if r.peer not in self.ghosts} - self.windows:
                self.windows.add(window)
                for k in self._lowest() if self.fresh else self.fixed:
                    record = JoinRecord(k.peer_id, self.fp, revision, state, window, self.net.clock())
                    sealed = seal_record(JOIN_KIND, record, k, self.net.signatures)
                    self.net.put(MALLORY, key, k.peer_id, sealed, GHOST_TTL_S)
                    self.ghosts.add(k.peer_id)

    async def run(self, net: SimNet, members: dict[str, Member]) -> None:
        """Poison every 50 virtual ms until every honest member synced ``SYNCS`` times."""
        while not all(len(m.reports) >= SYNCS for m in members.values()):
            self.poison()
            await asyncio.sleep(0.05)


def _ghost_run(tmp_path: Path, caplog: pytest.LogCaptureFixture, fresh: bool, max_group: int) -> tuple[int, Ghosts]:
    """a and b sync ``SYNCS`` times beside Mallory's ghosts; the rounds that left ghosts out, and the ghosts."""
    box: list[Ghosts] = []

    async def haunt(net: SimNet, members: dict[str, Member]) -> None:
        net.add(MALLORY)
        box.append(Ghosts(net, fresh))
        await box[0].run(net, members)

    cfg = replace(CFG, max_group_size=max_group)
    with caplog.at_level(logging.INFO, logger="swarm.sync"):
        members, _, wall = simulate(tmp_path, ["a", "b"], Plan(rounds=SYNCS, train_s=0.15), haunt, cfg=cfg)
    ghosts = box[0]
    met = sum("did not answer a ping" in r.getMessage() for r in caplog.records)
    print(f"{len(ghosts.ghosts)} ghosts in {len(ghosts.windows)} windows; rounds that met them: {met}; {wall:.3f} s")
    for m in members.values():
        print(m.name, [(r.committed, r.group_size, r.cause) for r in m.reports])
        assert len(m.reports) == SYNCS, m.reports
        assert sum(r.committed for r in m.reports) >= SYNCS - 1, [(r.committed, r.cause) for r in m.reports]
        assert all(r.group_size == 2 for r in m.reports if r.committed)
    assert all(len(h) == 1 for h in _histories(list(members.values())).values())
    assert members["a"].states[-1] == members["b"].states[-1]  # the honest pair ends on one state
    assert wall < 2 * WALL_S
    return met, ghosts


def test_fixed_ghosts_never_join_a_group(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three keys that never come online join every window: every honest round still commits (defence off:
    the all-reduce fails on the ghosts)."""
    met, _ = _ghost_run(tmp_path, caplog, fresh=False, max_group=CFG.max_group_size)
    assert met >= 4, met  # the attack reached honest windows


def test_fresh_low_id_ghosts_every_window(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """New ghost keys, ground to low ids, in every window, with max_group_size 2: still every round commits
    (defence off: the ghosts take the group's places, and the honest members are "not in group")."""
    met, ghosts = _ghost_run(tmp_path, caplog, fresh=True, max_group=2)
    assert len(ghosts.ghosts) >= 3 * 4, len(ghosts.ghosts)
    assert met >= 4, met
