"""Parts weighted by the inner steps their members trained, with a cap no claim can pass (issue 16).

Unit rules of :func:`swarm.sync.robust.clamp_weights` and the weighted aggregation. Whole rounds
run on the simulated network: a peer that trains 2x the steps counts 2x in the committed average
(tests/swarm/test_sync_sim_eager.py), and a member claiming 10**9 steps moves the average no more
than a peer that trained ``max_weight_ratio`` (4) x the median would (test_sync_sim_robust.py).
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
