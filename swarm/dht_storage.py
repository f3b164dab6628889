"""A byte budget on a node's local DHT storage and cache, installed into hivemind's DHT process.

Why our own storage: hivemind's ``DHTLocalStorage`` bounds nothing but an
optional entry count (``DHTNode``'s ``cache_size``, unbounded by default), so
every value a peer manages to store stays in memory until its expiration,
however large and however far off (40 values of 1.9 MB with a 10-day expiration
add ~70-100 MB to every honest process). :class:`BudgetedStorage` keeps a ledger of the
bytes held per key and subkey and enforces, after each successful store:

* a per-key cap in bytes and in subkeys: a key hivemind cannot return whole
  (its 4 MiB message cap, docs/ARCHITECTURE.md "Message cap") is unreadable for
  everyone, so a key is kept well below it;
* a per-sender quota in entries and bytes: what peers send over store RPCs is
  charged to the sending peer (:data:`STORE_SENDER`), and a sender over its
  quota loses its *own* entries expiring soonest, never anyone else's;
* a total byte budget; and, for the cache, a most number of keys.

The eviction rule is the same everywhere: **entries expiring soonest go first**
(the rule hivemind's own cache applies to its entry count), never the entry
just stored; a value that cannot fit even in an empty key is refused. Sizes
count the value, the subkey and a measured per-entry and per-key overhead of
hivemind's containers, so the budget tracks real memory.

**Who may store a subkey.** A record names its publisher in its subkey (our
records are signed by that key). With ``owners_only``, a subkey entry that
another peer sends is kept only if that peer *is* the subkey: the sender is the
libp2p-authenticated id of the store RPC (:data:`STORE_SENDER`, set by the store
handler :func:`_install` wraps). Minting keys then buys no storage: one host can
write one record per key, its own, so emptying a key of honest records takes as
many live hosts as the key holds records, not as many Ed25519 keys. The node's
own writes (its own records, its lookup results cached locally) carry no sender
and are kept as before. Nodes push no lookup results into others' caches
(``cache_nearest=0``, swarm.membership), so the rule drops nothing honest.

**Whose bytes they are.** The owner rule leaves one host one record per key,
but a host may make up as many keys as it likes: its own valid state records,
each under a made-up fingerprint, created 110 s ahead so they outlive every
honest record. The total budget evicts the soonest-expiring entries first,
which would then be all the honest ones. With the sender quota a
host holds at most ``sender_entries`` entries and ``sender_bytes`` bytes at each
replica however many keys it makes up; past that, its own stores evict its own
oldest-expiring entries, so filling the budget takes as many live hosts as the
budget holds quotas. The node's own writes carry no sender and are charged to no
one. The ledger of a sender goes when its last entry goes, so senders tracked
are never more than the entries held.

**No remote cache writes.** A store RPC may mark entries ``in_cache``, for the
node's *lookup cache*: a node then answers lookups from what another peer put
there. The wrapped store handler drops every such entry (counted as
:attr:`StorageEvent.REFUSED_REMOTE_CACHE`): nodes push no lookup results into
others' caches (``cache_nearest=0``), so no honest store is lost.

Two more hivemind behaviours it closes:

* a store that is not newer than what is held under the same key and subkey
  is refused before hivemind sees it: ``TimedStorage.store`` points its
  expiration bookkeeping at such a refused value, so when the *older*
  expiration passed it deleted the newer value (replaying an owner's older,
  still-valid record made the owner's current one vanish early);
* ``get`` returns a copy of a dictionary: a DHT lookup merges every other
  node's answer into the object it got from local storage, which wrote
  around any budget straight into the storage's own dictionary.

:func:`install_budgets` swaps these in for ``node.protocol.storage`` and
``node.protocol.cache`` inside the DHT process (``DHT.run_coroutine``),
carrying over what was stored meanwhile; :mod:`swarm.membership` calls it right
after the DHT starts.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from collections.abc import Generator, Iterable
from collections.abc import Set as AbstractSet
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any, TypeVar

import hivemind
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.p2p import P2PContext
from hivemind.proto import dht_pb2
from hivemind.utils import MSGPackSerializer, timed_storage
from hivemind.utils.timed_storage import TimedStorage, ValueWithExpiration

from swarm.dht_rate import StoreRate

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Regular:
    def __repr__(self) -> str:
        return "<regular value>"


REGULAR = _Regular()
"""The ledger's subkey for a value stored without a subkey (no peer can send this object)."""

