"""SAPO trust: turn a peer's rollout group into training data without trusting it.

The ground truth is re-derived from the group's task reference, the prompt
must be exactly the regenerated one, and every completion is re-scored with
the local verifier. The rewards a peer claims are only *compared* with the
local ones (the count of mismatches is a signal about that peer); they never
reach the trainer. With an :class:`~node.tasks.acceptance.Acceptance` the
group must also be one this node would have produced itself (its families,
configs, generation budget and context), checked cheapest first. Everything
here is pure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from node.tasks.acceptance import Acceptance, Refusal, check_shape
from node.tasks.reasons import FAULTS, RejectReason
from node.tasks.registry import TaskFamily, TaskItem, UnknownTask, task_from_ref
from protocol.schema import RolloutGroup, TaskRef

__all__ = [
    "FAULTS",
    "REWARD_TOLERANCE",
    "RejectReason",
    "TrainGroup",
    "Verdict",
    "local_group",
    "score_completions",
    "verify_external",
]

logger = logging.getLogger(__name__)

REWARD_TOLERANCE = 1e-6
"""A claimed reward further than this from the local score counts as a mismatch."""


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

    @property
    def informative(self) -> bool:
        """Whether its rewards are not all equal (only then is its group-normalised advantage non-zero)."""
        return max(self.rewards) - min(self.rewards) > 1e-9


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify_external`.

    ``group`` is the train group (local rewards) or None when the peer's group
    was refused, in which case ``reason`` says why (``detail`` is for the log).
    ``reward_mismatches`` counts claimed rewards that differ from the local score;
    ``built`` says whether regenerating the task built something expensive
    (a reasoning-gym dataset for a new seed), which ingest budgets per round.
    """

    group: TrainGroup | None
    reason: RejectReason | None = None
    reward_mismatches: int = 0
    detail: str = ""
    built: bool = False

    @property
    def ok(self) -> bool:
        """Whether the group was accepted."""
        return self.group is not None


def _rejected(refusal: Refusal, built: bool = False) -> Verdict:
    return Verdict(None, refusal[0], 0, refusal[1], built)


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
    group: RolloutGroup, accept: Acceptance | None = None, source_peer: str = "", *, may_build: bool = True
) -> Verdict:
    """Check a peer's group against the locally regenerated task and re-score it.

    With ``accept`` (what a node passes), the group must be of a family and
    config this node trains on, fit its generation budget and context (see
    :mod:`node.tasks.acceptance`), and, if ``may_build`` is False, be
    regenerable without building anything expensive; the task is regenerated
    with this node's own family instance. Without it (tools, tests) any
    registered family and config is rebuilt from the reference. Either way a
    reference that cannot be regenerated, a prompt that differs from the
    regenerated one and a group whose completions and rewards differ in number
    are refused (``Verdict.group`` is None, ``reason`` says why). Otherwise the
    verdict holds a train group with *local* rewards and the mismatch count.
    """
    found = _regenerate(group, accept, may_build)
    if isinstance(found, Verdict):
        return found
    family, item, built = found
    if group.prompt != item.prompt:
        return _rejected((RejectReason.PROMPT_MISMATCH, ""), built)
    refusal = accept.check_tokens(item.prompt, group.completions) if accept is not None else None
    if refusal is not None:
        return _rejected(refusal, built)
    local = score_completions(family, item, group.completions)
    mismatches = sum(1 for c, r in zip(group.rewards, local, strict=True) if abs(c - r) > REWARD_TOLERANCE)
    if mismatches:
        logger.debug("group from %s: %d claimed rewards differ from local scores", source_peer, mismatches)
    train = TrainGroup(item.prompt, tuple(group.completions), local, source_peer, family.name, group.task)
    return Verdict(train, None, mismatches, built=built)


def _regenerate(
    group: RolloutGroup, accept: Acceptance | None, may_build: bool
) -> tuple[TaskFamily, TaskItem, bool] | Verdict:
    """(family, item, whether it built something), or the refusal; the cheap checks come first."""
    refusal = check_shape(group.completions, group.rewards)
    if refusal is None and accept is not None:
        refusal = accept.check_task(group.task) or accept.check_chars(group.completions)
    if refusal is not None:
        return _rejected(refusal)
    if accept is None:
        try:
            family, item = task_from_ref(group.task)
        except UnknownTask as exc:
            return _rejected((RejectReason.BAD_TASK_REFERENCE, str(exc)))
        return family, item, False
    return _from_own_family(accept.families[group.task.family], group.task, may_build)


def _from_own_family(family: TaskFamily, ref: TaskRef, may_build: bool) -> tuple[TaskFamily, TaskItem, bool] | Verdict:
    built = family.needs_build(ref.seed)
    if built and not may_build:
        return _rejected((RejectReason.BUILD_BUDGET, f"{family.name} seed {ref.seed} needs a build"))
    try:
        item = family.item(ref.seed, ref.index)
    except Exception as exc:  # third-party generators (reasoning-gym) on a peer's seed: refuse, never crash
        return _rejected((RejectReason.BAD_TASK_REFERENCE, f"task {ref.family!r}: {type(exc).__name__}: {exc}"), built)
    return family, item, built
