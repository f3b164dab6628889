"""Held-out per model, computed by hand from scripted runs."""

from __future__ import annotations

import pytest

from node.experiments.permodel import per_model_heldout, per_model_table
from node.experiments.results import NodeResult, RunResult


def _node(model: str, greedy: float, sampled: float, external: int = 0) -> NodeResult:
    return NodeResult("p", model, (0.5,) * 10, external, heldout=((0, 0.1), (10, greedy)),
                      heldout_reward=((0, 0.1), (10, sampled)))  # fmt: skip


def _run(label: str, split: str, seed: int, *nodes: NodeResult) -> RunResult:
    return RunResult(label, split, seed, nodes)


RUNS = [
    _run("a", "8/0", 1, _node("big", 0.8, 0.6), _node("small", 0.4, 0.2)),
    _run("a", "8/0", 2, _node("big", 0.6, 0.4), _node("small", 0.5, 0.25)),
    # the swarm: big loses on both seeds, small gains; two small nodes in seed 2 are averaged
    _run("a", "4/4", 1, _node("big", 0.4, 0.3, 40), _node("small", 0.6, 0.2, 20)),
    _run("a", "4/4", 2, _node("big", 0.3, 0.3, 40), _node("small", 0.5, 0.3, 30), _node("small", 0.7, 0.2, 10)),
]


def test_each_model_is_paired_with_itself_in_the_baseline_run_of_its_seed() -> None:
    rows = {(r.split, r.model): r for r in per_model_heldout(RUNS, ("a", "8/0"))}
    big, small = rows["4/4", "big"], rows["4/4", "small"]
    assert big.greedy_ratio == pytest.approx((0.4 / 0.8 + 0.3 / 0.6) / 2)  # 0.5: the swarm mean hides it
    assert big.sampled_ratio == pytest.approx((0.3 / 0.6 + 0.3 / 0.4) / 2)
    assert small.greedy == pytest.approx((0.6 + 0.6) / 2) and small.greedy_ratio == pytest.approx((1.5 + 1.2) / 2)
    assert big.greedy_p == pytest.approx(0.0903, abs=1e-4)  # diffs -0.4, -0.3: t = -7 on 1 degree of freedom
    assert small.external_per_round == pytest.approx((2.0 + 2.0) / 2)  # per node: external groups / rounds
    assert rows["8/0", "big"].greedy_ratio == 1.0 and small.seeds == 2
    table = per_model_table(list(rows.values()))
    assert "| a | 4/4 | big | 2 | 0.350 | 0.300 | 0.500 | 0.090 | 0.625 | 4.00 |" in table
