"""Why a peer's group was refused: one stable value per reason, and which reasons are the peer's fault.

The values are what ``metrics.jsonl`` (``rejected_reasons``), the dashboard and
Prometheus show, so they never change once released. :data:`FAULTS` separates
refusals that only a dishonest or broken peer can cause from refusals that say
only "not for this node" (another family or config, a larger generation
budget, a longer context, or this round's budgets spent): an honest peer
training on something else triggers the latter, so only the former may lower
a peer's reputation.
"""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    """Why a peer's group was refused; counted by value in the round record (``rejected_reasons``)."""

    BAD_TASK_REFERENCE = "bad task reference"
    PROMPT_MISMATCH = "prompt mismatch"
    BAD_GROUP_SHAPE = "bad group shape"
    FAMILY_NOT_ACCEPTED = "family not trained here"
    CONFIG_NOT_ACCEPTED = "task config not trained here"
    COMPLETION_TOO_LONG = "completion over generation budget"
    CONTEXT_OVERFLOW = "longer than model context"
    BUILD_BUDGET = "task build budget spent"
    PUBLISHER_QUOTA = "publisher quota spent"
    INGEST_DEADLINE = "ingest time budget spent"
    HELD_OUT = "held-out evaluation prompt"
    """A prompt of the evaluation split (:mod:`node.tasks.heldout`): training on it would turn the
    node's held-out score into a training score. Not a fault: a peer of another version may split otherwise."""
    IMPLAUSIBLE = "text implausible here"
    """Counted per completion, at training: a peer's completion far less likely under this node's policy than its
    own (``max_logp_gap``) gets weight 0. Not a fault: an honest peer of another model may write so."""
    SHARE_CAP = "over publisher share of step"
    """Counted per completion, at training: a peer's rows past ``max_publisher_share`` of the step's informative
    rows are dropped, and its rows scaled down past that share of the advantage mass. Not a fault."""


FAULTS: frozenset[RejectReason] = frozenset(
    {RejectReason.BAD_TASK_REFERENCE, RejectReason.PROMPT_MISMATCH, RejectReason.BAD_GROUP_SHAPE}
)
"""Refusals an honest peer never causes: a task reference that cannot be regenerated, a prompt that
is not the regenerated one, completions and rewards that differ in number."""
