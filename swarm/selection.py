"""Choosing what to fetch from the DHT entries of a collect: pure, steered by reputation.

Opens each raw ``(subkey, value)`` entry once (:class:`OpenedCache`), refuses
forged, malformed and future-dated descriptors with a reason, and ranks
publishers by :meth:`swarm.reputation.Reputation.choose`: a claimed time can
filter a descriptor out but never buys it priority.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from protocol.errors import MessageRejected
from protocol.messages import open_descriptor
from protocol.schema import Descriptor
from swarm.memo import ContentMemo
from swarm.refusals import BatchRejection, Refusal
from swarm.reputation import Reputation


@dataclass
class Selection:
    """What :func:`select_descriptors` decided: descriptors to fetch, in order, and what it refused."""

    chosen: list[Descriptor]
    rejected: list[tuple[str, Refusal]]
    skipped_banned: int = 0


def select_descriptors(
    entries: Iterable[tuple[Any, Any]],
    *,
    own: str,
    now: float,
    since: float,
    fetched: Container[tuple[str, str]],
    limit: int,
    rng: random.Random,
    reputation: Reputation,
    live: Container[str] = frozenset(),
    max_future_s: float = 30.0,
    opened: OpenedCache | None = None,
) -> Selection:
    """Choose what to fetch from raw DHT ``(subkey, value)`` entries; reads ``reputation``, never changes it.

    Entries under a banned publisher's subkey are skipped unopened (counted
    once per publisher). Forged or malformed entries are refused with a
    reason, and so is a ``created`` more than ``max_future_s`` in the future
    (:attr:`BatchRejection.FUTURE_DATED`). Own, expired, older-than-``since``
    and already tried (``fetched``, by publisher and digest) ones are dropped silently. ``created`` only
    filters: it never orders, so a claimed time cannot buy priority. Each
    publisher gets at most one descriptor (its freshest untried one), and
    publishers are ranked by :meth:`Reputation.choose` (good ones first,
    unknown ones within the exploration slots), at most ``limit`` of them.
    """
    freshest: dict[str, Descriptor] = {}
    rejected: list[tuple[str, Refusal]] = []
    banned: set[str] = set()
    for subkey, value in entries:
        if isinstance(subkey, str) and reputation.banned(subkey, now) is not None:
            banned.add(subkey)  # its own records only: a foreign record under this subkey cannot be stored
            continue
        desc = _open_entry(subkey, value, now, max_future_s, rejected, opened)
        stale = desc is None or desc.expires <= now or desc.created < since
        if desc is None or stale or desc.publisher == own or (desc.publisher, desc.payload_digest) in fetched:
            continue
        best = freshest.get(desc.publisher)
        if best is None or (desc.created, desc.payload_digest) > (best.created, best.payload_digest):
            freshest[desc.publisher] = desc
    order = reputation.choose(freshest, now, limit=limit, live=live, rng=rng)
    return Selection([freshest[p] for p in order], rejected, len(banned))


class OpenedCache:
    """Descriptors already opened (or refused), by (subkey, value): each DHT entry's signature is checked once.

    A collect reads every entry of two windows; under a flood of validly
    signed descriptors (hundreds of keys) checking each Ed25519 signature on
    every read cost ~0.1 ms an entry, every round. Bounded (:class:`swarm.memo.ContentMemo`).
    """

    def __init__(self, capacity: int = 8192) -> None:
        self._memo: ContentMemo[Descriptor | Refusal] = ContentMemo(capacity)

    def __len__(self) -> int:
        return len(self._memo)

    def open(self, subkey: Any, value: Any) -> Descriptor | Refusal:
        """The descriptor under ``subkey``, or the refusal; from the cache when seen before."""
        if not isinstance(subkey, str) or not isinstance(value, bytes):
            return _open_uncached(subkey, value)
        return self._memo.get(subkey, value, lambda: _open_uncached(subkey, value))


def _open_uncached(subkey: Any, value: Any) -> Descriptor | Refusal:
    try:
        desc = open_descriptor(value)
    except MessageRejected as e:
        return Refusal(BatchRejection.BAD_DESCRIPTOR, e.reason)
    if desc.publisher != subkey:
        return Refusal(BatchRejection.WRONG_SUBKEY, f"descriptor of {desc.publisher[-6:]}")
    return desc


def _open_entry(
    subkey: Any,
    value: Any,
    now: float,
    max_future_s: float,
    rejected: list[tuple[str, Refusal]],
    opened: OpenedCache | None = None,
) -> Descriptor | None:
    """The descriptor in one DHT entry, or None after appending the reason it was refused."""
    who = subkey[:128] if isinstance(subkey, str) else f"<{type(subkey).__name__} subkey>"  # no repr: depth
    desc = opened.open(subkey, value) if opened is not None else _open_uncached(subkey, value)
    if isinstance(desc, Refusal):
        rejected.append((who, desc))
        return None
    if desc.created > now + max_future_s:
        ahead = f"created {desc.created - now:.0f} s ahead, {max_future_s:g} s allowed"
        rejected.append((who, Refusal(BatchRejection.FUTURE_DATED, ahead)))
        return None
    return desc