STORE_SENDER: ContextVar[str | None] = ContextVar("swarm_dht_store_sender", default=None)
"""The base58 peer id that sent the store RPC being handled; None for this node's own writes."""

ENTRY_OVERHEAD_BYTES = 352
"""hivemind's containers per subkey entry beyond value and subkey bytes (tracemalloc: 347 B per entry)."""
KEY_OVERHEAD_BYTES = 1024
"""hivemind's containers per key holding a dictionary (tracemalloc: ~1,035 B for a key with one subkey)."""


class StorageEvent(StrEnum):
    """What the budget did to a store or to an entry already held; counted by value."""

    REFUSED_TOO_BIG = "refused: larger than the per-key cap"
    REFUSED_NOT_NEWER = "refused: not newer than the held value"
    REFUSED_NOT_OWNER = "refused: sent by a peer other than the record's subkey"
    EVICTED_KEY_FULL = "evicted: its key was over its byte or subkey cap"
    EVICTED_BUDGET = "evicted: the storage was over its byte budget"
    EVICTED_KEY_COUNT = "evicted: the storage held its most keys"
    EVICTED_SENDER_QUOTA = "evicted: its sender held more than its quota of entries or bytes"
    REFUSED_REMOTE_CACHE = "refused: a remote store into the lookup cache"
    REFUSED_RATE = "refused: its sender stored faster than the per-sender rate"


@dataclass(frozen=True)
class StorageBudget:
    """Bounds of one :class:`BudgetedStorage`; ``max_keys=None`` leaves the number of keys to the bytes.

    ``owners_only``: keep a subkey entry another peer sends only if that peer is the subkey.
    ``sender_entries`` / ``sender_bytes``: the most entries / bytes the stores of one remote peer may hold
    (None: no quota); over either, that peer's own entries expiring soonest are evicted.
    """

    total_bytes: int
    key_bytes: int
    key_subkeys: int
    max_keys: int | None = None
    owners_only: bool = True
    sender_entries: int | None = None
    sender_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.key_bytes < KEY_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES + 4096:
            raise ValueError(f"key_bytes={self.key_bytes}; use at least 8192 so one record fits in a key")
        if self.total_bytes < self.key_bytes:
            raise ValueError(f"total_bytes={self.total_bytes} < key_bytes={self.key_bytes}; raise total_bytes")
        if self.key_subkeys < 1 or (self.max_keys is not None and self.max_keys < 1):
            raise ValueError(f"key_subkeys={self.key_subkeys}, max_keys={self.max_keys}; use at least 1 each")
        if self.sender_entries is not None and self.sender_entries < 1:
            raise ValueError(f"sender_entries={self.sender_entries}; use at least 1 (or None: no quota)")
        if self.sender_bytes is not None and self.sender_bytes < self.key_bytes:
            # the entry just stored is never evicted: the quota must hold the largest entry a key admits
            raise ValueError(f"sender_bytes={self.sender_bytes} < key_bytes={self.key_bytes}; raise sender_bytes")


@dataclass
class StorageStats:
    """A snapshot of one storage's ledger and what its budget did."""

    used_bytes: int
    keys: int
    entries: int
    events: dict[str, int] = field(default_factory=dict)
    senders: int = 0
    """Remote peers with entries held here (each charged against its quota)."""


def entry_bytes(subkey: Any, value: bytes) -> int:
    """Bytes one (subkey, value) entry is charged: value, msgpack'd subkey and container overhead."""
    sub = 0 if subkey is REGULAR else len(MSGPackSerializer.dumps(subkey))
    return len(value) + sub + ENTRY_OVERHEAD_BYTES


