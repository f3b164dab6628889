"""A reducer that lies just inside the old floor, over real hivemind processes on 127.0.0.1.

The attacker is tests/sync_worker.py with ``--poison shrink``: as reducer of its slice it returns 0.45 x
that slice of the anchor as the average (and votes for it, its own checks switched off). The outer step
then pulls the slice towards zero. Each member used to judge a reduced slice by the larger of
``clip_factor`` x its own part and ``max_update`` (0.5) x the slice's anchor norm, a scale no
contribution sets: 6 of 6 commits adopted by both honest members, her third of the model shrank to 0.03
of its norm, never banned. Now a member judges by its own evidence (its part, its recent parts, the
averages it committed: swarm.sync.assemble.OwnScale): every round she is in fails at both honest members,
who name her and leave her out of their groups (``suspect_ban_s``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.hivemind_transport import HivemindStreams
from swarm.sync.tensors import flatten
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

LIED = "reduced slice too large"
"""Suspicion.REDUCED_TOO_LARGE's value: what an honest member names the lying reducer for."""


def _initial_anchor() -> torch.Tensor:
    """The workers' initial weights (tests/sync_worker.py: --arch 32,32,8, --init-seed 0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in itertools.pairwise([32, 32, 8])))
    return flatten(model)


def _thirds(x: torch.Tensor) -> list[float]:
    """Norms of the three slices a group of three reduces (tensors.slice_bounds splits evenly)."""
    return [float(part.norm()) for part in torch.tensor_split(x, 3)]


def _served(peer: Peer, root: object, n: int) -> Snapshot:
    identity = load_or_create(root / "observer.key")  # type: ignore[operator]
    cfg = MembershipConfig(swarm_id="test-sync", host="127.0.0.1", initial_peers=(peer.info["maddrs"][0],))
    with Membership(identity, cfg) as observer:
        nothing = Snapshot(0, "", torch.zeros(0), torch.zeros(0))
        service = SyncService(
            HivemindStreams(observer.p2p),
            f"test-sync.sync.{peer.info['fingerprint']}",
            observer.peer_id,
            2.0,
            lambda: nothing,
        )
        snap: Snapshot = observer.run(service.fetch_state(peer.info["peer"], n, 10.0), 12.0)
    return snap


def test_a_reducer_shrinking_its_slice_fails_every_round_and_is_left_out(fault_swarm: FaultSwarm) -> None:
    # inner steps of 0.001 per weight: a pseudo-gradient ~2% of the anchor's norm, as an inner phase of
    # DiLoCo moves a model (the worker's default 0.01 makes one phase a fifth of the weights)
    honest = ("--steps", "40", "--linger", "60", "--step-scale", "0.001")
    a, b, m = fault_swarm.start_many(
        {
            "a": (*honest, "--update-seed", "1"),
            "b": (*honest, "--update-seed", "2"),
            "m": (
                "--steps",
                "40",
                "--step-scale",
                "0.001",
                "--update-seed",
                "3",
                "--poison",
                "shrink",
                "--linger",
                "5",
            ),
        }
    )
    fault_swarm.go()
    for p in (a, b):
        final_state(p, 90.0)
    initial = _initial_anchor()
    served = _served(a, fault_swarm.root, initial.numel())
    liar = m.info["peer"]
    ratios = [round(x / y, 4) for x, y in zip(_thirds(served.anchor), _thirds(initial), strict=True)]
    with_her = {p.name: [s for s in p.syncs() if s["group_size"] == 3] for p in (a, b)}
    pairs = {p.name: [s for s in p.syncs() if s["committed"] and s["group_size"] == 2] for p in (a, b)}
    named = {p.name: [s["suspect_peers"].get(liar) for s in with_her[p.name]] for p in (a, b)}
    print(f"slice norms of a's anchor over the initial weights' (thirds): {ratios}")
    print(f"rounds with the liar (a, b): {[len(v) for v in with_her.values()]}, committed: ")
    print(f"  {[sum(s['committed'] for s in v) for v in with_her.values()]}; she was named for: {named}")
    print(f"commits as a pair after she was left out (a, b): {[len(v) for v in pairs.values()]}")
    assert all(v for v in with_her.values()), "the liar never joined a group: nothing was tested"
    assert not any(s["committed"] for v in with_her.values() for s in v), with_her  # defence off: 6 of 6
    assert all(why == LIED for v in named.values() for why in v), named
    assert all(len(v) <= 3 for v in with_her.values()), with_her  # left out within 3 rounds
    assert all(len(v) >= 3 for v in pairs.values()), pairs  # the honest pair syncs on without her
    assert min(ratios) > 0.8, ratios  # defence off: her third at 0.03 of its norm
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values())
