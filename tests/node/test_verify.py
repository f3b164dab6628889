"""verify_external without an acceptance policy (any registered family): tampered prompts are refused,
claimed rewards are counted and replaced. The acceptance rules are in test_acceptance.py."""

from __future__ import annotations

import dataclasses

from node.tasks.heldout import training_item
from node.tasks.registry import TaskItem, build_task, rollout_group
from node.tasks.verify import RejectReason, local_group, verify_external
from protocol.schema import RolloutGroup, TaskRef


def _honest(name: str = "max") -> tuple[TaskItem, RolloutGroup]:
    fam = build_task(name)
    item = training_item(fam, 1, 7)
    wrong = "x"
    comps = [item.answer, wrong, item.answer, wrong]
    return item, rollout_group(item, comps, [1.0, 0.0, 1.0, 0.0], "tiny-s")


def test_honest_group_is_accepted_with_local_rewards() -> None:
    item, group = _honest()
    verdict = verify_external(group, source_peer="peerA")
    assert verdict.ok and verdict.reason is None and verdict.reward_mismatches == 0
    assert verdict.group is not None
    assert verdict.group.rewards == (1.0, 0.0, 1.0, 0.0)
    assert verdict.group.source_peer == "peerA" and verdict.group.task_family == "max"
    assert verdict.group.task_ref == group.task
    assert verdict.group.prompt == item.prompt


def test_inflated_rewards_are_counted_and_not_used() -> None:
    _, group = _honest()
    inflated = dataclasses.replace(group, rewards=(1.0, 1.0, 1.0, 1.0))
    verdict = verify_external(inflated, None)
    assert verdict.group is not None
    assert verdict.reward_mismatches == 2
    assert verdict.group.rewards == (1.0, 0.0, 1.0, 0.0)  # the local scores


def test_tampered_prompt_is_rejected() -> None:
    _, group = _honest()
    tampered = dataclasses.replace(group, prompt="max 1111=")
    verdict = verify_external(tampered, None)
    assert not verdict.ok and verdict.group is None and verdict.reason is RejectReason.PROMPT_MISMATCH


def test_bad_references_are_rejected() -> None:
    _, group = _honest()
    unknown = dataclasses.replace(group, task=TaskRef.make("chess", {}, 0, 0))
    v = verify_external(unknown, None)
    assert v.group is None and v.reason is RejectReason.BAD_TASK_REFERENCE and "unknown task family" in v.detail
    bad_digest = dataclasses.replace(group, task=dataclasses.replace(group.task, config_digest="f" * 16))
    v = verify_external(bad_digest, None)
    assert v.reason is RejectReason.BAD_TASK_REFERENCE and "digest" in v.detail
    bad_cfg = dataclasses.replace(group, task=TaskRef.make("max", {"digits": 500}, 1, 7))
    v = verify_external(bad_cfg, None)
    assert v.reason is RejectReason.BAD_TASK_REFERENCE and "outside" in v.detail


def test_bad_group_shape_is_rejected() -> None:
    _, group = _honest()
    short = dataclasses.replace(group, rewards=(1.0, 0.0))
    assert verify_external(short).reason is RejectReason.BAD_GROUP_SHAPE
    empty = dataclasses.replace(group, completions=(), rewards=())
    assert verify_external(empty).reason is RejectReason.BAD_GROUP_SHAPE


def test_local_group_scores_locally() -> None:
    fam = build_task("parity")
    item = training_item(fam, 2, 3)
    other = "1" if item.answer == "0" else "0"
    group = local_group(fam, item, [item.answer, other, " " + item.answer])
    assert group.rewards == (1.0, 0.0, 1.0) and group.task_ref == item.ref and group.source_peer == "self"
