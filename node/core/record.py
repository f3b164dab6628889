"""The round record: what one round did, as a typed value and as the ``round`` event of ``metrics.jsonl``.

The README's metrics table lists these fields (``tests/node/test_record.py``
checks that the two agree), and readers of the file (dashboard, experiments,
``local``'s table) read these keys.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Collected:
    """What one round's collect step brought: rejections by reason, mismatches, failures, batches per peer."""

    reasons: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    mismatches: int = 0
    fetch_failed: int = 0
    from_peers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundRecord:
    """One completed round (field order is the order in the JSON line)."""

    time: float
    peer: str
    round: int
    reward_mean: float
    external_reward_mean: float | None
    local_groups: int
    external_groups: int
    external_rejected: int
    rejected_reasons: dict[str, int]
    accepted_groups: int
    fetch_failed: int
    reward_mismatches: int
    external_peers: dict[str, int]
    batches_from: dict[str, int]
    dropped_zero_adv: int
    trained_groups: int
    pool: int
    peers_seen: int
    bytes_in: int
    bytes_out: int
    loss: float | None
    round_s: float

    EVENT = "round"

    def to_event(self) -> dict[str, Any]:
        """The fields as written to ``metrics.jsonl`` (``event`` is added by the writer)."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys of a ``round`` event besides ``event``."""
        return [f.name for f in fields(cls)]


def mean(values: list[float]) -> float | None:
    """The mean, or None for no values."""
    return sum(values) / len(values) if values else None
