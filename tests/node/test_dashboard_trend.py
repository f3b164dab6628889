"""The dashboard's "is it learning?" verdict: a change counts only beyond the noise of what it compares."""

from __future__ import annotations

import random

import pytest

from node.dashboard.trend import (
    HELDOUT_Z,
    MIN_REWARD_ROUNDS,
    Source,
    Trend,
    heldout_verdict,
    node_verdict,
    reward_verdict,
    swarm_line,
)


def test_heldout_change_beyond_the_binomial_noise_is_learning_or_worse() -> None:
    up = heldout_verdict([(0, 0.41), (60, 0.50), (120, 0.58)], 326)
    assert (up.trend, up.source, up.start, up.end, up.rounds) == (Trend.LEARNING, Source.HELDOUT, 0.41, 0.58, 120)
    assert up.text().startswith("learning: held-out 0.41 -> 0.58 over 120 rounds")
    assert heldout_verdict([(0, 0.58), (120, 0.41)], 326).trend is Trend.WORSE


def test_the_same_change_on_fewer_questions_is_within_the_noise() -> None:
    """0.41 -> 0.50 is 29 of 326 questions but 6 of 64: the margin widens as 1/sqrt(items)."""
    assert heldout_verdict([(0, 0.41), (50, 0.50)], 326).trend is Trend.LEARNING
    small = heldout_verdict([(0, 0.41), (50, 0.50)], 64)
    assert small.trend is Trend.FLAT
    assert small.margin == pytest.approx(HELDOUT_Z * (2 * 0.455 * 0.545 / 64) ** 0.5)


def test_a_single_evaluation_is_too_early() -> None:
    assert heldout_verdict([(0, 0.3)], 64).trend is Trend.TOO_EARLY
    assert heldout_verdict([], 64).text() == "too early to tell: held-out over 0 rounds"


def test_rising_reward_is_learning_and_pure_noise_is_flat() -> None:
    rng = random.Random(3)
    rising = [(r, r / 200 + rng.gauss(0, 0.05)) for r in range(1, 201)]
    noise = [(r, 0.5 + rng.gauss(0, 0.2)) for r in range(1, 201)]
    falling = [(r, 1 - y) for r, y in rising]
    assert reward_verdict(rising).trend is Trend.LEARNING
    assert reward_verdict(noise).trend is Trend.FLAT
    assert reward_verdict(falling).trend is Trend.WORSE
    v = reward_verdict(rising)
    assert v.source is Source.REWARD and v.rounds == 199
    assert v.start is not None and v.end is not None and v.start < 0.2 < 0.8 < v.end


def test_noise_alone_is_flat_in_nearly_every_run() -> None:
    """The bound is wide enough that a curve with no trend is rarely called learning (false alarms)."""
    rng = random.Random(11)
    calls = [reward_verdict([(r, rng.random()) for r in range(1, 101)]).trend for _ in range(300)]
    assert calls.count(Trend.FLAT) >= 0.97 * len(calls)


def test_few_rounds_are_too_early() -> None:
    short = [(r, r / 10) for r in range(1, MIN_REWARD_ROUNDS)]
    assert reward_verdict(short).trend is Trend.TOO_EARLY
    assert reward_verdict([(r, r / 10) for r in range(1, MIN_REWARD_ROUNDS + 1)]).trend is Trend.LEARNING


def test_held_out_is_preferred_once_evaluated_twice() -> None:
    rewards = [(r, 0.5) for r in range(1, 101)]  # flat reward
    assert node_verdict([(0, 0.2), (100, 0.6)], 326, rewards).source is Source.HELDOUT
    one_eval = node_verdict([(0, 0.2)], 326, rewards)
    assert (one_eval.source, one_eval.trend) == (Source.REWARD, Trend.FLAT)


def test_swarm_line_counts_the_nodes_trends() -> None:
    assert swarm_line([Trend.LEARNING, Trend.FLAT, Trend.LEARNING]) == "2 of 3 nodes learning, 1 flat"
    assert swarm_line([Trend.TOO_EARLY]) == "1 of 1 node too early to tell"
