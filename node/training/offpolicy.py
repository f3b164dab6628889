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

Two bounds hold whatever the preset, because a peer's valid, all-correct groups with junk text around the
right answer can be the only informative rows of a node whose own groups have no signal, most of what it
trains on, and the junk then spreads into the node's own completions:

- **receiver plausibility** (``max_logp_gap``): an external completion whose mean token log-probability under
  this policy lies more than ``max_logp_gap`` nats below the median of this node's own recent completions
  (:class:`OwnLikelihood`) gets weight 0: text this node would never write cannot carry an answer's credit
  into it. Relative to the node's own text, not absolute, so it follows the policy as it sharpens, and the
  margin leaves room for honest peers of other models, whose text scores lower here than this node's own;
- **publisher share** (``max_publisher_share``): no peer supplies more than this share of a step's
  informative rows (non-zero advantage) or of its advantage mass (:func:`share_limit`), the node's own rows
  counted in the whole but never cut, so one peer cannot be all a node learns from, while several peers
  together may fill a step.

Defaults, chosen by measurement on the built-in testbed (docs/EXPERIMENTS.md): the receiver baseline
on (with advantage sampling it turned 0.82x of no sharing into 0.99x, better on 5 of 5 seeds), the
likelihood filter and the importance weights off (each lost to the same configuration without it).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

BASELINES = ("group", "receiver")
OBJECTIVE_BASE: Mapping[str, object] = {
    "baseline": "group", "min_token_logp": None, "is_cap": 0.0, "successes_only": False, "adaptive_share": False,
}  # fmt: skip
"""What every preset of :data:`OBJECTIVES` sets, before its own changes: each preset names every one of these
fields, so that it means the same whatever the node's defaults are."""
_CHANGES: dict[str, dict[str, object]] = {
    "plain": {},
    "filter": {"min_token_logp": -5.0},
    "tis": {"is_cap": 1.0},
    "baseline": {"baseline": "receiver"},
    "baseline+tis": {"baseline": "receiver", "is_cap": 1.0},
    "baseline+guide": {"baseline": "receiver", "successes_only": True},
    "baseline+adapt": {"baseline": "receiver", "adaptive_share": True},
    "baseline+guide+adapt": {"baseline": "receiver", "successes_only": True, "adaptive_share": True},
}
OBJECTIVES: Mapping[str, Mapping[str, object]] = {name: {**OBJECTIVE_BASE, **c} for name, c in _CHANGES.items()}
"""Named presets of :class:`OffPolicyConfig` (``swarm-node experiment --objectives``); ``plain`` is SAPO's
GRPO on peers' completions as if sampled here."""


def default_objective() -> str:
    """The preset that is a node's default: what ``swarm-node experiment`` compares unless told otherwise."""
    node = OffPolicyConfig()
    return next(n for n, p in OBJECTIVES.items() if all(getattr(node, k) == v for k, v in p.items()))


