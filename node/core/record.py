"""The round record: what one round did, as a typed value and as the ``round`` event of ``metrics.jsonl``.

The metrics table of docs/METRICS.md lists these fields (``tests/node/test_record.py``
checks that the two agree), and readers of the file (dashboard, experiments,
``local``'s table) read these keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class PublisherTally:
    """One publisher's groups in one round, as the exchange's reputation is told (``judge``).

    ``accepted`` passed local re-verification, ``informative`` of them have
    locally computed rewards that are not all equal, ``refused`` failed it in
    a way only a dishonest or broken peer can (:data:`node.tasks.reasons.FAULTS`).
    """

    accepted: int = 0
    informative: int = 0
    refused: int = 0


@dataclass
class Collected:
    """What one round's collect step brought: rejections by reason, mismatches, failures, batches per peer.

    ``tallies`` is keyed by full peer id; ``task_builds`` counts expensive task
    regenerations (new reasoning-gym datasets) that peers' groups caused; ``trimmed``
    the completions cut from groups larger than this node's own G;
    ``ingest_s`` is the time spent re-verifying; ``collect_s`` how long the
    network took to collect them, ``descriptors_seen`` how many descriptors its
    DHT reads returned, ``external_age_s`` the median age of the accepted
    batches' descriptors when ingested (each None when no collect finished this
    round).
    """

    reasons: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    mismatches: int = 0
    fetch_failed: int = 0
    from_peers: dict[str, int] = field(default_factory=dict)
    refused_from: Counter[str] = field(default_factory=Counter)
    tallies: dict[str, PublisherTally] = field(default_factory=dict)
    task_builds: int = 0
    trimmed: int = 0
    ingest_s: float = 0.0
    collect_s: float | None = None
    descriptors_seen: int | None = None
    external_age_s: float | None = None


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
    source_rows: dict[str, int]
    source_adv: dict[str, float]
    trimmed_completions: int
    batches_from: dict[str, int]
    dropped_zero_adv: int
    too_long_skipped: int
    trained_groups: int
    pool: int
    peers_seen: int
    banned_peers: int
    task_builds: int
    bytes_in: int
    bytes_out: int
    fetched_via_relay: int
    loss: float | None
    lr: float
    ingest_s: float
    generate_s: float
    share_s: float
    train_s: float
    collect_s: float | None
    round_s: float
    descriptors_seen: int | None = None
    external_age_s: float | None = None
    store_s: float | None = None
    stores: int = 0
    stores_failed: int = 0
    trained_sources: dict[str, dict[str, float]] = field(default_factory=dict)
    grad_local: float | None = None
    grad_external: float | None = None
    grad_cos: float | None = None
    share_taken: int | None = None
    share_value: float | None = None
    source_credit: dict[str, float] = field(default_factory=dict)
    refused_from: dict[str, int] = field(default_factory=dict)
    sample_tokens_per_s: float | None = None
    train_tokens_per_s: float | None = None
    rss_mb: float | None = None
    children_rss_mb: float | None = None
    cpu_s: float | None = None
    children_cpu_s: float | None = None

    EVENT = "round"

    def to_event(self) -> dict[str, Any]:
        """The fields as written to ``metrics.jsonl`` (``event`` is added by the writer)."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys of a ``round`` event besides ``event``."""
        return [f.name for f in fields(cls)]


REFUSED_FROM_SHOWN = 64
"""Publishers a round's ``refused_from`` names at most (the most refused first): a flood of keys cannot grow it."""


def most_refused(counts: Counter[str]) -> dict[str, int]:
    """The ``REFUSED_FROM_SHOWN`` publishers with the most refusals this round."""
    return dict(counts.most_common(REFUSED_FROM_SHOWN))


def banned_count(summary: Mapping[str, Any]) -> int:
    """How many peers the exchange's reputation bans now (its ``reputation_summary()["banned"]``; 0 if absent)."""
    banned = summary.get("banned", 0)
    return banned if isinstance(banned, int) and not isinstance(banned, bool) else 0


def mean(values: list[float]) -> float | None:
    """The mean, or None for no values."""
    return sum(values) / len(values) if values else None
