"""Per-publisher reputation: what each peer delivered before decides how much we fetch from it.

Peer ids cost nothing to create, so nothing a publisher *claims* (its
descriptor's times, its batch size) can buy priority; only what it *delivered*
and we checked can. Each publisher has one score:

* credits for verified payloads and, after the node re-verified them locally,
  for accepted groups, much more for informative ones (rewards that differ,
  so a non-zero advantage);
* penalties per :class:`Offence`; lying (a digest or size mismatch, content
  that fails verification) weighs more than being slow or unreachable;
* the score decays towards 0 with a half-life, so old merit and old offences
  both fade;
* a score at or below ``-ban_threshold`` bans the publisher for ``ban_s``
  seconds; the ban and its reason are logged once, when it starts.

Pure and bounded: time is always an argument (no clock inside), and at most
``max_tracked`` publishers are remembered; beyond that the least useful are
forgotten (neutral and poor ones first, then banned ones, good ones last), so
100k fresh keys cannot grow memory. A forgotten publisher is simply unknown
again, which is all a fresh key would be anyway.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from random import Random
from types import MappingProxyType
from typing import Any, Final

from protocol import short_id

logger = logging.getLogger(__name__)


class Offence(StrEnum):
    """What a publisher did wrong; the reason of a ban, counted by value in metrics."""

    UNREACHABLE = "unreachable or fetch failed"
    TOO_SLOW = "too slow"
    DIGEST_MISMATCH = "digest or size mismatch"
    REFUSED_CONTENT = "refused content"
    FUTURE_DATED = "future-dated descriptor"


class Standing(StrEnum):
    """How selection treats a publisher (see ``swarm.selection.select_descriptors``)."""

    GOOD = "good"
    UNKNOWN = "unknown"
    POOR = "poor"
    BANNED = "banned"


PENALTY: Final[Mapping[Offence, float]] = MappingProxyType(
    {
        # an honest peer can be briefly unreachable (NAT, restart): cheap, but it adds up
        Offence.UNREACHABLE: 1.0,
        # slowness costs every honest round a share of its time: three strikes ban at the default threshold
        Offence.TOO_SLOW: 3.0,
        Offence.FUTURE_DATED: 3.0,
        # streams are authenticated by libp2p, so wrong bytes or bad content are the publisher's own doing
        Offence.DIGEST_MISMATCH: 5.0,
        Offence.REFUSED_CONTENT: 5.0,
    }
)
DELIVERY_CREDIT: Final = 0.5
"""Credit for a payload that matched its descriptor and opened (signature, schema)."""
ACCEPTED_CREDIT: Final = 0.1
"""Credit per group that passed local re-verification but carries no learning signal."""
INFORMATIVE_CREDIT: Final = 1.0
"""Credit per accepted group whose local rewards differ (non-zero advantage)."""
MAX_JUDGEMENT_CREDIT: Final = 4.0
"""Most credit one judgement can give: a huge batch of cheap groups must not outweigh steady value."""
MAX_SCORE: Final = 16.0
"""Scores stay in [-MAX_SCORE, MAX_SCORE], so merit and debt both stay bounded."""
NEUTRAL: Final = 0.05
"""Scores closer to 0 than this count as unknown (merit or debt that has decayed away)."""


@dataclass
class ReputationConfig:
    """Knobs of the per-publisher reputation that steers descriptor selection."""

    exploration_slots: int = field(
        default=2,
        metadata={"help": "Fetches per collect for publishers with no reputation yet (fresh keys share these)."},
    )
    half_life_s: float = field(
        default=1800.0, metadata={"help": "Seconds for a publisher's score (merit or debt) to halve."}
    )
    ban_threshold: float = field(
        default=8.0, metadata={"help": "A publisher whose score falls to minus this is banned (e.g. 8: two lies)."}
    )
    ban_s: float = field(default=1800.0, metadata={"help": "How long a ban lasts, seconds."})
    max_tracked: int = field(
        default=4096, metadata={"help": "Most publishers remembered; the least useful are forgotten beyond it."}
    )

    def __post_init__(self) -> None:
        if self.exploration_slots < 0:
            raise ValueError(f"exploration_slots={self.exploration_slots!r}; use 0 or more (e.g. 2)")
        for name in ("half_life_s", "ban_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}; use a positive number of seconds")
        if not 0 < self.ban_threshold <= MAX_SCORE:
            raise ValueError(f"ban_threshold={self.ban_threshold!r}; use a value in (0, {MAX_SCORE}] (e.g. 8)")
        if self.max_tracked < 16:
            raise ValueError(f"max_tracked={self.max_tracked!r}; use at least 16 (e.g. 4096)")


@dataclass
class _Record:
    score: float
    at: float  # when `score` was last brought up to date
    banned_until: float = -math.inf
    ban_reason: Offence | None = None


class Reputation:
    """Scores of the publishers this node fetched from. Not thread-safe: the owner locks."""

    def __init__(self, cfg: ReputationConfig | None = None) -> None:
        self.cfg = cfg or ReputationConfig()
        self._records: dict[str, _Record] = {}
        self._bans: Counter[Offence] = Counter()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, peer: object) -> bool:
        return peer in self._records

    def score(self, peer: str, now: float) -> float:
        """The decayed score of ``peer`` at ``now``; 0 for a publisher never seen (or forgotten)."""
        rec = self._records.get(peer)
        return 0.0 if rec is None else self._decayed(rec, now)

    def banned(self, peer: str, now: float) -> Offence | None:
        """The reason ``peer`` is banned at ``now``, or None when it is not."""
        rec = self._records.get(peer)
        if rec is None or now >= rec.banned_until:
            return None
        return rec.ban_reason

    def standing(self, peer: str, now: float) -> Standing:
        """Banned, good (positive score), poor (negative) or unknown (no score to speak of)."""
        if self.banned(peer, now) is not None:
            return Standing.BANNED
        s = self.score(peer, now)
        if s >= NEUTRAL:
            return Standing.GOOD
        return Standing.POOR if s <= -NEUTRAL else Standing.UNKNOWN

    def delivered(self, peer: str, now: float) -> None:
        """``peer`` served a payload that matched its descriptor and opened cleanly.

        Clean delivery lifts a score *to* ``DELIVERY_CREDIT`` at most, never beyond: a peer
        whose batches open but teach nothing (families we do not train on) stays at the
        bottom of the good ones; only :meth:`judge`'s credit for useful groups raises it further.
        """
        rec = self._records.get(peer)
        current = 0.0 if rec is None else self._decayed(rec, now)
        if current < DELIVERY_CREDIT:
            self._add(peer, now, min(DELIVERY_CREDIT - current, DELIVERY_CREDIT))

    def judge(self, peer: str, now: float, *, accepted: int, informative: int, refused: int) -> Offence | None:
        """Credit or penalise ``peer`` for its groups after local re-verification.

        ``accepted`` groups passed, ``informative`` of them have a non-zero
        advantage, ``refused`` failed. Refusals cost up to the full
        ``REFUSED_CONTENT`` penalty, in proportion to the share of refused
        groups, so one odd group among many good ones does not ruin an honest
        peer. Returns the ban reason if this judgement started a ban.
        """
        if min(accepted, informative, refused) < 0 or informative > accepted:
            raise ValueError(
                f"judge({short_id(peer)}): accepted={accepted}, informative={informative}, refused={refused}; "
                "counts must be >= 0 with informative <= accepted"
            )
        credit = ACCEPTED_CREDIT * (accepted - informative) + INFORMATIVE_CREDIT * informative
        if credit > 0:
            self._add(peer, now, min(credit, MAX_JUDGEMENT_CREDIT))
        if refused == 0:
            return None
        return self.penalize(peer, Offence.REFUSED_CONTENT, now, weight=refused / (accepted + refused))

    def penalize(self, peer: str, offence: Offence, now: float, *, weight: float = 1.0) -> Offence | None:
        """Lower ``peer``'s score for ``offence`` (scaled by ``weight`` in [0, 1]).

        Returns ``offence`` if it started a ban (logged once, as a warning), else None.
        """
        rec = self._add(peer, now, -PENALTY[offence] * min(max(weight, 0.0), 1.0))
        if rec.score > -self.cfg.ban_threshold or now < rec.banned_until:
            return None
        rec.banned_until, rec.ban_reason = now + self.cfg.ban_s, offence
        self._bans[offence] += 1
        logger.warning(
            "banned publisher %s for %.0f s: %s (score %.1f)", short_id(peer), self.cfg.ban_s, offence.value, rec.score
        )
        return offence

    def choose(
        self, publishers: Iterable[str], now: float, *, limit: int, live: Container[str], rng: Random
    ) -> list[str]:
        """Up to ``limit`` of ``publishers`` (banned ones never), in the order to fetch them.

        1. Good publishers, all of them, in an order drawn by weighted sampling
           without replacement on their score: the best usually go first, but
           no one is starved by a slightly better peer.
        2. Unknown publishers share ``exploration_slots``; those connected to
           our p2p daemon right now (``live``) go first, since a key minted
           for a flood has no daemon behind it.
        3. Slots still free go to further *live* unknown publishers, then to
           poor ones (negative score, best first), so a peer that failed once
           can recover. Unknown publishers that are not live never get more
           than the exploration slots: that is what bounds a flood of fresh
           keys, and the random order lets each of them be tried in time.
           Slots left after that stay empty.
        """
        good: list[tuple[float, str]] = []
        unknown: list[tuple[bool, float, str]] = []
        poor: list[tuple[float, float, str]] = []
        for peer in publishers:
            standing, s = self.standing(peer, now), self.score(peer, now)
            if standing is Standing.GOOD:
                good.append((rng.expovariate(s), peer))  # Efraimidis-Spirakis keys: smallest first
            elif standing is Standing.UNKNOWN:
                unknown.append((peer not in live, rng.random(), peer))
            elif standing is Standing.POOR:
                poor.append((-s, rng.random(), peer))
        unknown.sort()
        quota = self.cfg.exploration_slots
        extra_live = [peer for not_live, _, peer in unknown[quota:] if not not_live]
        order = [peer for _, peer in sorted(good)] + [peer for _, _, peer in unknown[:quota]] + extra_live
        order += [peer for _, _, peer in sorted(poor)]
        return order[: max(limit, 0)]

    def summary(self, now: float) -> dict[str, Any]:
        """For metrics: publishers tracked, banned now, and bans started so far by reason."""
        banned = sum(1 for rec in self._records.values() if now < rec.banned_until)
        by_reason = {o.value: self._bans[o] for o in Offence if self._bans[o]}
        return {"tracked": len(self._records), "banned": banned, "bans_by_reason": by_reason}

    # ---- internals --------------------------------------------------------------------------

    def _decayed(self, rec: _Record, now: float) -> float:
        # a clock that steps back must not inflate anything: no negative ages
        age = max(0.0, now - rec.at)
        return rec.score * math.pow(0.5, age / self.cfg.half_life_s)

    def _add(self, peer: str, now: float, delta: float) -> _Record:
        rec = self._records.get(peer)
        if rec is None:
            rec = self._records[peer] = _Record(0.0, now)
        rec.score = min(MAX_SCORE, max(-MAX_SCORE, self._decayed(rec, now) + delta))
        rec.at = max(rec.at, now)
        if len(self._records) > self.cfg.max_tracked:
            self._forget(now, keep=peer)
        return rec

    def _forget(self, now: float, keep: str) -> None:
        """Drop the least useful tenth of the records (amortised: one pass per max_tracked / 10 new peers)."""
        target = self.cfg.max_tracked * 9 // 10
        victims = heapq.nsmallest(
            len(self._records) - target,
            (peer for peer in self._records if peer != keep),
            key=lambda peer: self._usefulness(self._records[peer], now),
        )
        for peer in victims:
            del self._records[peer]

    def _usefulness(self, rec: _Record, now: float) -> tuple[int, float, float]:
        """Sort key, least useful first: good publishers are what Sybils would like us to forget."""
        s = self._decayed(rec, now)
        tier = 2 if s >= NEUTRAL else 1 if now < rec.banned_until else 0
        return tier, abs(s), rec.at
