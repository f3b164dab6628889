"""Sharded discovery: which DHT keys a rollout descriptor is stored under and which keys a reader reads.

One key per time window that holds every publisher's descriptor makes every
reader pull all N descriptors from the same few replicas each round: the
replicas' load grows as N^2 per window, and past hivemind's 4 MiB message cap
(~12,000 descriptors of ~350 B) the key silently reads as nothing. So a
window's descriptors are spread over ``S`` shard keys (``S`` a power of two);
a publisher's shard is a hash of its peer id and the window, so it moves
every window and no publisher can pick it, and a reader samples a few shards
instead of reading them all. ``S`` grows with the swarm's estimated size,
which each node estimates from the shards it reads (publishers per shard read,
times ``S``, smoothed over collects), with hysteresis so that nodes agree
except near a threshold; near one, a publisher also stores its descriptor at
the neighbouring level, so a reader that has already moved (or not yet) still
finds it there. Readers read their own level, plus one shard of one other
level per collect in turn (a probe): a node that joins a large swarm starts at
one shard, where no one publishes, and only a probe shows it where the swarm
is (nodes that joined together would otherwise form an island).

All functions are pure (the caller passes the random generator); the DHT
validator recomputes the same keys, so a descriptor stored under any other key
is refused (:class:`swarm.validation.DescriptorBinding`).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

MAX_SHARDS = 1024  # 1024 x 64 descriptors per shard: far past the swarms we can measure
TARGET_PER_SHARD = 64  # descriptors one shard key should hold per window (~22 KB: one small DHT reply)
LEVELS: tuple[int, ...] = tuple(1 << i for i in range(int(math.log2(MAX_SHARDS)) + 1))


def shard_of(publisher: str, window: int, shards: int) -> int:
    """The shard of ``publisher``'s descriptors in ``window`` among ``shards`` (a power of two)."""
    digest = hashlib.sha256(f"{publisher}:{window}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def descriptor_key(swarm_id: str, window: int, shards: int, shard: int) -> str:
    """The DHT key of one shard of one window (with one shard: the unsharded key of earlier versions)."""
    if shards == 1:
        return f"{swarm_id}:rollouts:{window}"
    return f"{swarm_id}:rollouts:{window}:{shards}:{shard}"


def publisher_key(swarm_id: str, publisher: str, window: int, shards: int) -> str:
    """Where ``publisher`` stores its descriptor of ``window`` when the swarm has ``shards`` shards."""
    return descriptor_key(swarm_id, window, shards, shard_of(publisher, window, shards))


def publisher_keys(swarm_id: str, publisher: str, window: int, shards: int, estimated_publishers: float) -> list[str]:
    """Every key ``publisher`` stores its descriptor of ``window`` under: its shard at its own level, and at a
    neighbouring level when its estimate is near the threshold that would move it there (at most two)."""
    down, up = near_threshold(shards, estimated_publishers)
    levels = [shards, *([shards // 2] if down else []), *([shards * 2] if up else [])]
    return [publisher_key(swarm_id, publisher, window, s) for s in levels]


def valid_keys(swarm_id: str, publisher: str, window: int) -> list[str]:
    """Every key a descriptor of ``publisher`` in ``window`` may be stored under (one per shard level)."""
    return [publisher_key(swarm_id, publisher, window, s) for s in LEVELS]


def next_shard_count(current: int, estimated_publishers: float, target: int = TARGET_PER_SHARD) -> int:
    """The shard count after an estimate: double while shards hold over 1.5x ``target``, halve while the
    halved count would hold under ``target`` / 2 per shard (the gap between keeps nodes from flapping)."""
    shards = min(max(current, 1), MAX_SHARDS)
    while shards < MAX_SHARDS and estimated_publishers > 1.5 * target * shards:
        shards *= 2
    while shards > 1 and estimated_publishers < target * (shards // 2) / 2:
        shards //= 2
    return shards


def near_threshold(shards: int, estimated_publishers: float, target: int = TARGET_PER_SHARD) -> tuple[bool, bool]:
    """Whether a node at ``shards`` may disagree with nodes a level (below, above): its estimate lies within a
    factor of 1.5 of the threshold of :func:`next_shard_count` that would move it there."""
    halve_below = target * (shards // 2) / 2
    double_above = 1.5 * target * shards
    down = shards > 1 and estimated_publishers < 1.5 * halve_below
    up = shards < MAX_SHARDS and estimated_publishers > double_above / 1.5
    return down, up


@dataclass(frozen=True)
class ShardRead:
    """One DHT key to read: its window, shard level and shard."""

    window: int
    shards: int
    shard: int

    def key(self, swarm_id: str) -> str:
        return descriptor_key(swarm_id, self.window, self.shards, self.shard)


def read_plan(
    windows: tuple[int, ...], shards: int, reads: int, rng: random.Random, probe: int | None = None
) -> list[ShardRead]:
    """The keys one collect reads: ``reads`` random shards of each window at this node's level (all of them
    if there are fewer), and one random shard of each window at level ``probe`` if given."""
    plan: list[ShardRead] = []
    for w in windows:
        plan += [ShardRead(w, shards, s) for s in sorted(rng.sample(range(shards), min(reads, shards)))]
        if probe is not None and probe != shards:
            plan.append(ShardRead(w, probe, rng.randrange(probe)))
    return plan


def probe_level(shards: int, previous: int | None) -> int | None:
    """The other level to probe in the next collect: every level in turn, upwards first (2x, 4x, ... then
    1/2x, ...), one per collect.

    A node that joins a large swarm starts at one shard, where no one publishes
    any more, so its own reads alone would never grow its estimate; and nodes that
    joined together would find each other there and form an island. A probe that
    finds the swarm's level makes the estimate jump there (see
    :func:`estimate_publishers`). One extra read per window per collect.
    """
    others = [s for s in LEVELS if s > shards] + [s for s in reversed(LEVELS) if s < shards]
    if not others:
        return None
    if previous is None or previous not in others:
        return others[0]
    return others[(others.index(previous) + 1) % len(others)]


def smoothed(previous: float, new: float, weight: float = 0.5) -> float:
    """The running estimate after one more collect: averaged, against sampling noise, except that the first one
    and one over twice the last are taken as they are (a probe that found the swarm's level: a node that
    joined late, or an island of nodes that joined together, moves there at once)."""
    if previous <= 0 or new > 2 * previous:
        return new
    return weight * new + (1 - weight) * previous


MIN_PROBE_FOUND = 4  # a probe's level counts only with this many publishers found: a stray entry is not a swarm


def estimate_publishers(per_shard: dict[ShardRead, int], shards: int) -> float | None:
    """The swarm's publishers per window: per level read, the publishers found per shard times the level (each
    window's publishers at a level are spread over its shards, one each); the largest such figure, as the
    level where the swarm publishes shows all of it and any other only its near-threshold doubles. Levels
    other than this node's count only from ``MIN_PROBE_FOUND`` found. None when this node's level was not read."""
    by_level: dict[int, list[int]] = {}
    for read, n in per_shard.items():
        by_level.setdefault(read.shards, []).append(n)
    if shards not in by_level:
        return None
    best = sum(by_level[shards]) / len(by_level[shards]) * shards
    for level, found in by_level.items():
        if level != shards and sum(found) >= MIN_PROBE_FOUND:
            best = max(best, sum(found) / len(found) * level)
    return best
