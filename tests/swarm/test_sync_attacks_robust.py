"""A hostile sync member against two honest ones, over real hivemind processes on 127.0.0.1.

The attacker is tests/sync_worker.py with ``--poison``: it sets its weights so
its pseudo-gradient is finite garbage (1e30 everywhere, or noise of norm ~3e7),
or it runs a reducer that returns huge noise for its slice. Honest peers
(a, b: different update seeds) dump their own pseudo-gradient and the average
they applied, so the test recomputes the honest mean and measures how far
each committed average is from it.

Measured on main before the defence: the 1e30 round committed with a max
anchor of 1.3e30 (a real node then crashed on ``multinomial``). A member that
always votes abort is a rule of the rounds: it plays on the simulated network
(tests/swarm/test_sync_sim_rounds.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from swarm.sync import OuterSyncConfig
from tests.faults import FaultSwarm, Peer, Record, final_state, hashes_by_revision

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


def m_is_partner(p: Peer, peer: str) -> list[bool]:
    """Whether ``peer`` was in ``p``'s trusted partners after each sync (the worker reports them)."""
    return [peer in r.get("partners", []) for r in p.syncs()]


def _names(p: Peer, peer: str) -> list[Record]:
    return [r for r in p.syncs() if peer in r.get("suspect_peers", {})]


@pytest.mark.parametrize(
    ("poison", "aggregator", "tolerance"),
    [("huge", "mean", 2.5), ("noise", "centered_clip", 1.0)],
)
def test_poisoned_contributions_are_clipped(
    fault_swarm: FaultSwarm, poison: str, aggregator: str, tolerance: float
) -> None:
    """Clipped to 4x the median part norm: the mean moves at most (4 max|h| + |mean|) / 3 (~2.2x here)."""
    a, b, m = _start(fault_swarm, poison, "--aggregator", aggregator)
    deviations = _deviations(a, b)
    print(f"{poison}/{aggregator}: deviations from the honest mean {[round(d, 3) for d in deviations]}")
    assert len(deviations) >= 2, (a.syncs(), b.syncs())  # commits continue
    assert all(math.isfinite(d) and d <= tolerance for d in deviations), deviations
    attacker = m.info["peer"]
    assert _names(a, attacker) and _names(b, attacker)  # named and counted in the reports
    assert all(r["suspects"] == 1 for r in _names(a, attacker))
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values())
    if poison == "huge":  # 1e30 is garbage to every reducer: m is left out of the later groups
        first, *later = [r for r in a.syncs() if r["committed"]]
        assert first["group_size"] == 3 and first["suspect_peers"][attacker] == "part far past the bound"
        assert later and all(r["group_size"] == 2 for r in later), a.syncs()
        assert all(trusted is False for trusted in m_is_partner(a, attacker)), "a suspect became a partner"


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


def _cosines(a: Peer, b: Peer) -> list[float]:
    """For each round both honest peers committed: cosine of the applied average with the honest mean."""
    out = []
    for ra, rb in zip(a.syncs(), b.syncs(), strict=True):
        if ra["committed"] and rb["committed"]:
            honest = torch.tensor(ra["pseudo"], dtype=torch.float64) + torch.tensor(rb["pseudo"], dtype=torch.float64)
            applied = torch.tensor(ra["applied"], dtype=torch.float64)
            out.append(float(torch.nn.functional.cosine_similarity(applied, honest, dim=0)))
    return out


def test_a_sign_flip_at_the_clip_bound_does_not_reverse_the_default_aggregate(fault_swarm: FaultSwarm) -> None:
    """m sends minus the progress it shares with a and b, just inside the clip bound, claiming the most steps:
    under the default aggregator every committed average still points with the honest progress."""
    rule = OuterSyncConfig().aggregator
    common = ("--drift", "1", "--aggregator", rule)
    a, b, m = fault_swarm.start_many(
        {
            "a": (*STEPS, "--update-seed", "1", "--dump", *common),
            "b": (*STEPS, "--update-seed", "2", "--dump", *common),
            "m": (*STEPS, "--update-seed", "3", "--poison", "flip", "--claim-steps", "2147483647", *common),
        }
    )
    fault_swarm.go()
    for p in (a, b, m):
        final_state(p, 60.0)
    cosines = _cosines(a, b)
    print(f"flip/{rule}: cosines with the honest progress {[round(c, 3) for c in cosines]}")
    assert len(cosines) >= 2, (a.syncs(), b.syncs())
    assert all(c > 0.5 for c in cosines), cosines
    assert all(len(h) == 1 for h in hashes_by_revision([a, b, m]).values())
