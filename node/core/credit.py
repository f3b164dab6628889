"""Which peers' groups actually teach this node: credit per publisher and per model family, learned from steps.

"Informative" (non-zero advantage) says a group *can* move the policy; it does not say the move helps.
What this node can measure for each source after a step is the first-order effect of that source's
part of the gradient on its *own* on-policy loss: the cosine between the gradient of a publisher's
groups and the gradient of this node's local groups in the same step. A positive cosine means a step
along that publisher's gradient lowers this node's loss on its own completions; a negative one means
that source pulls against what this node's own samples teach. The ``credit`` sampling policy prefers
groups from sources with higher credit (an EMA of those cosines), per publisher and per (claimed)
model family, and keeps exploring.

Against strangers: a credit is measured here, on groups this node verified and trained on; a peer can
say nothing to raise it. A fresh key starts at 0, like every unknown source, so minting keys buys
nothing over one honest newcomer; a peer that claims another family's model id shares that family's
credit until its own measurements (per publisher) say otherwise, and it only reorders groups that
passed verification. Memory is bounded: the most recent :data:`MAX_PUBLISHERS` publishers and
:data:`MAX_MODELS` model ids.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_PUBLISHERS = 4096
MAX_MODELS = 256


class _Bounded(OrderedDict[str, float]):
    """An EMA per key, keeping the ``limit`` most recently updated keys."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def fold(self, key: str, value: float, momentum: float) -> None:
        old = self.pop(key, None)
        self[key] = value if old is None else momentum * old + (1 - momentum) * value
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass
class SourceCredit:
    """Credit per publisher and per model family: EMAs of measured gradient alignment, in [-1, 1]."""

    momentum: float = 0.8
    explore: float = 0.25
    publishers: _Bounded = field(default_factory=lambda: _Bounded(MAX_PUBLISHERS))
    models: _Bounded = field(default_factory=lambda: _Bounded(MAX_MODELS))

    def observe(self, alignment: Mapping[str, float], models: Mapping[str, str]) -> None:
        """Fold one step's alignments (publisher -> cosine with the local gradient) into the credits."""
        for peer, cos in alignment.items():
            value = max(-1.0, min(1.0, cos))
            self.publishers.fold(peer, value, self.momentum)
            self.models.fold(models.get(peer, ""), value, self.momentum)

    def score(self, publisher: str, model: str) -> float:
        """A group's preference: its publisher's credit plus its model family's (0 where unknown)."""
        return self.publishers.get(publisher, 0.0) + self.models.get(model, 0.0)

    def per_model(self) -> dict[str, float]:
        """Model family -> credit, for the round record."""
        return {m: round(v, 4) for m, v in sorted(self.models.items()) if m}

    def rank(self, scores: list[float], rng: random.Random) -> list[int]:
        """Indices by descending score, with each place taken at random (among the rest) with prob. ``explore``.

        >>> SourceCredit(explore=0.0).rank([0.1, 0.5, -0.2], random.Random(0))
        [1, 0, 2]
        """
        rest = sorted(range(len(scores)), key=lambda i: -scores[i])
        order = []
        while rest:
            k = rng.randrange(len(rest)) if rng.random() < self.explore else 0
            order.append(rest.pop(k))
        return order