def choose_evictions(candidates: Iterable[tuple[T, int]], bytes_over: int, entries_over: int = 0) -> list[T]:
    """The first ``candidates`` (in order) whose removal frees ``bytes_over`` bytes and ``entries_over`` entries.

    Pure: it reads ``candidates`` (``(item, bytes)`` pairs) only as far as it needs to, never one more.

    >>> choose_evictions([("a", 10), ("b", 5), ("c", 7)], bytes_over=12)
    ['a', 'b']
    >>> choose_evictions([("a", 10), ("b", 5)], bytes_over=0, entries_over=1)
    ['a']
    """
    chosen: list[T] = []
    pending = iter(candidates)
    while bytes_over > 0 or entries_over > 0:  # checked before taking the next: a lazy source yields no extra
        taken = next(pending, None)
        if taken is None:
            break
        chosen.append(taken[0])
        bytes_over -= taken[1]
        entries_over -= 1
    return chosen


@dataclass
class _Entry:
    size: int
    expiration: float
    seq: int
    sender: str | None = None


@dataclass
class _SenderLedger:
    """What one remote peer's stores hold here; its heap orders them for eviction (stale items skipped)."""

    entries: int = 0
    bytes: int = 0
    heap: list[tuple[float, int, Any, Any]] = field(default_factory=list)


