"""Sharded discovery: which DHT keys a rollout descriptor is stored under and which keys a reader reads.

One key per time window that holds every publisher's descriptor makes every
reader pull all N descriptors from the same few replicas each round: the
replicas' load grows as N^2 per window, and past hivemind's 4 MiB message cap
(~12,000 descriptors of ~350 B) the key silently reads as nothing. So a
window's descriptors are spread over ``S`` shard keys (``S`` a power of two);
a publisher's shard is a hash of its peer id and the window, so it moves
every window and no publisher can pick it, and a reader samples a few shards
instead of reading them all. ``S`` grows with the swarm's estimated size,
which each node estimates from the shards it reads, with hysteresis so that
nodes agree except near a threshold; near one, a publisher also stores its
descriptor at the neighbouring level, so a reader that has already moved (or
not yet) still finds it there.

Shard 0 of every level is one key, the window's base key (the unsharded key
of one shard). So the base key holds the publishers in shard 0 at their own
level, ~64 whatever the swarm's size, and is a census: from which of them are
also in shard 0 at 2x, 4x, ... a reader tells the level they publish at, and so
the swarm's size. A node that joins a large swarm starts at one shard, reads
the base key and moves to the swarm's level at once; nodes that joined
together, and would otherwise find only each other at one shard (an island),
move when any of them reads shard 0.

All functions are pure (the caller passes the random generator); the DHT
validator recomputes the same keys, so a descriptor stored under any other key
is refused (:class:`swarm.validation.DescriptorBinding`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

MAX_SHARDS = 1024  # 1024 x 64 descriptors per shard: far past the swarms we can measure
TARGET_PER_SHARD = 64  # descriptors one shard key should hold per window (~22 KB: one small DHT reply)
LEVELS: tuple[int, ...] = tuple(1 << i for i in range(int(math.log2(MAX_SHARDS)) + 1))


@functools.lru_cache(maxsize=1 << 16)
def _position(publisher: str, window: int) -> int:
    """``publisher``'s place in ``window`` (cached: a census asks for every level of the same publishers)."""
    return int.from_bytes(hashlib.sha256(f"{publisher}:{window}".encode()).digest()[:8], "big")


def shard_of(publisher: str, window: int, shards: int) -> int:
    """The shard of ``publisher``'s descriptors in ``window`` among ``shards`` (a power of two)."""
    return _position(publisher, window) % shards


def descriptor_key(swarm_id: str, window: int, shards: int, shard: int) -> str:
    """The DHT key of one shard of one window; shard 0 of every level is the window's base key (with one
    shard, the unsharded key of earlier versions)."""
    if shards == 1 or shard == 0:
        return f"{swarm_id}:rollouts:{window}"
    return f"{swarm_id}:rollouts:{window}:{shards}:{shard}"


def publisher_key(swarm_id: str, publisher: str, window: int, shards: int) -> str:
    """Where ``publisher`` stores its descriptor of ``window`` when the swarm has ``shards`` shards."""
    return descriptor_key(swarm_id, window, shards, shard_of(publisher, window, shards))


def publisher_keys(
    swarm_id: str, publisher: str, window: int, shards: int, estimated_publishers: float, floor: int = 1
) -> list[str]:
    """Every key ``publisher`` stores its descriptor of ``window`` under: its shard at its own level, and at a
    neighbouring level when its estimate is near the threshold that would move it there (at most two; never
    below ``floor``, the swarm's configured fewest shards, where no one reads)."""
    down, up = near_threshold(shards, estimated_publishers)
    levels = [shards, *([shards // 2] if down and shards // 2 >= floor else []), *([shards * 2] if up else [])]
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


def read_plan(windows: tuple[int, ...], shards: int, reads: int, rng: random.Random) -> list[ShardRead]:
    """The keys one collect reads: ``reads`` random shards of each window at this node's level (all of them
    if there are fewer)."""
    plan: list[ShardRead] = []
    for w in windows:
        plan += [ShardRead(w, shards, s) for s in sorted(rng.sample(range(shards), min(reads, shards)))]
    return plan


def smoothed(previous: float, new: float, weight: float = 0.5) -> float:
    """The running estimate after one more collect: averaged, against sampling noise, except that the first one
    and one over twice the last are taken as they are (a census that found the swarm's level: a node that
    joined late, or an island of nodes that joined together, moves there at once)."""
    if previous <= 0 or new > 2 * previous:
        return new
    return weight * new + (1 - weight) * previous


MIN_CENSUS = TARGET_PER_SHARD // 4  # a level counts in the census from this many publishers in its shard 0


def census(publishers: Iterable[str], window: int) -> float:
    """The swarm's publishers per window, from those found under ``window``'s base key (shard 0 of every
    level): the publishers of a level-L swarm found there are all in shard 0 at L, and about N / L of them;
    so the largest (publishers in shard 0 at L) x L over the levels with at least ``MIN_CENSUS`` of them."""
    found = list(publishers)
    best = float(len(found))
    for level in LEVELS[1:]:
        in_zero = sum(1 for p in found if shard_of(p, window, level) == 0)
        if in_zero < MIN_CENSUS:
            break  # fewer still at every higher level: shard 0 at 2L is inside shard 0 at L
        best = max(best, float(in_zero * level))
    return best


def estimate_publishers(found: dict[ShardRead, list[str]], shards: int) -> float | None:
    """The swarm's publishers per window from one collect's reads (read -> publishers found): the census of
    each base key read, and the publishers per other shard read at this node's level times the level
    (each publisher is in exactly one of them); the largest. None when nothing of this level was read."""
    own = [len(pubs) for read, pubs in found.items() if read.shards == shards and read.shard != 0]
    bases = [census(pubs, read.window) for read, pubs in found.items() if read.shard == 0 or read.shards == 1]
    figures = ([sum(own) / len(own) * shards] if own else []) + bases
    return max(figures) if figures else None
