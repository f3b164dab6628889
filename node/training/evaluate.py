"""Held-out evaluation: how well a policy answers questions no node of the swarm trains on.

Training reward is measured on the stream a node trains on, and nodes that
share see different streams, so it cannot compare runs or tell learning from
gaming the stream. This scores a policy on each family's fixed evaluation set
(:func:`node.tasks.heldout.eval_items`, the same on every node): greedy
accuracy (one deterministic completion per question) and the mean reward of
``samples`` completions drawn as training draws them.

An evaluation is bounded in time: it stops between chunks once ``timeout_s``
has passed and says so, so a slow device never stalls the rounds. Greedy
answers come first: where time runs out during sampling, the accuracy still
covers every question and only the sampled reward is missing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from node.tasks.base import TaskFamily, TaskItem
from node.tasks.heldout import eval_items
from node.training.configs import EvalConfig as EvalConfig
from node.training.policy import GenerationConfig

CHUNK = 32
"""Questions generated per call: the time bound is checked between chunks."""


class Answerer(Protocol):
    """What an evaluation needs of a policy (:class:`~node.training.policy.Policy` is one)."""

    stop: Callable[[], bool]

    def generate(self, prompts: list[str], n: int, cfg: GenerationConfig, seed: int | None = None) -> list[list[str]]:
        """``n`` completions per prompt; the same seed gives the same completions."""
        ...


@dataclass(frozen=True)
class EvalResult:
    """One evaluation's scores. ``complete``: every question was answered greedily (``accuracy`` is over those
    answered); ``sample_reward`` is None unless every question's samples were scored too."""

    accuracy: float
    sample_reward: float | None
    per_family: dict[str, float]
    items: int
    eval_s: float
    complete: bool

    def to_event(self) -> dict[str, object]:
        """The fields of the ``eval`` metrics event."""
        return {
            "accuracy": round(self.accuracy, 6),
            "sample_reward": None if self.sample_reward is None else round(self.sample_reward, 6),
            "per_family": {k: round(v, 6) for k, v in self.per_family.items()},
            "items": self.items,
            "eval_s": round(self.eval_s, 4),
            "complete": self.complete,
        }


def eval_sets(families: Mapping[str, TaskFamily], items: int) -> dict[str, list[TaskItem]]:
    """Each family's evaluation set (``items`` questions, fewer where the family has fewer held out)."""
    return {name: eval_items(fam, items) for name, fam in families.items()}


def short_sets(sets: Mapping[str, list[TaskItem]], asked: int) -> str:
    """One sentence naming the families whose evaluation set is smaller than ``asked``, or "" if none is.

    A family with few distinct prompts (two 1-digit terms) holds only a few held out, so its accuracy
    moves in steps of 1/n whatever ``--eval-items`` says; a comparison needs to know the step.
    """
    short = {name: len(items) for name, items in sets.items() if len(items) < asked}
    if not short:
        return ""
    listed = ", ".join(f"{name} {n}" for name, n in sorted(short.items()))
    total = sum(len(items) for items in sets.values())
    return (
        f"held-out evaluation: {listed} held-out questions, not the {asked} asked for (the family has no more "
        f"distinct held-out prompts); accuracy is over {total} questions, steps of {1 / max(total, 1):.3f}"
    )


def evaluate(
    policy: Answerer,
    families: Mapping[str, TaskFamily],
    sets: Mapping[str, Sequence[TaskItem]],
    generation: GenerationConfig,
    cfg: EvalConfig,
    clock: Callable[[], float] = time.monotonic,
) -> EvalResult:
    """Score ``policy`` on ``sets``: greedy accuracy, then the mean reward of ``cfg.eval_samples`` draws."""
    t0 = clock()
    deadline = t0 + cfg.eval_timeout_s
    pairs = [(families[name], item) for name, items in sets.items() for item in items]
    # the yardstick is the float32 model whatever samples the node's rounds (node.training.sampler)
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=generation.max_new_tokens, sample_precision="float32")
    draws = dataclasses.replace(generation, sample_precision="float32")
    hits = _score(policy, pairs, greedy, 1, clock, deadline)
    sampled = _score(policy, pairs, draws, cfg.eval_samples, clock, deadline) if cfg.eval_samples else []
    per_family: dict[str, list[float]] = {}
    for (fam, _), score in zip(pairs, hits, strict=False):
        per_family.setdefault(fam.name, []).append(score)
    return EvalResult(
        accuracy=sum(hits) / len(hits) if hits else 0.0,
        # over every question or none: a mean over the first families only would not compare with others
        sample_reward=sum(sampled) / len(sampled) if sampled and len(sampled) == len(pairs) else None,
        per_family={k: sum(v) / len(v) for k, v in sorted(per_family.items())},
        items=len(hits),
        eval_s=clock() - t0,
        complete=len(hits) == len(pairs),
    )


def _score(
    policy: Answerer,
    pairs: Sequence[tuple[TaskFamily, TaskItem]],
    gen: GenerationConfig,
    n: int,
    clock: Callable[[], float],
    deadline: float,
) -> list[float]:
    """Per question, the mean reward of its ``n`` completions; stops between chunks past ``deadline``."""
    scores: list[float] = []
    for start in range(0, len(pairs), CHUNK):
        if clock() > deadline:
            break
        chunk = pairs[start : start + CHUNK]
        # a fixed seed per chunk: the same policy always gets the same score
        outs = policy.generate([item.prompt for _, item in chunk], n, gen, seed=start)
        if policy.stop():  # generation was cut short by leaving: these completions are not the policy's answers
            break
        scores += [sum(fam.score(item, c) for c in comps) / n for (fam, item), comps in zip(chunk, outs, strict=True)]
    return scores
