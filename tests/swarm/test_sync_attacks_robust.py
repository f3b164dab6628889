"""A lying reducer against two honest sync members, over real hivemind processes on 127.0.0.1.

The attacker is tests/sync_worker.py with ``--poison liar``: it runs a reducer that returns huge
noise for its slice (a module-level patch of its own process, which the simulated network's
members, sharing one process, cannot each hold). Honest peers (a, b: different update seeds) dump
their own pseudo-gradient and the average they applied, so the test recomputes the honest mean
and measures how far each committed average is from it. Poisoned parts (1e30, noise), a sign
flip at the clip bound and a member that always votes abort play on the simulated network
(tests/swarm/test_sync_sim_robust.py, test_sync_sim_rounds.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.faults import FaultSwarm, Peer, final_state

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

STEPS = ("--steps", "12")  # 3 syncs (sync_every 4)


def _start(swarm: FaultSwarm, poison: str, *extra: str) -> tuple[Peer, Peer, Peer]:
    a, b, m = swarm.start_many(
        {
            "a": (*STEPS, "--update-seed", "1", "--dump", *extra),
            "b": (*STEPS, "--update-seed", "2", "--dump", *extra),
            "m": (*STEPS, "--update-seed", "3", "--poison", poison, *extra),
        }
    )
    swarm.go()
    for p in (a, b, m):
        final_state(p, 60.0)
    for p in (a, b, m):  # no node exits: each is still lingering after its last sync
        assert p.proc.alive(), f"{p.name} exited"
    return a, b, m


def _deviations(a: Peer, b: Peer) -> list[float]:
    """For each round both honest peers committed: ||applied - honest mean|| / ||honest mean||."""
    out = []
    for ra, rb in zip(a.syncs(), b.syncs(), strict=True):
        assert ra["step"] == rb["step"]
        if not (ra["committed"] and rb["committed"]):
            continue
        assert ra["anchor_finite"] and rb["anchor_finite"]
        assert ra["state_hash"] == rb["state_hash"]
        # float64: a poisoned average (~3e29) must give a finite figure, not an overflowed norm
        honest = (torch.tensor(ra["pseudo"], dtype=torch.float64) + torch.tensor(rb["pseudo"], dtype=torch.float64)) / 2
        applied = torch.tensor(ra["applied"], dtype=torch.float64)
        out.append(float((applied - honest).norm() / honest.norm()))
    return out


def test_lying_reducer_is_refused_then_left_out(fault_swarm: FaultSwarm) -> None:
    """m reduces its slice to noise: every honest member votes abort, then matches without m."""
    a, b, m = _start(fault_swarm, "liar")
    attacker = m.info["peer"]
    first = [a.syncs()[0], b.syncs()[0]]
    # on failure, say what each honest peer's first sync was (a full record is too long to read in a log)
    brief = [{k: r.get(k) for k in ("committed", "cause", "group_size", "reason", "suspect_peers")} for r in first]
    assert all(not r["committed"] and r["cause"] == "refused the average" for r in first), brief
    assert all(r["revision"] == 0 for r in first)  # rolled back everywhere: nobody applied it
    assert all(r["suspect_peers"].get(attacker, "").startswith("reduced slice") for r in first)
    later = [r for p in (a, b) for r in p.syncs()[1:]]
    assert later and all(r["committed"] and r["group_size"] == 2 for r in later), later
    deviations = _deviations(a, b)
    print(f"liar: deviations from the honest mean {[round(d, 6) for d in deviations]}")
    assert len(deviations) == 2 and max(deviations) < 1e-5, deviations
    assert not any(r["committed"] for r in m.syncs()), m.syncs()
