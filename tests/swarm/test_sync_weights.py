"""Parts weighted by the inner steps their members trained, with a cap no claim can pass (issue 16).

Unit rules of :func:`swarm.sync.robust.clamp_weights` and the weighted
aggregation, then real hivemind processes on 127.0.0.1 (tests/sync_worker.py):
a peer that trains 2x the steps counts 2x in the committed average. A member
claiming 10**9 steps moves the average no more than a peer that trained
``max_weight_ratio`` (4) x the median would: on the simulated network
(tests/swarm/test_sync_sim_robust.py).
"""

from __future__ import annotations

import pytest
import torch

from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import Snapshot
from swarm.sync.errors import BadBytes
from swarm.sync.job import SyncJob
from swarm.sync.robust import aggregate, clamp_weights, reduce_slice
from swarm.sync.wire import MAX_WEIGHT, check_weight
from tests.faults import FaultSwarm, Peer, Record, final_state, hashes_by_revision

N = 64


def _honest(k: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(N, generator=gen) for _ in range(k)]


def _weighted(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    w = torch.tensor(weights, dtype=torch.float64)
    return (torch.stack([p.double() for p in parts]) * w[:, None]).sum(0) / w.sum()


# ---- unit rules ---------------------------------------------------------------------------------


def test_a_huge_claim_is_capped_at_the_ratio_times_the_median_claim() -> None:
    assert clamp_weights([4, 4, 10**9], 4.0) == [4.0, 4.0, 16.0]
    assert clamp_weights([4, 8, 10**9, 2], 4.0) == [4.0, 8.0, 24.0, 2.0]  # even count: mean of the middle two
    assert clamp_weights([3, 10**9], 4.0) == [3.0, 12.0]  # two parts: the smaller claim is the scale
    assert clamp_weights([5, 9, 7], 4.0) == [5.0, 9.0, 7.0]  # honest spread within the ratio: untouched
    assert clamp_weights([10**9], 4.0) == [1e9]  # alone: its weight cannot move anything


def test_the_mean_is_step_weighted_and_bit_identical() -> None:
    parts = _honest(3)
    got = aggregate(parts, N, "mean", 0.2, [4.0, 8.0, 4.0])
    assert torch.allclose(got.double(), _weighted(parts, [4, 8, 4]), atol=1e-6)
    again = aggregate([p.clone() for p in parts], N, "mean", 0.2, [4.0, 8.0, 4.0])
    assert torch.equal(got, again)
    # equal weights: exactly the unweighted mean of before (same float32 bits)
    assert torch.equal(aggregate(parts, N, "mean", 0.2, [6.0] * 3), aggregate(parts, N, "mean", 0.2))


def test_one_liar_moves_the_mean_no_more_than_a_peer_at_the_cap() -> None:
    a, b = _honest(2)
    liar = a + 3.0  # finite, within the norm bound: only its claimed weight is the attack
    out = reduce_slice([("a", a), ("b", b), ("m", liar)], a, N, "mean", 0.2, 4.0, weights=[4, 4, 10**9])
    honest = _weighted([a, b], [4, 4])
    share = float((out.value.double() - honest).norm() / (liar.double() - honest).norm())
    assert share == pytest.approx(16 / 24, abs=1e-5)  # capped at 4 x 4 of 24; uncapped it would be ~1.0
    assert not out.flagged


def test_robust_rules_and_weights() -> None:
    """trimmed_mean weights the survivors (trimmed by count); median and centered_clip ignore weights."""
    parts = [torch.full((N,), v) for v in (0.0, 1.0, 4.0, 100.0, -50.0)]
    w = [1.0, 1.0, 3.0, 1.0, 1.0]
    trimmed = aggregate(parts, N, "trimmed_mean", 0.2, w)  # k = 1: drops -50 and 100
    assert torch.allclose(trimmed, torch.full((N,), (0.0 + 1.0 + 12.0) / 5))
    for rule in ("median", "centered_clip"):
        assert torch.equal(aggregate(parts, N, rule, 0.2, w), aggregate(parts, N, rule, 0.2))


def test_the_wire_weight_is_a_bounded_int() -> None:
    assert check_weight(0) == 0 and check_weight(MAX_WEIGHT) == MAX_WEIGHT
    for bad in (True, -1, MAX_WEIGHT + 1, 1.5, "4", None):
        with pytest.raises(BadBytes):
            check_weight(bad)


def test_a_job_weighs_its_inner_steps_and_nothing_trained_weighs_zero() -> None:
    anchor = torch.zeros(4)
    base = Snapshot(0, "h", anchor, torch.zeros(4))
    assert SyncJob.taken(base, anchor.clone(), steps=9).weight == 0
    assert SyncJob.taken(base, anchor + 1, steps=9).weight == 9
    assert SyncJob.taken(base, anchor + 1, steps=0).weight == 1  # trained but not told how much: counts 1
    assert SyncJob.taken(base, anchor + 1, steps=10**12).weight == MAX_WEIGHT


def test_max_weight_ratio_validation_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"max_weight_ratio=0\.5; use a finite number of at least 1"):
        OuterSyncConfig(max_weight_ratio=0.5)


