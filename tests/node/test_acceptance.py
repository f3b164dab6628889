"""The acceptance policy: a node takes only groups it could have produced itself, and refusing is cheap.

Each rule has its own reason (``RejectReason``); the character pre-check and the
family/config rules are shown to cost no tokenisation and no dataset build.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import reasoning_gym

from node.tasks import reasoning_gym as rg
from node.tasks.acceptance import Acceptance
from node.tasks.base import TaskFamily
from node.tasks.heldout import training_item
from node.tasks.reasons import FAULTS, RejectReason
from node.tasks.registry import build_task, rollout_group
from node.tasks.verify import verify_external
from protocol import limits
from protocol.schema import RolloutGroup, TaskRef

MAX = build_task("max")


class Tokens:
    """A token counter that counts its own calls: ``chars_per_token`` characters make one token."""

    def __init__(self, chars_per_token: int = 1) -> None:
        self.chars_per_token = chars_per_token
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return math.ceil(len(text) / self.chars_per_token)


def policy(
    *families: TaskFamily,
    budget: int = 3,
    token_chars: int = 1,
    context: int | None = 64,
    tokens: Tokens | None = None,
) -> Acceptance:
    counter = tokens or Tokens()
    fams = families or (MAX,)
    return Acceptance(
        families={f.name: f for f in fams},
        max_completion_tokens=budget,
        max_token_chars=token_chars,
        context_tokens=context,
        completion_tokens=counter,
        prompt_tokens=lambda p: counter(p) + 1,  # + bos
    )


def honest(family: TaskFamily = MAX, seed: int = 1, completions: Sequence[str] | None = None) -> RolloutGroup:
    item = training_item(family, seed, 7)
    comps = list(completions) if completions is not None else [item.answer, "x", item.answer, "y"]
    return rollout_group(item, comps, [family.score(item, c) for c in comps], "tiny-s")


class Builds(list[str]):
    """The reasoning-gym datasets built (by name) since :meth:`forget`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.monkeypatch = monkeypatch

    def forget(self) -> None:
        """A fresh, empty dataset cache (what a receiving node has not built yet), and no builds counted."""
        self.monkeypatch.setattr(rg, "_DATASETS", rg.DatasetCache(64))
        self.clear()


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Builds]:
    """Counts every reasoning-gym dataset built; call ``forget()`` once the peer's groups are made."""
    built = Builds(monkeypatch)
    real = reasoning_gym.create_dataset

    def counting(name: str, **kw: object) -> object:
        built.append(name)
        return real(name, **kw)

    monkeypatch.setattr(reasoning_gym, "create_dataset", counting)
    yield built


def test_an_honest_group_of_our_family_and_config_is_accepted_with_local_rewards() -> None:
    group = dataclasses.replace(honest(), rewards=(1.0, 1.0, 1.0, 1.0))  # two claims inflated
    v = verify_external(group, policy(), source_peer="peerA")
    assert v.ok and v.group is not None and v.reason is None and not v.built
    assert v.group.rewards == (1.0, 0.0, 1.0, 0.0) and v.reward_mismatches == 2
    assert v.group.source_peer == "peerA" and v.group.task_family == "max" and v.group.informative


def test_a_family_this_node_does_not_train_is_refused_without_building_anything(builds: Builds) -> None:
    foreign = honest(build_task("rg:basic_arithmetic"), seed=123_456)
    builds.forget()  # building the attacker's group is not the receiver's cost
    tokens = Tokens()
    for group in (foreign, dataclasses.replace(foreign, task=TaskRef.make("chess", {}, 0, 0))):
        v = verify_external(group, policy(tokens=tokens))
        assert v.reason is RejectReason.FAMILY_NOT_ACCEPTED and not v.ok and not v.built
    assert builds == [] and tokens.calls == 0


def test_only_our_config_is_accepted_compared_by_digest_and_value() -> None:
    other = honest(build_task("max", {"digits": 6}))
    assert verify_external(other, policy()).reason is RejectReason.CONFIG_NOT_ACCEPTED
    ours = honest()
    forged_digest = dataclasses.replace(ours, task=dataclasses.replace(ours.task, config_digest="f" * 16))
    v = verify_external(forged_digest, policy())
    assert v.reason is RejectReason.CONFIG_NOT_ACCEPTED and MAX.digest in v.detail
    # our digest on another config (the protocol checks digests at decoding; this rule does not rely on it)
    swapped = dataclasses.replace(ours, task=dataclasses.replace(other.task, config_digest=MAX.digest))
    assert verify_external(swapped, policy()).reason is RejectReason.CONFIG_NOT_ACCEPTED


def test_a_completion_longer_than_the_budget_in_characters_is_refused_without_tokenising() -> None:
    tokens = Tokens()
    huge = honest(completions=["7", "9" * limits.MAX_TEXT_CHARS])
    v = verify_external(huge, policy(budget=3, token_chars=1, tokens=tokens))
    assert v.reason is RejectReason.COMPLETION_TOO_LONG and "16384 characters" in v.detail
    assert tokens.calls == 0
    # the pre-check bound is budget x longest token: 4 characters may be one token, so 12 characters pass it
    assert policy(budget=3, token_chars=4).max_completion_chars == 12