class BudgetedStorage(DHTLocalStorage):  # type: ignore[misc]  # hivemind is not type-checked: Any
    """A ``DHTLocalStorage`` that keeps its byte ledger within a :class:`StorageBudget` (see the module docstring)."""

    def __init__(self, budget: StorageBudget) -> None:
        super().__init__(maxsize=None)  # the key count is enforced here, so the ledger sees every removal
        self.budget = budget
        self.events: Counter[StorageEvent] = Counter()
        self.used_bytes = 0
        self.entries = 0
        self._ledger: dict[Any, dict[Any, _Entry]] = {}
        self._key_bytes: dict[Any, int] = {}
        self._heap: list[tuple[float, int, Any, Any]] = []  # (expiration, seq, key, subkey); stale entries skipped
        self._seq = itertools.count()
        self._senders: dict[str, _SenderLedger] = {}

    # ---- the two ways hivemind stores -----------------------------------------------------------

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        return self._admit(key, REGULAR, value, expiration_time)

    def store_subkey(self, key: Any, subkey: Any, value: Any, expiration_time: float) -> bool:
        return self._admit(key, subkey, value, expiration_time)

    def get(self, key: Any) -> Any:
        """What is held under ``key``; a dictionary comes as a copy (see the module docstring)."""
        found = TimedStorage.get(self, key)
        if found is None or not isinstance(found.value, DictionaryDHTValue):
            return found
        return ValueWithExpiration(_fresh_copy(found.value), found.expiration_time)

    def _admit(self, key: Any, subkey: Any, value: Any, expiration: float) -> bool:
        sender = STORE_SENDER.get()
        if self.budget.owners_only and sender is not None and subkey != sender:
            return self._refuse(StorageEvent.REFUSED_NOT_OWNER, key, 0)
        self.purge_expired(timed_storage.get_dht_time())
        if isinstance(value, DictionaryDHTValue):  # a whole dictionary (the cache stores lookup results so)
            value = _fresh_copy(value)
            size = sum(entry_bytes(s, v) for s, (v, _) in value.items())
        else:
            size = entry_bytes(subkey, value)
        if size + KEY_OVERHEAD_BYTES > self.budget.key_bytes:
            return self._refuse(StorageEvent.REFUSED_TOO_BIG, key, size)
        held = self._held_expiration(key, subkey)
        if held is not None and expiration <= held:
            return self._refuse(StorageEvent.REFUSED_NOT_NEWER, key, size)
        previous = self.data.get(key)
        was_dict = previous is not None and isinstance(previous.value, DictionaryDHTValue)
        if not self._store_held(key, subkey, value, expiration):
            return False
        if subkey is REGULAR or not was_dict:
            self._unledger_key(key)  # the whole value under ``key`` was replaced
        if isinstance(value, DictionaryDHTValue):
            for sub, (v, exp) in value.items():
                self._ledger_put(key, sub, entry_bytes(sub, v), exp, sender)
        else:
            self._ledger_put(key, subkey, size, expiration, sender)
        self._enforce(key, subkey, sender)
        return True

    def _store_held(self, key: Any, subkey: Any, value: Any, expiration: float) -> bool:
        """``DHTLocalStorage.store`` / ``store_subkey``, on the held objects (``get`` hands out copies)."""
        if subkey is REGULAR:
            return bool(TimedStorage.store(self, key, value, expiration))
        found = TimedStorage.get(self, key)
        if found is not None and isinstance(found.value, DictionaryDHTValue):
            if expiration > found.value.latest_expiration_time:
                TimedStorage.store(self, key, found.value, expiration)  # the key lives as long as its latest entry
            return bool(found.value.store(subkey, value, expiration))
        if found is not None and expiration <= found.expiration_time:
            return False  # a newer regular value is held
        fresh = DictionaryDHTValue()
        fresh.store(subkey, value, expiration)
        return bool(TimedStorage.store(self, key, fresh, expiration))

    def _refuse(self, event: StorageEvent, key: Any, size: int) -> bool:
        self.events[event] += 1
        logger.debug("DHT storage %s (%d bytes under key %s)", event.value, size, str(key)[:12])
        return False

    def _held_expiration(self, key: Any, subkey: Any) -> float | None:
        """Expiration of what is held under (key, subkey); for a dictionary without it, None (a new subkey)."""
        item = self.data.get(key)
        if item is None:
            return None
        if isinstance(item.value, DictionaryDHTValue) and subkey is not REGULAR:
            sub = item.value.data.get(subkey)
            return None if sub is None else float(sub.expiration_time)
        return float(item.expiration_time)

    # ---- the ledger -------------------------------------------------------------------------------

    def _ledger_put(self, key: Any, subkey: Any, size: int, expiration: float, sender: str | None = None) -> None:
        entries = self._ledger.get(key)
        if entries is None:
            entries = self._ledger[key] = {}
            self._key_bytes[key] = KEY_OVERHEAD_BYTES
            self.used_bytes += KEY_OVERHEAD_BYTES
        old = entries.get(subkey)
        self.entries += old is None
        delta = size - (old.size if old is not None else 0)
        if old is not None:
            self._uncharge(old)  # a replaced entry is charged to whoever sent the new one
        seq = next(self._seq)
        entry = entries[subkey] = _Entry(size, expiration, seq, sender)
        self._key_bytes[key] += delta
        self.used_bytes += delta
        item = (expiration, seq, key, subkey)
        heapq.heappush(self._heap, item)
        self._charge(entry, item)
        if len(self._heap) > 2 * self.entries + 1024:
            self._compact()

    def _unledger(self, key: Any, subkey: Any) -> None:
        entries = self._ledger.get(key)
        if entries is None or subkey not in entries:
            return
        entry = entries.pop(subkey)
        self._uncharge(entry)
        self.entries -= 1
        self._key_bytes[key] -= entry.size
        self.used_bytes -= entry.size
        if not entries:
            self.used_bytes -= self._key_bytes.pop(key)
            del self._ledger[key]

    def _charge(self, entry: _Entry, item: tuple[float, int, Any, Any]) -> None:
        """Count ``entry`` (heap ``item``) against its sender's quota; the node's own writes count for no one."""
        if entry.sender is None:
            return
        held = self._senders.get(entry.sender)
        if held is None:
            held = self._senders[entry.sender] = _SenderLedger()
        held.entries += 1
        held.bytes += entry.size
        heapq.heappush(held.heap, item)
        if len(held.heap) > 2 * held.entries + 64:  # replaced or removed entries leave stale items behind
            held.heap = [i for i in held.heap if self._live(i)]
            heapq.heapify(held.heap)

    def _uncharge(self, entry: _Entry) -> None:
        """Take ``entry`` off its sender's quota; a sender left with nothing is forgotten (memory stays bounded)."""
        if entry.sender is None:
            return
        held = self._senders[entry.sender]
        held.entries -= 1
        held.bytes -= entry.size
        if held.entries == 0:
            del self._senders[entry.sender]

    def _unledger_key(self, key: Any) -> None:
        for subkey in list(self._ledger.get(key, ())):
            self._unledger(key, subkey)

    def _compact(self) -> None:
        """Rebuild the heap from the ledger: replaced entries leave stale heap items behind."""
        self._heap = [(e.expiration, e.seq, k, s) for k, entries in self._ledger.items() for s, e in entries.items()]
        heapq.heapify(self._heap)

    def _live(self, item: tuple[float, int, Any, Any]) -> bool:
        _, seq, key, subkey = item
        entry = self._ledger.get(key, {}).get(subkey)
        return entry is not None and entry.seq == seq

    # ---- removal ----------------------------------------------------------------------------------

    def purge_expired(self, now: float) -> None:
        """Drop every entry whose expiration is before ``now`` from the ledger and from memory."""
        while self._heap and self._heap[0][0] < now:
            item = heapq.heappop(self._heap)
            if self._live(item):
                self._remove(item[2], item[3])

    def _remove(self, key: Any, subkey: Any) -> None:
        """Forget (key, subkey) in the ledger and delete it from hivemind's containers."""
        self._unledger(key, subkey)
        item = self.data.get(key)
        if item is None:
            return
        if subkey is REGULAR or not isinstance(item.value, DictionaryDHTValue):
            del self[key]
            return
        del item.value[subkey]
        if not item.value.data:
            del self[key]

    def _evict(self, victims: Iterable[tuple[Any, Any]], event: StorageEvent) -> None:
        for key, subkey in victims:
            self._remove(key, subkey)
            self.events[event] += 1
            logger.debug("DHT storage %s (key %s)", event.value, str(key)[:12])

    def _enforce(self, key: Any, subkey: Any, sender: str | None = None) -> None:
        """Bring the sender, the key, the key count and the total back within the budget, sparing (key, subkey).

        The sender's quota goes first: a host over it pays with its own entries before the total budget,
        whose rule (soonest expiring first) picks whoever's they are, is reached.
        """
        b = self.budget
        held = self._senders.get(sender) if sender is not None else None
        if held is not None:
            over_entries = held.entries - b.sender_entries if b.sender_entries is not None else 0
            over_bytes = held.bytes - b.sender_bytes if b.sender_bytes is not None else 0
            if over_entries > 0 or over_bytes > 0:
                own = self._soonest(spare=(key, subkey), heap=held.heap)
                try:
                    chosen = choose_evictions(own, over_bytes, over_entries)
                finally:
                    own.close()
                self._evict(chosen, StorageEvent.EVICTED_SENDER_QUOTA)
        entries = self._ledger.get(key, {})
        over_bytes, over_entries = self._key_bytes.get(key, 0) - b.key_bytes, len(entries) - b.key_subkeys
        if over_bytes > 0 or over_entries > 0:
            others = sorted((e.expiration, e.seq, s, e.size) for s, e in entries.items() if s != subkey)
            chosen = choose_evictions((((key, s), size) for _, _, s, size in others), over_bytes, over_entries)
            self._evict(chosen, StorageEvent.EVICTED_KEY_FULL)
        if b.max_keys is not None and len(self._ledger) > b.max_keys:
            latest = sorted((max(e.expiration for e in es.values()), k) for k, es in self._ledger.items() if k != key)
            keys = choose_evictions(((k, 1) for _, k in latest), 0, len(self._ledger) - b.max_keys)
            self._evict([(k, s) for k in keys for s in list(self._ledger[k])], StorageEvent.EVICTED_KEY_COUNT)
        if self.used_bytes > b.total_bytes:
            soonest = self._soonest(spare=(key, subkey))
            try:
                chosen = choose_evictions(soonest, self.used_bytes - b.total_bytes)
            finally:
                soonest.close()  # puts the spared entry back on the heap
            self._evict(chosen, StorageEvent.EVICTED_BUDGET)

    def _soonest(
        self, spare: tuple[Any, Any], heap: list[tuple[float, int, Any, Any]] | None = None
    ) -> Generator[tuple[tuple[Any, Any], int], None, None]:
        """Live entries of ``heap`` (default: all), soonest expiring first, popped off it as they are taken.

        The spared entry is put back when the generator closes; so is nothing else: what was taken is evicted.
        """
        heap = self._heap if heap is None else heap
        kept: list[tuple[float, int, Any, Any]] = []
        try:
            while heap:
                item = heapq.heappop(heap)
                if not self._live(item):
                    continue
                if (item[2], item[3]) == spare:
                    kept.append(item)
                    continue
                yield (item[2], item[3]), self._ledger[item[2]][item[3]].size
        finally:
            for item in kept:
                heapq.heappush(heap, item)

    def sender_usage(self, sender: str) -> tuple[int, int]:
        """(entries, bytes) the stores of ``sender`` hold here, as charged against its quota."""
        held = self._senders.get(sender)
        return (0, 0) if held is None else (held.entries, held.bytes)

    def stats(self) -> StorageStats:
        events = {e.value: n for e, n in self.events.items()}
        return StorageStats(self.used_bytes, len(self._ledger), self.entries, events, len(self._senders))


