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


class FromSource(HasRewards, Protocol):
    @property
    def source_peer(self) -> str: ...

    @property
    def completions(self) -> Sequence[str]: ...


G = TypeVar("G", bound=HasRewards)
S = TypeVar("S", bound=FromSource)


def informative(group: HasRewards) -> bool:
    """True when the group's rewards are not all equal (non-zero advantage)."""
    return len(set(group.rewards)) > 1


def rank(
    pool: Sequence[G],
    policy: str,
    rng: random.Random,
    useful: Callable[[G], bool] | None = None,
    order: Callable[[list[G]], list[int]] | None = None,
) -> list[int]:
    """Indices of ``pool``, most wanted first by ``policy`` (see :func:`choose`)."""
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
    return idx


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
    return sorted(rank(pool, policy, rng, useful, order)[:j])


def within_quota(ranked: Sequence[S], j: int, quota: int | None) -> list[int]:
    """Positions in ``ranked`` of the first ``j`` groups that keep every source within ``quota`` rows.

    A group whose source's rows would pass the quota is passed over (it stays in the pool for a
    later step), so one publisher, however many groups it sent, supplies at most ``quota`` of a
    step's rows. None: no quota.

    >>> from types import SimpleNamespace as N
    >>> groups = [N(source_peer="a", completions="xy"), N(source_peer="a", completions="xy"),
    ...           N(source_peer="b", completions="xy")]
    >>> within_quota(groups, 3, quota=2)
    [0, 2]
    """
    if quota is None:
        return list(range(min(j, len(ranked))))
    used: dict[str, int] = {}
    kept: list[int] = []
    for pos, g in enumerate(ranked):
        if len(kept) == j:
            break
        rows = used.get(g.source_peer, 0) + len(g.completions)
        if rows > quota:
            continue
        used[g.source_peer] = rows
        kept.append(pos)
    return kept


@dataclass
class ExternalPool(Generic[S]):
    """Verified external groups waiting to be trained on; each is used at most once.

    Bounded: the oldest groups fall out first, so a burst of peers cannot grow
    memory and stale rollouts age out.
    """

    capacity: int

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"pool capacity {self.capacity} must be >= 1")
        self._items: deque[S] = deque(maxlen=self.capacity)

    def add(self, groups: Sequence[S]) -> None:
        self._items.extend(groups)

    def take(
        self,
        j: int,
        policy: str,
        rng: random.Random,
        useful: Callable[[S], bool] | None = None,
        order: Callable[[list[S]], list[int]] | None = None,
        quota: int | None = None,
    ) -> list[S]:
        """Up to ``j`` groups chosen by ``policy`` (:func:`choose`), each source within ``quota`` rows
        (:func:`within_quota`); they leave the pool, the others stay."""
        items = list(self._items)
        ranked = rank(items, policy, rng, useful, order)
        chosen = {ranked[pos] for pos in within_quota([items[i] for i in ranked], j, quota)}
        self._items = deque((g for i, g in enumerate(items) if i not in chosen), maxlen=self.capacity)
        return [items[i] for i in sorted(chosen)]

    def __len__(self) -> int:
        return len(self._items)
