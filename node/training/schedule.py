"""The inner learning rate round by round: constant, or decayed to a floor over a set number of rounds.

A schedule is keyed to the node's round, which a checkpoint restores, so a
resumed node goes on where it stopped, and every node of a swarm that runs the
same rounds uses the same rate in the same round. Decay is what lets a swarm
whose outer sync averages away most of each node's gradient noise take larger
steps early without ending on them (docs/EXPERIMENTS.md measures it).
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")
"""``linear`` falls in a straight line, ``cosine`` along half a cosine (transformers' shapes, with a floor)."""


def scheduled_lr(base: float, schedule: str, decay_rounds: int, floor: float, done: int) -> float:
    """The rate of the step after ``done`` steps: ``base`` falling to ``floor * base`` at step ``decay_rounds``.

    >>> scheduled_lr(1e-3, "linear", 100, 0.5, 50)
    0.00075
    >>> round(scheduled_lr(1e-3, "cosine", 100, 0.0, 50), 9)
    0.0005
    >>> scheduled_lr(1e-3, "linear", 100, 0.5, 250)  # past the decay: the floor
    0.0005
    >>> scheduled_lr(1e-3, "constant", 0, 0.0, 7)
    0.001
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"learning-rate schedule {schedule!r}: use one of {', '.join(LR_SCHEDULES)}")
    if schedule == "constant" or decay_rounds <= 0:
        return base
    t = min(max(done, 0), decay_rounds) / decay_rounds
    shape = 1.0 - t if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return base * (floor + (1.0 - floor) * shape)
