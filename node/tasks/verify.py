"""SAPO trust: turn a peer's rollout group into training data without trusting it.

The ground truth is re-derived from the group's task reference, the prompt
must be exactly the regenerated one, and every completion is re-scored with
the local verifier. The rewards a peer claims are only *compared* with the
local ones (the count of mismatches is a signal about that peer); they never
reach the trainer. Everything here is pure.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from node.tasks.registry import TaskFamily, TaskItem, UnknownTask, task_from_ref
from protocol.schema import RolloutGroup, TaskRef

logger = logging.getLogger(__name__)

REWARD_TOLERANCE = 1e-6
"""A claimed reward further than this from the local score counts as a mismatch."""


class RejectReason(StrEnum):
    """Why a peer's group was refused; counted by value in the round record (``rejected_reasons``)."""

    UNKNOWN_FAMILY = "unknown task family"
    BAD_TASK_REFERENCE = "bad task reference"
    PROMPT_MISMATCH = "prompt mismatch"
    BAD_GROUP_SHAPE = "bad group shape"


@dataclass(frozen=True)
class TrainGroup:
    """One prompt with its completions and *locally computed* rewards, ready for GRPO."""

    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    source_peer: str
    task_family: str
    task_ref: TaskRef

    def __post_init__(self) -> None:
        if not self.completions or len(self.completions) != len(self.rewards):
            raise ValueError("a train group needs >= 1 completion and one reward per completion")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify_external`.

    ``group`` is the train group (local rewards) or None when the peer's group
    was refused, in which case ``reason`` says why (``detail`` is for the log).
    ``reward_mismatches`` counts claimed rewards that differ from the local score.
    """

    group: TrainGroup | None
    reason: RejectReason | None = None
    reward_mismatches: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the group was accepted."""
        return self.group is not None


def _rejected(reason: RejectReason, detail: str = "") -> Verdict:
    return Verdict(None, reason, 0, detail)


def score_completions(family: TaskFamily, item: TaskItem, completions: Sequence[str]) -> tuple[float, ...]:
    """The local verifier's reward for each completion."""
    return tuple(family.score(item, c) for c in completions)


def local_group(
    family: TaskFamily, item: TaskItem, completions: Sequence[str], source_peer: str = "self"
) -> TrainGroup:
    """A train group from this node's own completions, scored locally."""
    rewards = score_completions(family, item, completions)
    return TrainGroup(item.prompt, tuple(completions), rewards, source_peer, family.name, item.ref)


def verify_external(
    group: RolloutGroup, known_families: Collection[str] | None = None, source_peer: str = ""
) -> Verdict:
    """Check a peer's group against the locally regenerated task and re-score it.

    ``known_families`` limits which families this node accepts (None: every
    built-in). Rejects an unknown or unwanted family, a task reference that
    cannot be regenerated (bad config, digest mismatch), a prompt that differs
    from the regenerated one, and a group whose completions and rewards differ
    in number (``Verdict.group`` is None, ``reason`` says why). Otherwise the
    verdict holds a train group with *local* rewards and the mismatch count.
    """
    family_name = group.task.family
    if known_families is not None and family_name not in known_families:
        return _rejected(RejectReason.UNKNOWN_FAMILY, repr(family_name))
    try:
        family, item = task_from_ref(group.task)
    except UnknownTask as exc:
        return _rejected(RejectReason.BAD_TASK_REFERENCE, str(exc))
    if group.prompt != item.prompt:
        return _rejected(RejectReason.PROMPT_MISMATCH)
    if not group.completions or len(group.completions) != len(group.rewards):
        return _rejected(RejectReason.BAD_GROUP_SHAPE, "need >= 1 completion and one claimed reward per completion")
    local = score_completions(family, item, group.completions)
    mismatches = sum(1 for c, r in zip(group.rewards, local, strict=True) if abs(c - r) > REWARD_TOLERANCE)
    if mismatches:
        logger.debug("group from %s: %d claimed rewards differ from local scores", source_peer, mismatches)
    train = TrainGroup(item.prompt, tuple(group.completions), local, source_peer, family.name, group.task)
    return Verdict(train, None, mismatches)