# ---- over the network ---------------------------------------------------------------------------


def _vec(r: Record, key: str) -> torch.Tensor:
    return torch.tensor(r[key], dtype=torch.float64)


def _committed_groups(peers: list[Peer]) -> dict[int, list[Record]]:
    """Every member's record of each committed revision (each worker dumps its pseudo and weight)."""
    for revision, hashes in hashes_by_revision(peers).items():
        assert len(hashes) == 1, f"revision {revision} has {len(hashes)} different states"
    out: dict[int, list[Record]] = {}
    for p in peers:
        for r in p.syncs():
            if r["committed"]:
                out.setdefault(r["revision"], []).append({**r, "name": p.name})
    for revision, rs in out.items():
        assert len(rs) == rs[0]["group_size"], (revision, rs)
    return out


def _applied(rs: list[Record]) -> torch.Tensor:
    """The committed average, read from a member that did not catch up in that round (its momentum is its own)."""
    return _vec(next(r for r in rs if not r["caught_up"]), "applied")


@pytest.mark.network
@pytest.mark.timeout(90)
def test_a_peer_that_trains_twice_the_steps_counts_twice(fault_swarm: FaultSwarm) -> None:
    """Three eager peers on a 2 s shared clock; c steps twice as fast: every average is the step-weighted mean."""
    root = fault_swarm.root
    halt = root / "halt"
    common = ["--eager", "--period", "2.0", "--dump", "--steps", "100000", "--halt-file", str(halt)]
    common += ["--timeouts", "1.0,4,2,4,6"]
    peers = fault_swarm.start_many(
        {
            "a": (*common, "--update-seed", "1", "--step-sleep", "0.1"),
            "b": (*common, "--update-seed", "2", "--step-sleep", "0.1"),
            "c": (*common, "--update-seed", "3", "--step-sleep", "0.05"),
        }
    )
    fault_swarm.go()
    c = peers[2]
    c.wait_for(lambda r: sum(s["committed"] for s in c.syncs()) >= 5, 45.0, "5 commits of c")
    halt.touch()
    for p in peers:
        final_state(p, 20.0)
    groups = _committed_groups(peers)
    deviations, unweighted, ratios = [], [], []
    for rs in groups.values():
        parts = [r for r in rs if r["weight"]]
        weights = clamp_weights([r["weight"] for r in parts], 4.0)
        pseudos = [_vec(r, "pseudo") for r in parts]
        expected, plain = _weighted(pseudos, weights), torch.stack(pseudos).mean(0)
        applied = _applied(rs)
        deviations.append(float((applied - expected).norm() / expected.norm()))
        unweighted.append(float((applied - plain).norm() / plain.norm()))
        by = {r["name"]: r["weight"] for r in rs}
        if len(by) == 3 and by["a"]:
            ratios.append(by["c"] / by["a"])
    print(f"c/a weights {[round(x, 2) for x in ratios]}; vs the step-weighted mean: max {max(deviations):.2e}; ")
    print(f"vs the unweighted mean: {[round(x, 3) for x in unweighted]}")
    assert len(deviations) >= 4 and max(deviations) < 1e-4, deviations
    assert sum(x >= 1.5 for x in ratios) >= 3, ratios  # c did train ~2x the steps in most rounds