def _fresh_copy(value: DictionaryDHTValue) -> DictionaryDHTValue:
    """The same entries in a new dictionary, so the expiration bookkeeping is clean (see the module docstring)."""
    copy = DictionaryDHTValue()
    for subkey, (v, exp) in value.items():
        copy.store(subkey, v, exp)
    return copy


def _carry_over(old: Any, new: BudgetedStorage) -> BudgetedStorage:
    """Store what ``old`` holds into ``new`` (through its budget)."""
    for key, item in list(old.items()):
        if isinstance(item.value, DictionaryDHTValue):
            for subkey, (v, exp) in item.value.items():
                new.store_subkey(key, subkey, v, exp)
        else:
            new.store(key, item.value, item.expiration_time)
    return new


async def _install(_dht: Any, node: Any, storage: StorageBudget, cache: StorageBudget) -> None:
    protocol = node.protocol
    # no other coroutine runs between these two lines: nothing is stored around the budgets
    protocol.storage = _carry_over(protocol.storage, BudgetedStorage(storage))
    protocol.cache = _carry_over(protocol.cache, BudgetedStorage(cache))
    await _name_store_senders(protocol)  # always: the sender quota and the cache rule need it, owners_only or not


async def _name_store_senders(protocol: DHTProtocol) -> None:
    """Handle store RPCs with :data:`STORE_SENDER` set to the caller's authenticated peer id.

    Before hivemind sees the request, it loses the entries bound for the lookup
    cache (:func:`_refuse_remote_cache`) and, for a storage that keeps owners'
    records only, those naming another peer (:func:`_refuse_foreign`).
    hivemind binds its handler when the protocol starts, so the store handler
    is registered again around it. A store that arrives in the moment between
    the two daemon calls fails like a store to a busy replica; the sender's
    next refresh reaches this node.
    """
    if protocol.client_mode:
        return  # a client serves no stores
    if protocol.authorizer is not None:  # wrapping would bypass it; this project runs none
        logger.warning(
            "DHT stores are authorized by %s: records sent by others are not checked against their subkey, "
            "not charged to their sender's quota, and may write this node's lookup cache",
            type(protocol.authorizer).__name__,
        )
        return
    handle = protocol.rpc_store
    rate = StoreRate()

    async def rpc_store(request: dht_pb2.StoreRequest, context: P2PContext) -> dht_pb2.StoreResponse:
        sender = context.remote_id.to_base58()
        dropped = _refuse_over_rate(protocol, request, rate.allow(sender, len(request.keys), time.monotonic()))
        dropped |= _refuse_remote_cache(protocol, request, skip=dropped)
        dropped |= _refuse_foreign(protocol, request, sender, skip=dropped)  # before hivemind checks signatures
        kept = _without(request, dropped) if dropped else request
        token = STORE_SENDER.set(sender)
        try:
            response = await handle(kept, context)
        finally:
            STORE_SENDER.reset(token)
        if dropped and response is not None:
            answers = iter(list(response.store_ok))
            del response.store_ok[:]
            response.store_ok.extend(False if i in dropped else next(answers, False) for i in range(len(request.keys)))
        return response

    name = protocol._get_handle_name(None, "rpc_store")
    await protocol.p2p.remove_protobuf_handler(name)
    await protocol.p2p.add_protobuf_handler(name, rpc_store, dht_pb2.StoreRequest)