@dataclass(frozen=True)
class OffPolicyConfig:
    """How external (peer-generated) completions enter the GRPO loss."""

    min_token_logp: float | None = field(
        default=None,
        metadata={
            "help": (
                "likelihood filter: drop a peer's completion whose mean token log-prob here is below this (e.g. -5)"
            ),
            "below": 0,
        },
    )
    is_cap: float = field(
        default=0.0,
        metadata={
            "help": "truncated importance weight of a peer's completion: min(p_here / p_publisher, cap); 0: off",
            "min": 0,
            "max": 100,
        },
    )
    baseline: str = field(
        default="receiver",  # measured: docs/EXPERIMENTS.md, "Making shared rollouts teach"
        metadata={
            "help": (
                "baseline of peers' groups: group (their mean) or receiver (this node's mean reward on the family)"
            ),
            "choices": BASELINES,
        },
    )
    baseline_momentum: float = field(
        default=0.9, metadata={"help": "EMA momentum of the receiver's per-family mean reward."}
    )
    min_scale: float = field(
        default=0.5, metadata={"help": "Receiver baseline: advantages are divided by max(group std, this)."}
    )
    # A peer's completion that did worse than this node expects is text of another model pushed down here:
    # lowering the probability of sequences this policy would rarely write moves its mass unpredictably (the
    # strongest models of a mixed swarm fall furthest under it: docs/EXPERIMENTS.md); a peer's success guides.
    successes_only: bool = field(
        default=True,  # measured: docs/EXPERIMENTS.md, "Four architectures in one swarm"
        metadata={
            "help": (
                "success-only guidance, on by default: a peer's completions teach only where they did "
                "better than this node expects (their negative advantages become 0); this flag turns it "
                "off (docs/EXPERIMENTS.md)"
            )
        },
    )
    # 1/3 and a little: with J = 4 external groups a node whose own groups have no signal still learns from
    # three publishers (each exactly a third), and SAPO's 4 local + 4 external with four peers gives each about a
    # quarter; 0.25 would need four informative publishers in every step of such a node, 0.5 lets one peer be
    # half of it.
    max_publisher_share: float = field(
        default=0.34,
        metadata={
            "help": (
                "most of a step's informative rows (non-zero advantage) and of its advantage mass one "
                "peer may supply; this node's own rows count in the whole and are never cut; 1: off"
            ),
            "max": 1,
            "above": 0,
        },
    )
    # Calibrated on the built-in models (SECURITY.md, rollout side): a warm-started tiny-s scores its own
    # chain_sum completions at a median -2.88 nats/token (5th percentile -4.0), honest tiny-m / tiny-gpt2 /
    # tiny-l completions at medians -2.3 to -2.5 and at worst -4.33 (1.45 below its median; its own worst is 1.86
    # below), junk around a right answer at -5.56 to -5.64 (2.4-2.8 below: 2.5 let it through by a hair, live).
    max_logp_gap: float = field(
        default=2.0,
        metadata={
            "help": (
                "plausibility gate: weight 0 for a peer's completion whose mean token log-prob here lies "
                "more than this many nats below the median of this node's own recent completions; 0: off"
            ),
            "min": 0,
            "max": 50,
        },
    )

    adaptive_share: bool = field(
        default=True,  # measured: docs/EXPERIMENTS.md, "Four architectures in one swarm"
        metadata={
            "help": (
                "adaptive share, on by default: each step measures what a peer's group moves this node's "
                "own objective against one of its own, and gives a slot of --external back to its own "
                "groups (one more generated) while peers' do less; this flag keeps all --external slots "
                "for peers' groups"
            )
        },
    )
    share_threshold: float = field(
        default=1.0,
        metadata={
            "help": (
                "the adaptive share keeps peers' groups while one moves this node's objective at least "
                "this many times as far as one of its own"
            ),
            "max": 10,
            "above": 0,
        },
    )

    def __post_init__(self) -> None:
        checks = [
            (0 < self.share_threshold <= 10, f"share_threshold={self.share_threshold}; use a ratio in (0, 10]"),
            (self.min_token_logp is None or self.min_token_logp < 0, "min_token_logp must be negative (or None)"),
            (0 <= self.is_cap <= 100, "is_cap must be in [0, 100] (0: off)"),
            (self.baseline in BASELINES, f"baseline must be one of {BASELINES}"),
            (0 <= self.baseline_momentum < 1, "baseline_momentum must be in [0, 1)"),
            (self.min_scale > 0, "min_scale must be > 0"),
            (
                0 < self.max_publisher_share <= 1,
                f"max_publisher_share={self.max_publisher_share}; use a share in (0, 1], e.g. 0.34 (1: off)",
            ),
            (
                0 <= self.max_logp_gap <= 50,
                f"max_logp_gap={self.max_logp_gap}; use nats per token in [0, 50], e.g. 2.0 (0: off)",
            ),
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


def share_limit(own: float, amounts: Sequence[float], share: float) -> float:
    """The most any one of ``amounts`` may keep so that none exceeds ``share`` of the whole; inf: none must cut.

    The whole is ``own`` (never cut) plus every amount after the cut, so the limit ``L`` is the largest with
    ``L <= share * (own + sum(min(a, L)))``: water-filling, where cutting one publisher also shrinks the
    whole the others are measured against. Several publishers at the limit may together fill the step
    (three at a third each), but one alone, beside nothing of the node's own, keeps nothing.

    >>> share_limit(0.0, [10.0], 0.5), share_limit(10.0, [30.0], 0.5)
    (0.0, 10.0)
    >>> share_limit(0.0, [8.0, 8.0, 8.0], 0.34)  # three publishers, each a third: nothing to cut
    inf
    >>> round(share_limit(4.0, [20.0, 4.0], 0.34), 4)  # 0.34 * (4 + 4 + L) = L
    4.1212
    """
    if share >= 1 or not amounts:
        return math.inf

    def slack(limit: float) -> float:  # concave, piecewise linear, slack(0) = share * own >= 0
        return share * (own + sum(min(a, limit) for a in amounts)) - limit

    points = sorted({0.0, *amounts})
    if slack(points[-1]) >= 0:
        return math.inf
    below = 0.0
    for point in points[1:]:
        if slack(point) < 0:  # the largest root lies in [below, point], where slack is linear
            s0, s1 = slack(below), slack(point)
            return below + (point - below) * s0 / (s0 - s1)
        below = point
    return below  # not reached: slack(points[-1]) < 0


@dataclass
class OwnLikelihood:
    """This node's own recent completions' mean token log-probabilities under its policy (a bounded window).

    The reference of the plausibility gate: only this node's own samples feed it, so no peer can move it.
    """

    window: int = 256
    values: deque[float] = field(default_factory=deque)

    def add(self, values: Sequence[float]) -> None:
        """Fold in the mean token log-probabilities of this node's own completions (the oldest fall out)."""
        self.values.extend(v for v in values if math.isfinite(v))
        while len(self.values) > self.window:
            self.values.popleft()

    def median(self) -> float | None:
        """The median of the window; None before any own completion."""
        return statistics.median(self.values) if self.values else None

    def floor(self, gap: float) -> float | None:
        """The lowest mean token log-probability a peer's completion may have here; None: no reference yet."""
        median = self.median()
        return None if median is None or gap <= 0 else median - gap
