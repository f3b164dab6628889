"""The task registry: family names to classes, references back to items, and the per-round task mix.

>>> fam = build_task("max")
>>> item = fam.item(seed=7, index=0)
>>> fam.score(item, item.answer), fam.score(item, "x")
(1.0, 0.0)
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from node.tasks.base import BadTaskConfig, TaskDigestMismatch, TaskFamily, TaskItem, UnknownTask
from node.tasks.builtin import BUILTIN_TASKS
from node.tasks.heldout import training_item
from node.tasks.reasoning_gym import RG_TASK_NAMES, rg_family_class
from protocol.schema import RolloutGroup, Scalar, TaskRef, config_digest

__all__ = [
    "BUILTIN_TASKS",
    "BadTaskConfig",
    "TaskDigestMismatch",
    "TaskFamily",
    "TaskItem",
    "TaskMix",
    "UnknownTask",
    "build_task",
    "rollout_group",
    "task_from_ref",
    "task_names",
]

_INDEX_STRIDE = 2**20  # TaskMix: index = round * stride + position in the round


def task_names() -> list[str]:
    """Every family name :func:`build_task` accepts: the tiny built-ins, then ``rg:<dataset>``."""
    return [*BUILTIN_TASKS, *RG_TASK_NAMES]


def build_task(name: str, config: Mapping[str, Scalar] | None = None) -> TaskFamily:
    """A registered family with ``config`` (defaults for missing keys); raises :class:`UnknownTask`.

    Names are the tiny built-ins (:data:`BUILTIN_TASKS`, exact match on the raw
    completion) and the reasoning-gym families ``rg:<dataset>`` (answer
    extraction, see :mod:`node.tasks.reasoning_gym`).
    """
    if name in BUILTIN_TASKS:
        return BUILTIN_TASKS[name](config)
    try:
        cls = rg_family_class(name)
    except KeyError:
        raise UnknownTask(f"unknown task family {name!r}; known: {task_names()}") from None
    return cls(config)


def task_from_ref(ref: TaskRef) -> tuple[TaskFamily, TaskItem]:
    """Re-derive (family, item) from a reference; raises :class:`UnknownTask` (or a subclass).

    Rejects an unknown family, a config digest that does not match the config,
    and a config that is incomplete, has unknown keys or is out of range.
    """
    if ref.config_digest != config_digest(ref.config):
        raise TaskDigestMismatch(f"task {ref.family!r}: config digest does not match the config")
    family = build_task(ref.family, ref.config)
    if family.config != ref.config:
        raise BadTaskConfig(f"task {ref.family!r}: config must list every key {sorted(family.config)}")
    try:
        item = family.item(ref.seed, ref.index)
    except ValueError as exc:
        raise UnknownTask(f"task {ref.family!r}: {exc}") from exc
    return family, item


class TaskMix:
    """A deterministic mix of families: which items a node works on in each round."""

    def __init__(self, families: Sequence[TaskFamily], seed: int, weights: Sequence[float] | None = None):
        if not families:
            raise ValueError("a task mix needs at least one family")
        if weights is not None and (len(weights) != len(families) or min(weights) < 0 or sum(weights) <= 0):
            raise ValueError("weights must be one non-negative number per family, not all zero")
        self.families = list(families)
        self.seed = seed
        self.weights = list(weights) if weights is not None else [1.0] * len(families)

    def sample(self, round: int, n: int) -> list[TaskItem]:
        """``n`` items for ``round``: a pure function of (families, weights, seed, round, n), none held out."""
        if not 0 <= n < _INDEX_STRIDE or not 0 <= round < 2**35:
            raise ValueError(f"need 0 <= n < {_INDEX_STRIDE} and 0 <= round < 2^35")
        rng = random.Random(int.from_bytes(hashlib.sha256(f"mix|{self.seed}|{round}".encode()).digest()[:8], "big"))
        chosen = rng.choices(self.families, weights=self.weights, k=n)
        return [training_item(fam, self.seed, round * _INDEX_STRIDE + i) for i, fam in enumerate(chosen)]


def rollout_group(item: TaskItem, completions: Sequence[str], rewards: Sequence[float], model_id: str) -> RolloutGroup:
    """The shareable record of one locally generated and scored group."""
    if len(completions) != len(rewards):
        raise ValueError("need one reward per completion")
    return RolloutGroup(item.ref, item.prompt, tuple(completions), tuple(float(r) for r in rewards), model_id)