def foreign_entries(request: dht_pb2.StoreRequest, sender: str) -> set[int]:
    """Indices of the entries of a store request whose subkey names a peer other than ``sender``.

    A regular value or a whole dictionary names no one here: the validator and
    the storage decide those. A tag that does not decode is left to hivemind,
    which refuses it as before.
    """
    foreign: set[int] = set()
    for i, tag in enumerate(request.subkeys):
        if tag in DHTProtocol.RESERVED_SUBKEYS:
            continue
        try:
            subkey = MSGPackSerializer.loads(tag)
        except Exception:  # untrusted bytes: any decoding failure is hivemind's to refuse
            continue
        if subkey != sender:
            foreign.add(i)
    return foreign


def _well_formed(request: dht_pb2.StoreRequest) -> bool:
    """Whether every column of a store request has one value per entry (else hivemind refuses it whole)."""
    columns = (request.keys, request.subkeys, request.values, request.expiration_time)
    return all(len(c) == len(request.in_cache) for c in columns)


def _refuse_over_rate(protocol: DHTProtocol, request: dht_pb2.StoreRequest, allowed: int) -> set[int]:
    """The entries of ``request`` past the ``allowed`` first ones, counted (see :mod:`swarm.dht_rate`)."""
    if not _well_formed(request):
        return set()  # hivemind's handler refuses the whole request
    refused = set(range(allowed, len(request.keys)))
    if refused and isinstance(protocol.storage, BudgetedStorage):
        protocol.storage.events[StorageEvent.REFUSED_RATE] += len(refused)
    return refused


