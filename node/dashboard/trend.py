"""Is a node learning? A one-line verdict on its held-out accuracy, or else its training reward.

A change counts only when it is larger than the noise of the figures it
compares, so a curve that wanders is called flat rather than learning:

* held-out accuracy compares the first and the latest evaluation, which score
  the same ``items`` questions; the bound is a two-proportion test's,
  ``HELDOUT_Z`` standard errors of the difference at the pooled accuracy;
* training reward compares the mean of the first and the last quarter of the
  rounds; the bound is ``REWARD_Z`` standard errors of the difference of the
  two means. Neighbouring rounds' rewards are correlated, so the bound takes
  more standard errors than the held-out one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

HELDOUT_Z = 2.0
REWARD_Z = 3.0
MIN_REWARD_ROUNDS = 20
"""Rounds before a reward verdict: each quarter then holds at least five of them."""
DEFAULT_ITEMS = 64
"""Questions assumed when an evaluation does not say (the node's ``--eval-items`` default)."""


class Trend(Enum):
    """What the curve does, beyond its noise."""

    LEARNING = "learning"
    FLAT = "flat"
    WORSE = "getting worse"
    TOO_EARLY = "too early to tell"


class Source(Enum):
    """The figure a verdict rests on."""

    HELDOUT = "held-out"
    REWARD = "reward"


@dataclass(frozen=True)
class Verdict:
    """A trend, the figures it compares (start -> end over ``rounds``) and the noise bound ``margin``."""

    trend: Trend
    source: Source
    start: float | None = None
    end: float | None = None
    rounds: int = 0
    margin: float = 0.0

    def text(self) -> str:
        """One line for the page.

        >>> Verdict(Trend.LEARNING, Source.HELDOUT, 0.41, 0.58, 120, 0.05).text()
        'learning: held-out 0.41 -> 0.58 over 120 rounds (noise +-0.05)'
        >>> Verdict(Trend.TOO_EARLY, Source.REWARD, rounds=3).text()
        'too early to tell: reward over 3 rounds'
        """
        if self.start is None or self.end is None:
            return f"{self.trend.value}: {self.source.value} over {self.rounds} rounds"
        change = f"{self.start:.2f} -> {self.end:.2f} over {self.rounds} rounds"
        return f"{self.trend.value}: {self.source.value} {change} (noise +-{self.margin:.2f})"

    def to_json(self) -> dict[str, object]:
        """The verdict in the dashboard JSON: its fields and its line."""
        return {
            "trend": self.trend.value, "source": self.source.value, "start": self.start, "end": self.end,
            "rounds": self.rounds, "margin": self.margin, "text": self.text(),
        }  # fmt: skip


def _decide(change: float, margin: float) -> Trend:
    if change > margin:
        return Trend.LEARNING
    if change < -margin:
        return Trend.WORSE
    return Trend.FLAT


def heldout_verdict(series: Sequence[tuple[int, float]], items: int | None) -> Verdict:
    """The trend of held-out accuracy from the first evaluation to the latest, ``series`` as (round, accuracy).

    >>> heldout_verdict([(0, 0.30), (50, 0.60)], 64).trend
    <Trend.LEARNING: 'learning'>
    >>> heldout_verdict([(0, 0.30), (50, 0.36)], 64).trend  # 4 questions of 64: within the noise
    <Trend.FLAT: 'flat'>
    """
    if len(series) < 2:
        return Verdict(Trend.TOO_EARLY, Source.HELDOUT, rounds=series[-1][0] - series[0][0] if series else 0)
    (r0, a0), (r1, a1) = series[0], series[-1]
    n = items if items else DEFAULT_ITEMS
    pooled = (a0 + a1) / 2
    margin = HELDOUT_Z * math.sqrt(2 * pooled * (1 - pooled) / n)
    return Verdict(_decide(a1 - a0, margin), Source.HELDOUT, a0, a1, r1 - r0, margin)


def reward_verdict(series: Sequence[tuple[int, float]]) -> Verdict:
    """The trend of the training reward, the first quarter of ``series`` (round, reward) against the last.

    >>> reward_verdict([(r, r / 100) for r in range(1, 41)]).trend
    <Trend.LEARNING: 'learning'>
    >>> reward_verdict([(r, r % 2) for r in range(1, 41)]).trend  # alternating 0, 1: noise only
    <Trend.FLAT: 'flat'>
    """
    rounds = series[-1][0] - series[0][0] if series else 0
    if len(series) < MIN_REWARD_ROUNDS:
        return Verdict(Trend.TOO_EARLY, Source.REWARD, rounds=rounds)
    quarter = len(series) // 4
    first, last = [y for _, y in series[:quarter]], [y for _, y in series[-quarter:]]
    se = math.sqrt(statistics.variance(first) / quarter + statistics.variance(last) / quarter)
    start, end = statistics.fmean(first), statistics.fmean(last)
    return Verdict(_decide(end - start, REWARD_Z * se), Source.REWARD, start, end, rounds, REWARD_Z * se)


def node_verdict(
    heldout: Sequence[tuple[int, float]], items: int | None, rewards: Sequence[tuple[int, float]]
) -> Verdict:
    """Held-out accuracy's verdict once there are two evaluations (the figure that generalizes), else the reward's."""
    if len(heldout) >= 2:
        return heldout_verdict(heldout, items)
    return reward_verdict(rewards)


def swarm_line(trends: Sequence[Trend]) -> str:
    """The nodes' trends in one line, most common first.

    >>> swarm_line([Trend.LEARNING] * 3 + [Trend.FLAT])
    '3 of 4 nodes learning, 1 flat'
    >>> swarm_line([])
    'no node yet'
    """
    if not trends:
        return "no node yet"
    counts = {t: sum(x is t for x in trends) for t in Trend}
    shown = sorted((t for t in Trend if counts[t]), key=lambda t: -counts[t])
    head, *rest = shown
    noun = "node" if len(trends) == 1 else "nodes"
    parts = [f"{counts[head]} of {len(trends)} {noun} {head.value}", *(f"{counts[t]} {t.value}" for t in rest)]
    return ", ".join(parts)