def test_a_completion_over_the_token_budget_is_refused_after_tokenising() -> None:
    tokens = Tokens(chars_per_token=1)
    accept = policy(budget=3, token_chars=4, tokens=tokens)  # 8 characters pass the pre-check (<= 12)
    v = verify_external(honest(completions=["7", "abcdefgh"]), accept)
    assert v.reason is RejectReason.COMPLETION_TOO_LONG and v.detail == "8 tokens, budget 3"
    assert tokens.calls >= 1
    within = verify_external(honest(completions=["7", "abc"]), accept)
    assert within.ok


def test_prompt_plus_completion_past_the_context_is_refused() -> None:
    group = honest(completions=["ab", "cd"])
    prompt_tokens = len(group.prompt) + 1  # the fake counts one token per character, plus bos
    fits = policy(budget=8, context=prompt_tokens + 2 + 1)  # prompt + 2 completion tokens + eos
    assert verify_external(group, fits).ok
    v = verify_external(group, policy(budget=8, context=prompt_tokens + 2))
    assert v.reason is RejectReason.CONTEXT_OVERFLOW and v.detail == "2 completion tokens, 1 left by the prompt"
    assert verify_external(group, policy(budget=8, context=None)).ok  # no position table: no context rule


def test_a_new_seed_needing_a_dataset_build_is_refused_when_the_build_budget_is_spent(builds: Builds) -> None:
    family = build_task("rg:chain_sum")
    group = honest(family, seed=987_654, completions=["<answer>1</answer>", "<answer>2</answer>"])
    builds.forget()
    accept = policy(family, budget=32, token_chars=1, context=None)
    assert family.needs_build(987_654)

    spent = verify_external(group, accept, may_build=False)
    assert spent.reason is RejectReason.BUILD_BUDGET and not spent.built and builds == []

    first = verify_external(group, accept, may_build=True)
    assert first.ok and first.built and builds == ["chain_sum"]
    again = verify_external(group, accept, may_build=False)  # cached now: no budget needed
    assert again.ok and not again.built and builds == ["chain_sum"]


class Fragile(TaskFamily):
    """A family whose generator fails on some seeds, as third-party code might on a peer's seed."""

    name = "fragile"

    def generate(self, rng: random.Random) -> tuple[str, str]:
        if rng.random() < 0.5:
            raise RuntimeError("generator failed")
        return "q=", "a"


def test_a_generator_failing_on_a_peers_seed_is_a_refusal_not_a_crash() -> None:
    family = Fragile()
    ok_seed = next(s for s in range(100) if family._rng(s, 0).random() >= 0.5)
    bad_seed = next(s for s in range(100) if family._rng(s, 0).random() < 0.5)
    good = rollout_group(training_item(family, ok_seed, 0), ["a", "b"], [1.0, 0.0], "tiny-s")
    bad = dataclasses.replace(good, task=TaskRef.make("fragile", {}, bad_seed, 0))
    assert verify_external(good, policy(family)).ok
    v = verify_external(bad, policy(family))
    assert v.reason is RejectReason.BAD_TASK_REFERENCE and "RuntimeError: generator failed" in v.detail


def test_only_faults_an_honest_peer_cannot_cause_count_against_a_peer() -> None:
    assert {RejectReason.BAD_TASK_REFERENCE, RejectReason.PROMPT_MISMATCH, RejectReason.BAD_GROUP_SHAPE} == FAULTS
    tampered = dataclasses.replace(honest(), prompt="max 0000=")
    assert verify_external(tampered, policy()).reason in FAULTS
    assert verify_external(honest(build_task("max", {"digits": 6})), policy()).reason not in FAULTS


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("families", {}, "task families"),
        ("max_completion_tokens", 0, "generation budget"),
        ("max_token_chars", 0, "longest token"),
        ("context_tokens", 1, "model's positions"),
    ],
)
def test_a_bad_policy_names_the_fix(field: str, value: Any, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        dataclasses.replace(policy(), **{field: value})


def test_a_group_larger_than_the_nodes_own_is_cut_to_g_before_it_is_tokenised() -> None:
    tokens = Tokens()
    accept = dataclasses.replace(policy(tokens=tokens), max_completions=4)
    item = training_item(MAX, 3, 0)
    big = dataclasses.replace(rollout_group(item, [item.answer] * 64, [1.0] * 64, "m"), logprobs=(-1.0,) * 64)
    verdict = verify_external(big, accept)
    assert verdict.group is not None and verdict.trimmed == 60
    assert len(verdict.group.completions) == len(verdict.group.rewards) == 4
    assert verdict.group.behaviour_logprobs is not None and len(verdict.group.behaviour_logprobs) == 4
    assert tokens.calls <= 1 + 4  # the prompt and the kept completions only
    small = rollout_group(item, [item.answer] * 3, [1.0] * 3, "m")
    assert verify_external(small, accept).trimmed == 0
    with pytest.raises(ValueError, match="max_completions"):
        dataclasses.replace(accept, max_completions=0)