def _refuse_remote_cache(
    protocol: DHTProtocol, request: dht_pb2.StoreRequest, skip: AbstractSet[int] = frozenset()
) -> set[int]:
    """Indices of the entries of a remote store bound for the lookup cache, counted there as refused.

    A node answers lookups from its cache, so whatever a peer writes there is
    served as if found; nodes push no lookup results into others' caches
    (``cache_nearest=0``, swarm.membership), so nothing honest is dropped.
    """
    if not _well_formed(request):
        return set()  # hivemind's handler refuses the whole request
    refused = {i for i, in_cache in enumerate(request.in_cache) if in_cache and i not in skip}
    if refused and isinstance(protocol.cache, BudgetedStorage):
        protocol.cache.events[StorageEvent.REFUSED_REMOTE_CACHE] += len(refused)
    return refused


def _refuse_foreign(
    protocol: DHTProtocol, request: dht_pb2.StoreRequest, sender: str, skip: AbstractSet[int] = frozenset()
) -> set[int]:
    """The foreign entries (:func:`foreign_entries`) bound for a storage that keeps owners' records only, counted.

    Entries at ``skip`` (already dropped for another reason) are neither counted nor returned.
    """
    refused: set[int] = set()
    if len(request.in_cache) != len(request.subkeys):
        return refused  # malformed: hivemind's handler refuses the whole request
    for i in foreign_entries(request, sender) - skip:
        target = protocol.cache if request.in_cache[i] else protocol.storage
        if isinstance(target, BudgetedStorage) and target.budget.owners_only:
            target.events[StorageEvent.REFUSED_NOT_OWNER] += 1
            refused.add(i)
    return refused


def _without(request: dht_pb2.StoreRequest, dropped: set[int]) -> dht_pb2.StoreRequest:
    """A copy of ``request`` without the entries at ``dropped``."""
    kept = [i for i in range(len(request.keys)) if i not in dropped]
    out = dht_pb2.StoreRequest()
    out.CopyFrom(request)
    for name in ("keys", "subkeys", "values", "expiration_time", "in_cache"):
        column = list(getattr(request, name))
        del getattr(out, name)[:]
        getattr(out, name).extend(column[i] for i in kept)
    return out


def install_budgets(dht: hivemind.DHT, storage: StorageBudget, cache: StorageBudget, timeout: float) -> None:
    """Replace the DHT process's storage and cache by budgeted ones (what they hold is carried over)."""
    dht.run_coroutine(partial(_install, storage=storage, cache=cache), return_future=True).result(timeout=timeout)


async def _stats(_dht: Any, node: Any) -> dict[str, StorageStats]:
    found = {"storage": node.protocol.storage, "cache": node.protocol.cache}
    return {name: s.stats() for name, s in found.items() if isinstance(s, BudgetedStorage)}


def storage_stats(dht: hivemind.DHT, timeout: float) -> dict[str, StorageStats]:
    """Ledger snapshots of the budgeted ``storage`` and ``cache`` in ``dht``'s process."""
    stats: dict[str, StorageStats] = dht.run_coroutine(_stats, return_future=True).result(timeout=timeout)
    return stats
