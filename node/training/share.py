"""How many of a round's training slots a node gives to peers' groups: measured on its own objective, not assumed.

A round trains on ``I + J`` groups, up to ``J`` of them peers'. A peer's group saves this node a generation,
but it is worth a slot only if it moves this node's *own* objective about as far as one of its own groups
would: between copies of one model it often does; a stronger model fed a weaker architecture's text learns
less than alone (docs/EXPERIMENTS.md, "Four architectures in one swarm"). The node measures it each step.

With its own groups split in two halves ``A`` and ``B`` (independent samples of its own policy on its own
questions) and the peers' groups ``E`` of the same step, each part's gradient ``g`` (its rows' share of the
step's loss) gives two unbiased estimates, ``mu`` being the expected gradient of one own group and ``mu_E``
that of one peer group:

- ``own = <g_A, g_B> / (n_A n_B)`` estimates ``|mu|^2``: what an own group moves this node's objective;
- ``peer = <g_E, g_A + g_B> / (n_E (n_A + n_B))`` estimates ``<mu_E, mu>``: the first-order change of this
  node's objective along one peer group's gradient.

``n`` counts the groups each part had, with signal or not: a slot whose group carries no signal teaches
nothing, and it is a slot. :class:`ShareControl` keeps exponential averages of both (not of their ratio:
``own`` is often near 0, or below, in one step) and takes peers' groups while ``peer >= threshold * own``,
one slot more or less per round. With no peers' group in a step (the node gave every slot back) it scores a
few of them without training on them (``probe``), so it notices when peers start to help.

Against strangers: both numbers are measured here, on groups this node verified, through its own gradient; a
peer can only make its groups look useful by sending useful groups. A fresh key gains nothing: the share is
the node's, over all its peers, not a credit per publisher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PROBE_GROUPS = 2
"""Peers' groups scored, not trained on, in a round whose every slot went back to the node's own groups."""


@dataclass(frozen=True)
class ShareSample:
    """One step's two estimates (module docstring): an own group's value and a peer group's, same units."""

    own: float
    peer: float


def share_sample(g_a: Tensor, g_b: Tensor, g_e: Tensor, n_a: int, n_b: int, n_e: int) -> ShareSample | None:
    """The step's estimates from the parts' gradients and group counts; None when a part had no group.

    >>> g = torch.tensor([1.0, 0.0])
    >>> share_sample(g, g, 0.5 * g, 1, 1, 1)
    ShareSample(own=1.0, peer=0.5)
    """
    if min(n_a, n_b, n_e) < 1:
        return None
    own = float(torch.dot(g_a, g_b)) / (n_a * n_b)
    peer = float(torch.dot(g_e, g_a + g_b)) / (n_e * (n_a + n_b))
    return ShareSample(own, peer)


@dataclass
class ShareControl:
    """The number of peers' groups the next round takes, from the measured value of one (module docstring).

    ``most`` is ``J``, the configured external groups; the node starts there, and changes nothing before
    ``min_steps`` measured steps.
    """

    most: int
    threshold: float = 1.0
    momentum: float = 0.9
    min_steps: int = 10
    own: float = 0.0
    peer: float = 0.0
    steps: int = 0
    taken: int = -1  # -1: ``most``

    def __post_init__(self) -> None:
        if self.taken < 0:
            self.taken = self.most

    def observe(self, sample: ShareSample | None) -> None:
        """Fold one step's estimates in, then move the share one slot toward what they say."""
        if sample is None:
            return
        m = self.momentum if self.steps else 0.0
        self.own = m * self.own + (1 - m) * sample.own
        self.peer = m * self.peer + (1 - m) * sample.peer
        self.steps += 1
        if self.steps < self.min_steps:
            return
        step = 1 if self.helps() else -1
        self.taken = max(0, min(self.most, self.taken + step))

    def helps(self) -> bool:
        """Whether a peer's group moves this node's objective at least ``threshold`` times as far as its own.

        A node whose own groups move nothing (``own <= 0``) gains from any peer's group that moves it forward.
        """
        return self.peer >= self.threshold * self.own if self.own > 0 else self.peer > 0

    def value(self) -> float | None:
        """A peer's group in units of an own group (for the round record); None before the first measurement
        or while the own value is not positive."""
        return self.peer / self.own if self.steps and self.own > 0 else None

    def probe(self) -> int:
        """How many peers' groups to score without training on them this round."""
        return min(PROBE_GROUPS, self.most) if self.taken == 0 else 0

    def state(self) -> dict[str, float]:
        """The checkpointed state (a restart keeps what it measured)."""
        return {"own": self.own, "peer": self.peer, "steps": self.steps, "taken": self.taken}

    def restore(self, state: dict[str, float]) -> None:
        """Take a checkpointed :meth:`state`; the share stays within ``most`` should ``J`` have changed."""
        self.own, self.peer = float(state["own"]), float(state["peer"])
        self.steps = int(state["steps"])
        self.taken = max(0, min(self.most, int(state["taken"])))


PROBE = "probe"
"""The part label of peers' groups scored without training on them."""


class PartGradients:
    """Each part's gradient from one pass over chunks that come part by part: differences of running gradients.

    ``enter`` is called with each chunk's part label before its backward pass and ``close`` after the last;
    :attr:`grads` then holds each part's own gradient, and :attr:`before_probe` the running gradient where
    the :data:`PROBE` part began (what the step must apply).
    """

    def __init__(self) -> None:
        self.grads: dict[str, Tensor] = {}
        self.before_probe: Tensor | None = None
        self._label: str | None = None
        self._prev: Tensor | None = None

    def enter(self, label: str | None, running: Tensor) -> None:
        """The running gradient where the chunks of the current part end and those of ``label`` begin."""
        if self._label is not None and self._prev is not None:
            self.grads[self._label] = self.grads.get(self._label, torch.zeros_like(running)) + running - self._prev
        if label == PROBE:
            self.before_probe = running
        self._label, self._prev = label, running

    @property
    def current(self) -> str | None:
        """The part whose chunks come now (None before the first)."""
        return self._label

    def close(self, running: Tensor) -> None:
        """The running gradient after the last chunk."""
        self.enter(None, running)

    def part(self, label: str, like: Tensor) -> Tensor:
        """A part's gradient; zeros for a part none of whose rows reached the step (they moved nothing)."""
        return self.grads.get(label, torch.zeros_like(like))


def set_flat_grad(params: list[torch.nn.Parameter], flat: Tensor) -> None:
    """Write ``flat`` (as :func:`~node.training.diagnostics.flat_grad` lays parameters out) back into the
    parameters' gradients."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
        offset += n
