"""Ingest: turn what the exchange collected into verified train groups in the pool, counting every refusal.

Pure given its inputs: a :class:`~swarm.exchange.CollectResult`, the pool, the
set of peers seen, the node's :class:`~node.tasks.acceptance.Acceptance`, the
budgets of :class:`IngestConfig` and a clock. A batch refused by the exchange
(forged, tampered) and a group refused by local re-verification are both
counted by their reason's value in :class:`~node.core.record.Collected`, which
also tallies each publisher's groups for the exchange's reputation.

One round's ingest is bounded whatever peers send: groups are taken one
publisher at a time in turn, so a publisher first in line cannot spend the
round's budgets alone; each publisher has a quota of groups verified per
round; new task builds (a reasoning-gym dataset per new seed, up to ~100 ms
each) have a budget per round and per publisher; and the whole step has a
deadline. A group past a budget is refused by a counted reason, never queued.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, MutableSet, Sequence
from dataclasses import dataclass, field

from node.core.configs import IngestConfig as IngestConfig
from node.core.pool import ExternalPool
from node.core.record import Collected, PublisherTally
from node.tasks.acceptance import Acceptance
from node.tasks.reasons import FAULTS, RejectReason
from node.tasks.verify import TrainGroup, Verdict, verify_external
from protocol import Descriptor, RolloutBatch, RolloutGroup, short_id
from swarm.exchange import CollectResult

logger = logging.getLogger(__name__)


@dataclass
class RoundBudget:
    """What is left of one round's ingest allowance (see :class:`IngestConfig`)."""

    cfg: IngestConfig
    deadline: float
    groups: Counter[str] = field(default_factory=Counter)
    builds: Counter[str] = field(default_factory=Counter)

    def refusal(self, peer: str, now: float) -> RejectReason | None:
        """Why ``peer``'s next group may not even be looked at, if so."""
        if now >= self.deadline:
            return RejectReason.INGEST_DEADLINE
        if self.groups[peer] >= self.cfg.max_groups_per_publisher:
            return RejectReason.PUBLISHER_QUOTA
        return None

    def may_build(self, peer: str) -> bool:
        """Whether ``peer``'s next group may cause an expensive task build."""
        total = sum(self.builds.values())
        return total < self.cfg.max_task_builds and self.builds[peer] < self.cfg.max_task_builds_per_publisher

    def spend(self, peer: str, built: bool) -> None:
        """Count one group looked at, and the build it caused."""
        self.groups[peer] += 1
        self.builds[peer] += built


def interleave(accepted: Sequence[tuple[Descriptor, RolloutBatch]]) -> list[tuple[str, RolloutGroup]]:
    """Every group with its publisher, one publisher at a time in turn (a publisher's batches in order)."""
    queues: dict[str, list[RolloutGroup]] = {}
    for desc, batch in accepted:
        queues.setdefault(desc.publisher, []).extend(batch.groups)
    longest = max((len(q) for q in queues.values()), default=0)
    return [(peer, q[i]) for i in range(longest) for peer, q in queues.items() if i < len(q)]


def ingest(
    result: CollectResult,
    pool: ExternalPool[TrainGroup],
    peers_seen: MutableSet[str],
    accept: Acceptance,
    cfg: IngestConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Collected:
    """Re-verify peers' groups within this round's budgets, add the good ones to ``pool``; count the rest."""
    cfg = cfg or IngestConfig()
    start = clock()
    out = Collected(fetch_failed=len(result.failed))
    _count_batches(result, out, peers_seen)
    budget = RoundBudget(cfg, start + cfg.max_ingest_s)
    refused: dict[str, Counter[str]] = {}
    good: list[TrainGroup] = []
    for peer, group in interleave(result.accepted):
        verdict = _check(peer, group, accept, budget, clock())
        out.mismatches += verdict.reward_mismatches
        out.task_builds += verdict.built
        out.trimmed += verdict.trimmed
        tally = out.tallies[peer]
        if verdict.group is not None:
            good.append(verdict.group)
            tally.accepted += 1
            tally.informative += verdict.group.informative
            continue
        assert verdict.reason is not None
        out.reasons[verdict.reason.value] += 1
        tally.refused += verdict.reason in FAULTS
        refused.setdefault(peer, Counter())[verdict.reason.value] += 1
        out.refused_from[short_id(peer)] += 1
        logger.debug("refused group from %s: %s %s", short_id(peer), verdict.reason.value, verdict.detail)
    out.accepted = len(good)
    pool.add(good)
    for peer, reasons in refused.items():  # one line per publisher, not per group: a flood must not flood the log
        logger.info("refused %d group(s) from %s: %s", sum(reasons.values()), short_id(peer), dict(reasons))
    out.ingest_s = clock() - start
    return out


def _count_batches(result: CollectResult, out: Collected, peers_seen: MutableSet[str]) -> None:
    """Count batches refused by the exchange and who sent the accepted ones; note every peer seen."""
    for peer, _ in result.failed:
        peers_seen.add(peer)
    for peer, refusal in result.rejected:
        peers_seen.add(peer)
        out.reasons[refusal.reason.value] += 1
        out.refused_from[short_id(peer)] += 1
        logger.info("rejected batch from %s: %s", short_id(peer), refusal)
    for desc, _batch in result.accepted:
        peer = desc.publisher
        peers_seen.add(peer)
        out.from_peers[short_id(peer)] = out.from_peers.get(short_id(peer), 0) + 1
        out.tallies.setdefault(peer, PublisherTally())


def _check(peer: str, group: RolloutGroup, accept: Acceptance, budget: RoundBudget, now: float) -> Verdict:
    """The verdict on one group, unless this round's budget for ``peer`` refuses it first."""
    reason = budget.refusal(peer, now)
    if reason is not None:
        return Verdict(None, reason)
    verdict = verify_external(group, accept, source_peer=peer, may_build=budget.may_build(peer))
    budget.spend(peer, verdict.built)
    return verdict


class SeenPeers(MutableSet[str]):
    """The distinct peers seen (batches accepted, refused or failed), the ``capacity`` most recent.

    Keys cost nothing, so a flood of them must not grow a node's memory:
    past ``capacity`` the least recently seen peer is forgotten (and the
    count stays at ``capacity``).
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._peers: OrderedDict[str, None] = OrderedDict()

    def add(self, value: str) -> None:
        self._peers[value] = None
        self._peers.move_to_end(value)
        while len(self._peers) > self.capacity:
            self._peers.popitem(last=False)

    def discard(self, value: str) -> None:
        self._peers.pop(value, None)

    def __contains__(self, value: object) -> bool:
        return value in self._peers

    def __iter__(self) -> Iterator[str]:
        return iter(self._peers)

    def __len__(self) -> int:
        return len(self._peers)
