"""Ingest: turn what the exchange collected into verified train groups in the pool, counting every refusal.

Pure given its inputs: a :class:`~swarm.exchange.CollectResult`, the pool and
the set of peers seen. A batch refused by the exchange (forged, tampered) and
a group refused by local re-verification are both counted by their reason's
value in :class:`~node.core.record.Collected`.
"""

from __future__ import annotations

import logging

from node.core.pool import ExternalPool
from node.core.record import Collected
from node.tasks.verify import TrainGroup, verify_external
from protocol import short_id
from swarm.exchange import CollectResult

logger = logging.getLogger(__name__)


def ingest(result: CollectResult, pool: ExternalPool[TrainGroup], peers_seen: set[str]) -> Collected:
    """Re-verify every group of every accepted batch, add the good ones to ``pool``; count the rest."""
    out = Collected(fetch_failed=len(result.failed))
    peers_seen.update(p for p, _ in result.failed)
    for peer, refusal in result.rejected:
        peers_seen.add(peer)
        out.reasons[refusal.reason.value] += 1
        logger.info("rejected batch from %s: %s", short_id(peer), refusal)
    for desc, batch in result.accepted:
        peer = desc.publisher
        peers_seen.add(peer)
        out.from_peers[short_id(peer)] = out.from_peers.get(short_id(peer), 0) + 1
        good = []
        for group in batch.groups:
            verdict = verify_external(group, None, source_peer=peer)
            out.mismatches += verdict.reward_mismatches
            if verdict.group is None:
                assert verdict.reason is not None
                out.reasons[verdict.reason.value] += 1
                logger.info("rejected group from %s: %s %s", short_id(peer), verdict.reason.value, verdict.detail)
            else:
                good.append(verdict.group)
        out.accepted += len(good)
        pool.add(good)
    return out
