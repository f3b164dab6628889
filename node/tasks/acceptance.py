"""What a node accepts from its peers, derived from the node itself.

A peer may share any family, config, seed and completion the protocol allows
(16,384 characters per completion), but a node only takes what it could have
produced itself: groups of the task families *and configs* it trains on,
completions no longer than its own generation budget, and prompt plus
completion within its model's context. Everything else is refused by a counted
:class:`~node.tasks.reasons.RejectReason` before it costs anything that grows
with its size (a validly signed batch of 1,000-character completions would
overrun a GPT-2 node's 256-position table, and cost a Llama node seconds and
a gigabyte per round).

Checks come cheapest first, so that refusing is cheaper than what is refused:
the family and config are dictionary look-ups; the completion length is first
checked in characters (a completion longer than ``max_completion_tokens *
max_token_chars`` characters cannot fit, whatever the tokenizer does, so a
16,384-character string is refused without being tokenised); only then are
prompt and completions tokenised, each completion once, stopping at the first
that does not fit. Token counting is injected (this package has no torch), so
everything here is pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from node.tasks.base import TaskFamily
from node.tasks.reasons import RejectReason
from protocol.schema import RolloutGroup, TaskRef

Refusal = tuple[RejectReason, str]
"""A reason and a detail for the log."""


@dataclass(frozen=True)
class Acceptance:
    """The acceptance policy of one node (see the module docstring).

    ``families`` maps each family name this node trains on to its own family
    instance (so its config and digest are the accepted ones, and an accepted
    group is regenerated with this node's instance, never a freshly built one).
    ``completion_tokens(text)`` counts a completion's tokens without special
    tokens; ``prompt_tokens(prompt)`` counts the prompt as the model sees it
    (chat template included). ``max_token_chars`` is the most characters one
    token of the tokenizer can stand for; ``context_tokens`` is the model's
    position table (None: the model declares none, no context check).
    """

    families: Mapping[str, TaskFamily]
    max_completion_tokens: int
    max_token_chars: int
    context_tokens: int | None
    completion_tokens: Callable[[str], int]
    prompt_tokens: Callable[[str], int]
    max_completions: int | None = None
    """Most completions taken from one peer group (this node's own G); the rest are cut, never
    looked at. None: all. A publisher's weight in a step grows with its rows, so a group of 64
    identical completions must count no more than one this node would have generated."""

    def __post_init__(self) -> None:
        if not self.families:
            raise ValueError("Acceptance needs the node's task families (at least one)")
        if self.max_completion_tokens < 1:
            raise ValueError(f"max_completion_tokens={self.max_completion_tokens}; use the generation budget (>= 1)")
        if self.max_token_chars < 1:
            raise ValueError(f"max_token_chars={self.max_token_chars}; use the tokenizer's longest token (>= 1)")
        if self.max_completions is not None and self.max_completions < 1:
            raise ValueError(f"max_completions={self.max_completions}; use the node's own G (>= 1) or None")
        if self.context_tokens is not None and self.context_tokens < 2:
            raise ValueError(f"context_tokens={self.context_tokens}; use the model's positions (>= 2) or None")

    @property
    def max_completion_chars(self) -> int:
        """The longest completion, in characters, that could be within the token budget."""
        return self.max_completion_tokens * self.max_token_chars

    def trim(self, group: RolloutGroup) -> tuple[RolloutGroup, int]:
        """``group`` with at most ``max_completions`` completions (its first ones), and how many were cut.

        The first ones: an honest publisher's completions are independent samples, so any subset
        is as good as another, and a dishonest one chooses all of them anyway.
        """
        keep = self.max_completions
        if keep is None or len(group.completions) <= keep or len(group.completions) != len(group.rewards):
            return group, 0  # a bad shape is refused by check_shape, whole
        logprobs = group.logprobs[:keep] if group.logprobs is not None else None
        cut = dataclasses.replace(
            group, completions=group.completions[:keep], rewards=group.rewards[:keep], logprobs=logprobs
        )
        return cut, len(group.completions) - keep

    def check_task(self, ref: TaskRef) -> Refusal | None:
        """Refuse a family this node does not train on, or a config (or digest) other than its own."""
        family = self.families.get(ref.family)
        if family is None:
            return RejectReason.FAMILY_NOT_ACCEPTED, repr(ref.family)
        if ref.config_digest != family.digest or ref.config != family.config:
            return RejectReason.CONFIG_NOT_ACCEPTED, f"{ref.family} config {ref.config_digest}, ours {family.digest}"
        return None

    def check_chars(self, completions: Sequence[str]) -> Refusal | None:
        """Refuse, without tokenising, a completion with more characters than the budget can hold."""
        limit = self.max_completion_chars
        longest = max((len(c) for c in completions), default=0)
        if longest > limit:
            return RejectReason.COMPLETION_TOO_LONG, f"{longest} characters, at most {limit} fit the budget"
        return None

    def check_tokens(self, prompt: str, completions: Sequence[str]) -> Refusal | None:
        """Refuse a completion over the token budget, or prompt + completion + eos over the context."""
        room = None
        if self.context_tokens is not None:
            room = self.context_tokens - self.prompt_tokens(prompt) - 1  # eos is appended when training
        for text in completions:
            n = self.completion_tokens(text)
            if n > self.max_completion_tokens:
                return RejectReason.COMPLETION_TOO_LONG, f"{n} tokens, budget {self.max_completion_tokens}"
            if room is not None and n > room:
                return RejectReason.CONTEXT_OVERFLOW, f"{n} completion tokens, {max(room, 0)} left by the prompt"
        return None


def check_shape(completions: Sequence[str], rewards: Sequence[float]) -> Refusal | None:
    """Refuse a group without completions or with a claimed reward count that differs from them."""
    if not completions or len(completions) != len(rewards):
        return RejectReason.BAD_GROUP_SHAPE, "need >= 1 completion and one claimed reward per completion"
    return None
