"""Off-policy-aware use of external completions: likelihood filter, truncated importance weights, baselines.

A peer's completion was sampled by the *peer's* policy (often another architecture), yet the clipped
GRPO objective treats it as if this node had sampled it. Asynchronous RL systems correct that gap
between behaviour policy and learner with importance weights and staleness control (AReaL's
decoupled objective, LlamaRL's truncated importance sampling); SAPO does not. Three options, each
off by default and each pure (time and randomness play no part):

- **likelihood filter** (``min_token_logp``): an external completion whose mean token log-probability
  under this node's policy is below the bound gets weight 0 (the receiver would practically never
  produce it, so its advantage says little about the receiver's own behaviour);
- **truncated importance weight** (``is_cap``): each external completion's loss is weighted by
  ``min(p_own / p_publisher, is_cap)`` on the whole sequence, with ``p_publisher`` the publisher's
  own claim (``RolloutGroup.logprobs``, text-level so tokenizers may differ). A claim is a claim:
  whatever a peer says (or omits), the weight stays in ``[0, is_cap]``, so a lie moves nothing beyond
  what a completion of that weight moves anyway, and claiming a *higher* probability only lowers the
  liar's own weight;
- **receiver-side baseline** (``baseline="receiver"``): an external group's advantages are its
  rewards minus this node's own running mean reward on that task family (its expected reward there),
  divided by ``max(group std, min_scale)``. An all-correct peer group on a family this node mostly
  fails then carries signal (the group-mean baseline gives it none), and an all-wrong one is near 0.

Local completions always keep weight 1 and the group-mean baseline.

Defaults, chosen by measurement on the built-in testbed (docs/EXPERIMENTS.md): the receiver baseline
on (with advantage sampling it turned 0.82x of no sharing into 0.99x, better on 5 of 5 seeds), the
likelihood filter and the importance weights off (each lost to the same configuration without it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

BASELINES = ("group", "receiver")
OBJECTIVES: Mapping[str, Mapping[str, object]] = {
    "plain": {"baseline": "group"},
    "filter": {"baseline": "group", "min_token_logp": -5.0},
    "tis": {"baseline": "group", "is_cap": 1.0},
    "baseline": {"baseline": "receiver"},
    "baseline+tis": {"baseline": "receiver", "is_cap": 1.0},
}
"""Named presets of :class:`OffPolicyConfig` (``swarm-node experiment --objectives``); ``plain`` is SAPO's
GRPO on peers' completions as if sampled here. Each names its baseline, whatever the default."""


@dataclass(frozen=True)
class OffPolicyConfig:
    """How external (peer-generated) completions enter the GRPO loss."""

    min_token_logp: float | None = field(
        default=None,
        metadata={"help": "Likelihood filter: drop an external completion whose mean token log-prob under this "
                  "policy is below this (e.g. -5); None keeps all."},
    )  # fmt: skip
    is_cap: float = field(
        default=0.0,
        metadata={"help": "Truncated importance weight: weight an external completion by min(p_own/p_publisher, "
                  "cap) on the sequence (publisher's claimed log-prob); 0 turns it off."},
    )  # fmt: skip
    baseline: str = field(
        default="receiver",  # measured: docs/EXPERIMENTS.md, "Making shared rollouts teach"
        metadata={"help": "External groups' baseline: group (their own mean) or receiver (this node's running "
                  "mean reward on the task family)."},
    )  # fmt: skip
    baseline_momentum: float = field(
        default=0.9, metadata={"help": "EMA momentum of the receiver's per-family mean reward."}
    )
    min_scale: float = field(
        default=0.5, metadata={"help": "Receiver baseline: advantages are divided by max(group std, this)."}
    )

    def __post_init__(self) -> None:
        checks = [
            (self.min_token_logp is None or self.min_token_logp < 0, "min_token_logp must be negative (or None)"),
            (0 <= self.is_cap <= 100, "is_cap must be in [0, 100] (0: off)"),
            (self.baseline in BASELINES, f"baseline must be one of {BASELINES}"),
            (0 <= self.baseline_momentum < 1, "baseline_momentum must be in [0, 1)"),
            (self.min_scale > 0, "min_scale must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"OffPolicyConfig: {message}")

    @property
    def weighted(self) -> bool:
        """Whether external completions get per-completion weights (filter or importance weights)."""
        return self.min_token_logp is not None or self.is_cap > 0

    @classmethod
    def preset(cls, name: str) -> OffPolicyConfig:
        """The named preset of :data:`OBJECTIVES`; an unknown name is a ValueError naming the choices."""
        if name not in OBJECTIVES:
            raise ValueError(f"objective {name!r}; use one of {', '.join(OBJECTIVES)}")
        return cls(**OBJECTIVES[name])  # type: ignore[arg-type]


def completion_weight(
    own_seq_logp: float, own_tokens: int, claimed_seq_logp: float | None, cfg: OffPolicyConfig
) -> float:
    """The loss weight of one external completion, in ``[0, max(1, is_cap)]``.

    ``own_seq_logp`` is this policy's log-probability of the completion's tokens (eos included),
    ``own_tokens`` their number; ``claimed_seq_logp`` the publisher's claim (None: none was sent).

    >>> cfg = OffPolicyConfig(is_cap=1.0)
    >>> round(completion_weight(-3.0, 2, -1.0, cfg), 4)  # p_own / p_pub = e^-2
    0.1353
    >>> completion_weight(-1.0, 2, -3.0, cfg)  # more likely here than there: truncated at the cap
    1.0
    >>> completion_weight(-12.0, 2, None, OffPolicyConfig(min_token_logp=-5.0))  # mean -6 < -5: filtered
    0.0
    """
    if cfg.min_token_logp is not None and own_seq_logp / max(own_tokens, 1) < cfg.min_token_logp:
        return 0.0
    if cfg.is_cap <= 0:
        return 1.0
    if claimed_seq_logp is None:  # no claim: as if the publisher's probability equalled ours
        return min(1.0, cfg.is_cap)
    log_ratio = own_seq_logp - claimed_seq_logp
    return cfg.is_cap if log_ratio >= math.log(cfg.is_cap) else math.exp(log_ratio)


def receiver_advantages(rewards: Sequence[float], baseline: float, min_scale: float) -> list[float]:
    """Rewards minus this node's expected reward, divided by ``max(group std, min_scale)``.

    >>> receiver_advantages([1.0, 1.0], baseline=0.2, min_scale=0.5)  # all correct, rarely so here
    [1.6, 1.6]
    """
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    scale = max(std, min_scale)
    return [(r - baseline) / scale for r in rewards]


@dataclass
class FamilyBaseline:
    """This node's running mean reward per task family, from its *own* completions only.

    Peers' rewards never feed it (they are re-scored locally, but they measure the peer's policy).
    Bounded: one float per task family this node trains on.
    """

    momentum: float = 0.9
    means: dict[str, float] = field(default_factory=dict)

    def update(self, family: str, rewards: Sequence[float]) -> None:
        """Fold one local group's mean reward into the family's running mean."""
        if not rewards:
            return
        value = sum(rewards) / len(rewards)
        old = self.means.get(family)
        self.means[family] = value if old is None else self.momentum * old + (1 - self.momentum) * value

    def get(self, family: str) -> float | None:
        """The running mean for ``family``; None before any local group of it."""
        return self.means.get(family)
