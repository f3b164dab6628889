"""Outcomes of checks that depend only on a peer's bytes, remembered by content.

Opening a signed envelope (decoding, schema, Ed25519) gives the same answer
for the same bytes every time, and the DHT hands a node the same entries over
and over: a collect rereads two windows every round, and hivemind validates
every entry of every lookup answer. :class:`ContentMemo` keeps the last
``capacity`` outcomes by sha256 of (tag, bytes), oldest use out first. A flood
of distinct inputs only evicts: each costs what it cost without the memo.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class ContentMemo(Generic[V]):
    """``get(tag, data, compute)``: ``compute()``'s result for these bytes, computed once while remembered.

    Safe across threads, and across a fork: a lock held by another thread at
    the fork (hivemind forks the DHT process from the node) is replaced.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hits = 0
        self._items: OrderedDict[bytes, V] = OrderedDict()
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, tag: str, data: bytes, compute: Callable[[], V]) -> V:
        digest = hashlib.sha256(tag.encode() + b"\0" + data).digest()
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            if digest in self._items:
                self._items.move_to_end(digest)
                self.hits += 1
                return self._items[digest]
        value = compute()  # outside the lock: an Ed25519 check must not hold up other threads
        with self._lock:
            self._items[digest] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return value
