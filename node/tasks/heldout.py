"""The held-out split: prompts no node trains on, and the fixed evaluation set drawn from them.

A prompt is held out when a hash of (family, prompt text) falls in a reserved
bucket (:data:`HELD_OUT_SHARE` of all prompts). The split is by *content*, not
by seed or index: the tiny families have few distinct prompts (``max`` with 4
digits has 10,000), so items drawn from another seed would repeat training
prompts, and an evaluation on them could not tell learning from memorising.
Training streams skip held-out prompts (:class:`~node.tasks.registry.TaskMix`),
and a node refuses a peer's group on one
(:attr:`~node.tasks.reasons.RejectReason.HELD_OUT`), so no peer can train a node
on the questions it is measured on.

The evaluation set of a family is a pure function of the family and its
config: the first distinct held-out prompts of :data:`EVAL_SEED`'s stream, the
same on every node of a swarm.

>>> from node.tasks.builtin import MaxDigit
>>> items = eval_items(MaxDigit(), 8)
>>> len(items), all(is_held_out("max", it.prompt) for it in items)
(8, True)
"""

from __future__ import annotations

import hashlib

from node.tasks.base import TaskFamily, TaskItem

HELD_OUT_SHARE = 1 / 16
"""Share of each family's prompts reserved for evaluation."""
_BUCKET_BELOW = int(HELD_OUT_SHARE * 2**16)
EVAL_SEED = 2**62 + 7
"""The item stream the evaluation sets are drawn from (any stream would do: the split is by content)."""
DRAWS_PER_ITEM = 64
"""An evaluation set looks at most this many items per item it wants: a family with few distinct
held-out prompts (``summod`` with 2 terms has about 6 of its 100) gets all it has, not a hang."""
REDRAWS = 64
"""Training: a held-out draw is replaced by another of the same round and position, at most this many
times; only a family nearly all of whose prompts are held out runs out (chance (1/16)^64 otherwise)."""


def is_held_out(family: str, prompt: str) -> bool:
    """Whether ``prompt`` of ``family`` is reserved for evaluation (never trained on)."""
    digest = hashlib.sha256(f"held-out|{family}|{prompt}".encode()).digest()
    return int.from_bytes(digest[:2], "big") < _BUCKET_BELOW


def eval_items(family: TaskFamily, n: int) -> list[TaskItem]:
    """The first ``n`` distinct held-out prompts of the family's evaluation stream (fewer if it has fewer)."""
    if n < 1:
        raise ValueError(f"n={n}; an evaluation set needs at least 1 item")
    items: list[TaskItem] = []
    seen: set[str] = set()
    for index in range(n * DRAWS_PER_ITEM):
        item = family.item(EVAL_SEED, index)
        if item.prompt not in seen and is_held_out(family.name, item.prompt):
            seen.add(item.prompt)
            items.append(item)
            if len(items) == n:
                break
    return items


REDRAW_STRIDE = 2**56
"""A held-out draw at ``index`` is replaced by the one at ``index + k * REDRAW_STRIDE``: past every index
a stream uses (a round's are below 2^55)."""


def training_item(family: TaskFamily, seed: int, index: int, redraw_stride: int = REDRAW_STRIDE) -> TaskItem:
    """The item a training stream uses at (seed, index): the first of ``index + k * redraw_stride``
    (k = 0, 1, ...) whose prompt is not held out."""
    item = family.item(seed, index)
    for k in range(1, REDRAWS + 1):
        if not is_held_out(family.name, item.prompt):
            break
        item = family.item(seed, index + k * redraw_stride)
    return item
