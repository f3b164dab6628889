"""Held-out evaluation: scores computed by hand on a toy policy, the time bound, a stop, the schedule."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from node.tasks.base import TaskFamily, TaskItem
from node.tasks.registry import build_task
from node.training.evaluate import CHUNK, EvalConfig, eval_sets, evaluate
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy


class ToyPolicy:
    """Answers ``max`` right and every other family with "0"; of ``n`` samples only the first is right."""

    def __init__(self, families: dict[str, TaskFamily], stop_after: int = -1) -> None:
        self.answers = {it.prompt: (name, it) for name, items in eval_sets(families, 64).items() for it in items}
        self.calls = 0
        self.stop_after = stop_after
        self.stop: Callable[[], bool] = lambda: 0 <= self.stop_after <= self.calls

    def _answer(self, prompt: str) -> str:
        name, item = self.answers[prompt]
        return item.answer if name == "max" else "0"

    def generate(self, prompts: list[str], n: int, cfg: GenerationConfig, seed: int | None = None) -> list[list[str]]:
        self.calls += 1
        if n == 1:
            return [[self._answer(p)] for p in prompts]
        return [[self._answer(p)] + ["x"] * (n - 1) for p in prompts]


def _by_hand(items: list[TaskItem], name: str) -> float:
    if name == "max":
        return 1.0
    return sum(it.answer == "0" for it in items) / len(items)


def test_scores_are_those_computed_by_hand() -> None:
    families = {n: build_task(n) for n in ("max", "min", "count")}
    sets = eval_sets(families, 16)
    toy = ToyPolicy(families)
    result = evaluate(toy, families, sets, GenerationConfig(max_new_tokens=1), EvalConfig(eval_samples=4))
    expected = {name: _by_hand(items, name) for name, items in sets.items()}
    assert result.per_family == pytest.approx(expected)
    n = sum(len(v) for v in sets.values())
    hits = sum(expected[name] * len(items) for name, items in sets.items())
    assert result.accuracy == pytest.approx(hits / n)
    # of 4 samples only the first is the greedy answer: each question scores a quarter of its greedy score
    assert result.sample_reward == pytest.approx(hits / n / 4)
    assert result.items == n and result.complete


def test_the_time_bound_stops_between_chunks_and_says_so() -> None:
    families = {n: build_task(n) for n in ("max", "min", "pos")}
    sets = eval_sets(families, 64)
    ticks = iter(range(1000))
    result = evaluate(
        ToyPolicy(families), families, sets, GenerationConfig(), EvalConfig(eval_samples=0, eval_timeout_s=1.5),
        clock=lambda: float(next(ticks)),
    )  # fmt: skip
    assert not result.complete and 0 < result.items < sum(len(v) for v in sets.values())
    assert result.items % CHUNK == 0


def test_a_stop_during_generation_leaves_an_incomplete_result_not_wrong_scores() -> None:
    families = {"max": build_task("max")}
    result = evaluate(
        ToyPolicy(families, stop_after=1),
        families,
        eval_sets(families, 64),
        GenerationConfig(),
        EvalConfig(eval_samples=0),
    )
    assert result.items == 0 and not result.complete


def test_greedy_accuracy_of_a_real_model_is_its_argmax_answers_scored() -> None:
    model, tok, mid = load_model("tiny-s", seed=3, device="cpu")
    policy = Policy(model, tok, mid)
    families = {"parity": build_task("parity")}
    sets = eval_sets(families, 32)
    result = evaluate(policy, families, sets, GenerationConfig(max_new_tokens=1), EvalConfig(eval_samples=0))
    items = sets["parity"]
    outs = policy.generate([it.prompt for it in items], 1, GenerationConfig(temperature=0.0, max_new_tokens=1))
    by_hand = sum(families["parity"].score(it, o[0]) for it, o in zip(items, outs, strict=True)) / len(items)
    assert result.accuracy == pytest.approx(by_hand)


@pytest.mark.parametrize(
    ("every", "last", "due"),
    [(10, 25, [0, 10, 20, 25]), (10, 20, [0, 10, 20]), (10, 0, [0, 10, 20]), (0, 25, [])],
)
def test_evaluations_are_due_before_training_every_k_rounds_and_after_the_last(
    every: int, last: int, due: list[int]
) -> None:
    cfg = EvalConfig(eval_every=every)
    assert [r for r in range(26) if cfg.due(r, last)] == due


def test_bad_settings_name_the_fix() -> None:
    with pytest.raises(ValueError, match="every=-1"):
        EvalConfig(eval_every=-1)
    with pytest.raises(ValueError, match="items=0"):
        EvalConfig(eval_items=0)


def test_time_spent_on_samples_leaves_a_complete_accuracy_and_no_partial_sample_reward() -> None:
    families = {n: build_task(n) for n in ("max", "min")}
    sets = eval_sets(families, 64)
    n_chunks = -(-sum(len(v) for v in sets.values()) // CHUNK)
    ticks = iter(range(1000))
    result = evaluate(
        ToyPolicy(families), families, sets, GenerationConfig(),
        EvalConfig(eval_samples=4, eval_timeout_s=n_chunks + 1.5),
        clock=lambda: float(next(ticks)),
    )  # fmt: skip
    assert result.complete and result.items == sum(len(v) for v in sets.values())
    assert result.sample_reward is None


def test_a_family_with_fewer_held_out_prompts_than_asked_is_named_with_the_accuracy_step() -> None:
    from node.training.evaluate import short_sets

    families = {"max": build_task("max"), "rg:products": build_task("rg:products")}
    sets = eval_sets(families, 64)
    assert len(sets["max"]) == 64 and 0 < len(sets["rg:products"]) < 64
    line = short_sets(sets, 64)
    assert f"rg:products {len(sets['rg:products'])} held-out questions" in line and "max " not in line
    assert f"steps of {1 / (64 + len(sets['rg:products'])):.3f}" in line
    assert short_sets(eval_sets({"max": build_task("max")}, 64), 64) == ""
