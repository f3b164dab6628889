"""Choosing which external groups to train on: a bounded pool and two policies.

``uniform`` is SAPO's policy: any verified external group is as good as any
other. ``advantage`` prefers groups whose (locally re-scored) rewards differ,
since a group whose completions all scored the same carries no GRPO signal.
``credit`` does the same, then orders the groups with signal by what their sources
taught this node before (:mod:`node.core.credit`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

SAMPLING_POLICIES = ("uniform", "advantage", "credit")


class HasRewards(Protocol):
    @property
    def rewards(self) -> Sequence[float]: ...


G = TypeVar("G", bound=HasRewards)


def informative(group: HasRewards) -> bool:
    """True when the group's rewards are not all equal (non-zero advantage)."""
    return len(set(group.rewards)) > 1


def choose(
    pool: Sequence[G],
    j: int,
    policy: str,
    rng: random.Random,
    useful: Callable[[G], bool] | None = None,
    order: Callable[[list[G]], list[int]] | None = None,
) -> list[int]:
    """Indices of up to ``j`` groups of ``pool`` to train on, chosen by ``policy``.

    ``useful`` decides what ``advantage`` and ``credit`` prefer (default :func:`informative`; the
    trainer's own test when its baseline for peers' groups is not their mean). ``order`` ranks the
    useful groups for ``credit`` (positions into the list it is given; without it ``credit`` is ``advantage``).

    >>> from types import SimpleNamespace as N
    >>> pool = [N(rewards=(1.0, 1.0)), N(rewards=(0.0, 1.0)), N(rewards=(0.0, 0.0))]
    >>> choose(pool, 1, "advantage", random.Random(0))
    [1]
    """
    if policy not in SAMPLING_POLICIES:
        raise ValueError(f"unknown sampling policy {policy!r}; use one of {SAMPLING_POLICIES}")
    idx = list(range(len(pool)))
    rng.shuffle(idx)
    if policy in ("advantage", "credit"):
        # stable sort keeps the shuffle among equals: informative groups first
        test = useful or informative
        idx.sort(key=lambda i: not test(pool[i]))
        if policy == "credit" and order is not None:
            n = sum(1 for i in idx if test(pool[i]))
            ranked = order([pool[i] for i in idx[:n]])
            idx = [idx[k] for k in ranked] + idx[n:]
    return sorted(idx[:j])


@dataclass
class ExternalPool(Generic[G]):
    """Verified external groups waiting to be trained on; each is used at most once.

    Bounded: the oldest groups fall out first, so a burst of peers cannot grow
    memory and stale rollouts age out.
    """

    capacity: int

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"pool capacity {self.capacity} must be >= 1")
        self._items: deque[G] = deque(maxlen=self.capacity)

    def add(self, groups: Sequence[G]) -> None:
        self._items.extend(groups)

    def take(
        self,
        j: int,
        policy: str,
        rng: random.Random,
        useful: Callable[[G], bool] | None = None,
        order: Callable[[list[G]], list[int]] | None = None,
    ) -> list[G]:
        items = list(self._items)
        chosen = set(choose(items, j, policy, rng, useful, order))
        self._items = deque((g for i, g in enumerate(items) if i not in chosen), maxlen=self.capacity)
        return [items[i] for i in sorted(chosen)]

    def __len__(self) -> int:
        return len(self._items)
