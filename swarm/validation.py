"""The DHT record validator of a swarm: only our signed records, under the keys and lifetimes they name.

hivemind calls ``validate`` in the DHT process whenever a peer asks it to store
a record and whenever a lookup answer arrives (a dictionary answer is dropped
whole if one entry fails). The rules, in the order they are checked:

1. The value is at most the largest registered kind's size (checked before
   any decoding) and is one of *our* signed envelopes of a registered kind.
   Anything else is refused: in an open swarm a permissive validator lets any
   peer park arbitrary bytes for days in every node's memory (40 x 1.9 MB
   under foreign keys add ~70-100 MB to every honest process).
2. It sits under a subkey (regular values are refused), and the subkey is the
   peer that signed it; schema and Ed25519 signature hold.
3. Its key is the one its content names: a descriptor's window key
   (its publisher's shard of its ``created`` window, at any shard level:
   :func:`swarm.discovery.valid_keys`), a sync record's
   join / vote / state key. A genuine record cannot be replayed under another
   window, revision or group.
4. Its DHT expiration is bound to the signed record: a descriptor's to its
   ``expires``, a sync record's to ``created`` plus the lifetime
   :mod:`swarm.sync.dhtio` gives its kind (:func:`sync_record_ttls`). hivemind
   keeps, per key and subkey, the value with the latest expiration, so a replay
   with a long expiration would displace its owner's newer records (and refuse
   its later publishes). Expiration grows with ``created``, so
   an older record can never outlive a newer one of the same signer and kind.
5. ``created`` is at most :data:`protocol.limits.MAX_CLOCK_SKEW_S` ahead of
   this node's clock.

Opening an envelope (decoding, schema, Ed25519 signature) depends only on its
bytes, so its outcome is remembered for the last :data:`OPENED_CACHE` distinct
envelopes. hivemind validates every entry of every reply a lookup gets, and a
lookup asks several nodes, each answering with the key's whole dictionary: on
one 2-core machine running 64 nodes, DHT processes spent two thirds of their
CPU in this validator, mostly re-verifying the same descriptors
(bench/RESULTS.md, "Validation against real runs"). The rules that depend on
the key, subkey, expiration and clock still run on every call. A flood of
distinct envelopes only evicts: it costs what it cost without the cache.

Every refusal is counted by :class:`RecordRefusal` on the validator (read it
with :func:`refusal_counts`) and logged at DEBUG. Every node of a swarm must
run the same rules (docs/ARCHITECTURE.md, "Validators"): swarm id, window width
and sync timeouts are swarm-wide settings, like the swarm id itself.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import hivemind
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.timed_storage import get_dht_time

from protocol import codec, limits
from protocol.errors import MessageRejected
from protocol.messages import DESCRIPTOR_KIND
from protocol.schema import Descriptor
from protocol.signing import open_envelope
from swarm import discovery
from swarm.configs import MAX_WINDOW_FACTOR
from swarm.memo import ContentMemo
from swarm.sync.config import COMPRESSIONS, OuterSyncConfig
from swarm.sync.records import (
    JOIN_KIND,
    KINDS,
    MAX_RECORD_BYTES,
    STATE_KIND,
    VOTE_KIND,
    JoinRecord,
    StateRecord,
    VoteRecord,
    join_key,
    state_key,
    vote_key,
)

logger = logging.getLogger(__name__)

Parse = Callable[[Any], Any]
Signer = Callable[[Any], str]

_ENVELOPE_OVERHEAD = 16  # hivemind msgpack-wraps the envelope bytes (bin32 header); 16 bytes cover it
DESCRIPTOR_EXPIRY_SLACK_S = 0.0
"""swarm.exchange stores a descriptor with exactly ``desc.expires`` as its DHT expiration (a float
that travels as a protobuf double and a msgpack float64, bit for bit), so no slack is needed; any
slack would let a replay of a descriptor published that much earlier block the newer one."""
SYNC_EXPIRY_SLACK_S = 1.0
"""swarm.sync.dhtio stamps ``created`` from its clock, then signs, then reads ``get_dht_time()`` for
the expiration: microseconds apart unless the thread is descheduled. One second covers a stalled
thread; a replay can block a record of the same kind and key published less than this after it."""


class RecordRefusal(StrEnum):
    """Why a DHT record was refused; the values are the labels counted and logged."""

    OVERSIZED = "value larger than any record kind"
    NOT_OURS = "not a signed envelope of a registered kind"
    NO_SUBKEY = "regular value (records must sit under their signer's subkey)"
    BAD_RECORD = "bad schema or signature"
    WRONG_SUBKEY = "stored under another peer's subkey"
    WRONG_KEY = "stored under a key its content does not name"
    OUTLIVES_SIGNATURE = "DHT expiration beyond the signed lifetime"
    FROM_THE_FUTURE = "created too far in the future"


def dht_key(key: str) -> bytes:
    """The bytes hivemind passes to validators as ``DHTRecord.key`` for a store under ``key``."""
    return bytes(DHTID.generate(source=key).to_bytes())


class Binding(Protocol):
    """Checks that a signed record may sit under ``key`` until ``expiration`` (at time ``now``)."""

    def check(self, record: Any, key: bytes, expiration: float, now: float) -> RecordRefusal | None: ...


def _from_the_future(created: float, now: float) -> bool:
    return created > now + limits.MAX_CLOCK_SKEW_S


@dataclass(frozen=True)
class DescriptorBinding:
    """A descriptor lives under its ``created`` window's key until at most its signed ``expires``.

    ``swarm_id=None`` skips the key check (exchange-only test harnesses that do
    not know the swarm's window); a node always passes both.
    """

    swarm_id: str | None
    window_s: float
    slack_s: float = DESCRIPTOR_EXPIRY_SLACK_S

    def check(self, record: Any, key: bytes, expiration: float, now: float) -> RecordRefusal | None:
        desc: Descriptor = record
        if _from_the_future(desc.created, now):
            return RecordRefusal.FROM_THE_FUTURE
        if expiration > desc.expires + self.slack_s:
            return RecordRefusal.OUTLIVES_SIGNATURE
        if self.swarm_id is not None and not self._under_own_key(desc, key):
            return RecordRefusal.WRONG_KEY
        return None

    def _under_own_key(self, desc: Descriptor, key: bytes) -> bool:
        """Whether ``key`` is its publisher's shard of its window at some shard level (the base key first:
        most descriptors live there, so most checks hash one key)."""
        assert self.swarm_id is not None
        window = int(desc.created // self.window_s)
        return any(key == dht_key(k) for k in discovery.valid_keys(self.swarm_id, desc.publisher, window))


def sync_record_keys(swarm_id: str, record: Any) -> tuple[str, ...]:
    """The DHT keys a sync record may sit under (a join record does not name its wire encoding: any of them)."""
    if isinstance(record, JoinRecord):
        r = record
        return tuple(join_key(swarm_id, r.fingerprint, r.revision, r.state_hash, c) for c in COMPRESSIONS)
    if isinstance(record, VoteRecord):
        return (vote_key(swarm_id, record.fingerprint, record.group_id),)
    if isinstance(record, StateRecord):
        return (state_key(swarm_id, record.fingerprint),)
    return ()


def sync_record_ttls(cfg: OuterSyncConfig) -> dict[str, float]:
    """The DHT lifetime :mod:`swarm.sync.dhtio` gives each record kind under ``cfg``.

    Mirrors ``SyncRecords.publish_state``, ``_join`` and ``vote``;
    tests/swarm/test_validation.py stores through dhtio itself, so a change there fails it.
    """
    return {
        STATE_KIND: cfg.record_ttl_s,
        JOIN_KIND: MAX_WINDOW_FACTOR * cfg.matchmaking_timeout_s + cfg.allreduce_timeout_s + 30.0,
        VOTE_KIND: cfg.allreduce_timeout_s + cfg.commit_timeout_s + 30.0,
    }


@dataclass(frozen=True)
class SyncRecordBinding:
    """A sync record lives under its own join / vote / state key until at most ``created + ttl_s``."""

    swarm_id: str
    ttl_s: float
    slack_s: float = SYNC_EXPIRY_SLACK_S

    def check(self, record: Any, key: bytes, expiration: float, now: float) -> RecordRefusal | None:
        created = float(record.created)
        if _from_the_future(created, now):
            return RecordRefusal.FROM_THE_FUTURE
        if expiration > created + self.ttl_s + self.slack_s:
            return RecordRefusal.OUTLIVES_SIGNATURE
        if key not in {dht_key(k) for k in sync_record_keys(self.swarm_id, record)}:
            return RecordRefusal.WRONG_KEY
        return None


@dataclass(frozen=True)
class KindRule:
    """How to open one envelope kind (as :func:`protocol.signing.open_envelope` takes it) and bind it."""

    parse: Parse
    signer: Signer
    max_bytes: int
    binding: Binding


def _descriptor_signer(desc: Descriptor) -> str:
    return desc.publisher


OPENED_CACHE = 4096  # envelopes (~0.5 KB each as a descriptor): a few windows of a 1,000-node swarm's shard reads


class SignedRecordValidator(RecordValidatorBase):  # type: ignore[misc]  # hivemind is not type-checked: Any
    """Accepts only signed envelopes of the registered kinds, bound to their key, subkey and lifetime.

    ``rules`` maps an envelope kind to its :class:`KindRule`; ``clock`` gives
    the time the future check uses (hivemind's DHT time by default).
    ``refused`` counts refusals by reason and ``accepted`` the records let through.
    """

    def __init__(self, rules: Mapping[str, KindRule], clock: Callable[[], float] = get_dht_time) -> None:
        if not rules:
            raise ValueError("SignedRecordValidator needs at least one kind, e.g. rollout_validator()")
        self.rules = dict(rules)
        self.clock = clock
        self.refused: Counter[RecordRefusal] = Counter()
        self.accepted = 0
        self._opened: ContentMemo[Any] = ContentMemo(OPENED_CACHE)  # (kind, envelope) -> its record, or None

    @property
    def max_value_bytes(self) -> int:
        return max(rule.max_bytes for rule in self.rules.values()) + _ENVELOPE_OVERHEAD

    def validate(self, record: DHTRecord) -> bool:
        try:
            reason = self._refusal(record)
        except Exception as e:  # a peer's bytes must never break the DHT's RPC handler: refuse and say so
            logger.warning("DHT record check failed (%s: %s); refused", type(e).__name__, e)
            reason = RecordRefusal.BAD_RECORD
        if reason is None:
            self.accepted += 1
            return True
        self.refused[reason] += 1
        logger.debug("refused DHT record (%d bytes): %s", len(record.value), reason.value)
        return False

    def _refusal(self, record: DHTRecord) -> RecordRefusal | None:
        if len(record.value) > self.max_value_bytes:
            return RecordRefusal.OVERSIZED
        envelope = _our_envelope(record.value, self.rules)
        if envelope is None:
            return RecordRefusal.NOT_OURS
        subkey = _decode_subkey(record.subkey)
        if subkey is None:
            return RecordRefusal.NO_SUBKEY
        data, kind = envelope
        rule = self.rules[kind]
        opened = self._open(data, kind, rule)
        if opened is None:
            return RecordRefusal.BAD_RECORD
        if rule.signer(opened) != subkey:
            return RecordRefusal.WRONG_SUBKEY
        expiration = float(record.expiration_time)
        if not math.isfinite(expiration):
            return RecordRefusal.OUTLIVES_SIGNATURE
        return rule.binding.check(opened, bytes(record.key), expiration, self.clock())

    @property
    def opened_hits(self) -> int:
        """Envelopes whose outcome came from the memo."""
        return self._opened.hits

    def _open(self, data: bytes, kind: str, rule: KindRule) -> Any:
        """The envelope's record, or None if it does not open; remembered by content (see the module doc)."""

        def open_it() -> Any:
            try:
                return open_envelope(data, kind, rule.max_bytes, rule.parse, rule.signer)
            except MessageRejected as e:
                logger.debug("DHT record of kind %s does not open: %s", kind, e.reason)
                return None

        return self._opened.get(kind, data, open_it)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Absorb another instance by taking the union of kinds.

        A strict validator refuses every kind it does not know, so two of them
        applied one after the other would refuse each other's records: they
        must merge. Kinds both know must have equal rules, else nothing merges
        (both then apply, which only ever refuses more). ``other`` is left unchanged.
        """
        if not isinstance(other, SignedRecordValidator):
            return False
        if any(kind in self.rules and self.rules[kind] != rule for kind, rule in other.rules.items()):
            return False
        self.rules.update(other.rules)
        return True


def _our_envelope(value: bytes, rules: Mapping[str, Any]) -> tuple[bytes, str] | None:
    """(envelope bytes, kind) if ``value`` is a serialized envelope of a registered kind."""
    try:
        data = codec.unpack(value, len(value))  # hivemind msgpack-serializes values; size checked by the caller
        if not isinstance(data, bytes):
            return None
        env = codec.unpack(data, len(data))
    except MessageRejected:
        return None
    if not isinstance(env, dict) or set(env) != {"kind", "body", "sig"}:
        return None
    kind = env["kind"]
    if not isinstance(kind, str) or kind not in rules:
        return None
    return data, kind


def _decode_subkey(subkey: bytes) -> str | None:
    """The subkey as text, or None for a regular value / anything that is not a string."""
    try:
        value = codec.unpack(subkey, limits.MAX_ID_CHARS * 4)
    except MessageRejected:
        return None
    return value if isinstance(value, str) else None


def rollout_validator(swarm_id: str | None = None, window_s: float = 30.0) -> SignedRecordValidator:
    """The validator for rollout descriptors of the swarm ``swarm_id`` with windows of ``window_s``.

    Without ``swarm_id`` the window key is not checked (the other rules are);
    nodes use :func:`swarm_record_validator`, which always checks it.
    """
    if not window_s > 0:
        raise ValueError(f"window_s={window_s!r}; use the swarm's ExchangeConfig.window_s (> 0)")
    binding = DescriptorBinding(swarm_id, window_s)
    rule = KindRule(Descriptor.from_wire, _descriptor_signer, limits.MAX_DESCRIPTOR_BYTES, binding)
    return SignedRecordValidator({DESCRIPTOR_KIND: rule})


def sync_validator(swarm_id: str, cfg: OuterSyncConfig) -> SignedRecordValidator:
    """The validator for outer-sync join, vote and state records under ``cfg``'s lifetimes."""
    ttls = sync_record_ttls(cfg)
    rules = {
        kind: KindRule(parse, signer, MAX_RECORD_BYTES, SyncRecordBinding(swarm_id, ttls[kind]))
        for kind, (parse, signer) in KINDS.items()
    }
    return SignedRecordValidator(rules)


def swarm_record_validator(swarm_id: str, window_s: float, sync: OuterSyncConfig) -> SignedRecordValidator:
    """Every record kind a node stores: rollout descriptors and outer-sync records, all bound."""
    rules = {**rollout_validator(swarm_id, window_s).rules, **sync_validator(swarm_id, sync).rules}
    return SignedRecordValidator(rules)


@dataclass(frozen=True)
class RefusalCounts:
    """What the validators in one DHT process let through and refused (by :class:`RecordRefusal` value)."""

    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)


async def _count_in_dht(_dht: Any, node: Any) -> RefusalCounts:
    found = node.protocol.record_validator
    # hivemind wraps the registered validators in a CompositeValidator (its list is private)
    validators = getattr(found, "_validators", [found])
    ours = [v for v in validators if isinstance(v, SignedRecordValidator)]
    refused: Counter[str] = Counter()
    for v in ours:
        refused.update({reason.value: n for reason, n in v.refused.items()})
    return RefusalCounts(sum(v.accepted for v in ours), dict(refused))


def refusal_counts(dht: hivemind.DHT, timeout: float) -> RefusalCounts:
    """The counts of the :class:`SignedRecordValidator` running in ``dht``'s process."""
    future = dht.run_coroutine(_count_in_dht, return_future=True)
    counts: RefusalCounts = future.result(timeout=timeout)
    return counts
