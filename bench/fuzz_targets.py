"""Fuzz targets for messages and DHT entries, and :func:`all_targets`, the list bench/fuzz_protocol.py runs.

Messages: ``codec.unpack``, ``open_descriptor``, ``open_batch`` and the sync
records' ``open_record``, on mutated sealed bytes. DHT entries: the node's
record validator, the sync-record reader ``open_records`` and
``select_descriptors``, on hostile keys, subkeys, expirations and values.
"""

from __future__ import annotations

import logging
import math
import random
import reprlib
from collections.abc import Callable, Sequence
from typing import Any

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from bench.fuzz_corpus import (
    FP,
    NOW,
    SYNC_PARSERS,
    Corpus,
    Target,
    UnexpectedResult,
    build_corpus,
    node_validator,
    record_keys,
    select,
)
from bench.fuzz_mutate import KEY, OTHER, encode, hostile, mutate_bytes, mutate_message, render_bytes
from bench.fuzz_payloads import stream_targets, verify_targets
from protocol import codec
from protocol.errors import MessageRejected
from protocol.messages import open_batch, open_descriptor
from swarm.sync.records import open_record, open_records
from swarm.validation import SignedRecordValidator

_PLAIN = (None, 1, -1, 1.5, "x", b"x", [b"x"], {"a": b"x"}, True)  # what a hivemind DHT value can decode to


# ---- message targets ------------------------------------------------------------------------------


def _accept(_: object) -> bool:
    return True


def message_targets(corpus: Corpus) -> list[Target[Any]]:
    """codec.unpack, open_descriptor, open_batch and the sync records, on mutated sealed bytes."""

    def own_or_any(own: Sequence[bytes]) -> Callable[[random.Random], bytes]:
        return lambda rng: mutate_message(rng, own if rng.random() < 0.85 else corpus.sealed)

    def make_record(rng: random.Random) -> tuple[str, bytes]:
        return rng.choice(list(SYNC_PARSERS)), own_or_any(corpus.records)(rng)

    def open_sync(case: tuple[str, bytes]) -> bool:
        return _accept(open_record(case[1], case[0], SYNC_PARSERS[case[0]]))

    return [
        Target("protocol.codec.unpack", own_or_any(corpus.sealed), lambda d: _accept(codec.unpack(d, 8 << 20))),
        Target("protocol.open_descriptor", own_or_any(corpus.descriptors), lambda d: _accept(open_descriptor(d))),
        Target("protocol.open_batch", own_or_any(corpus.batches), lambda d: _accept(open_batch(d))),
        Target("sync.open_record", make_record, open_sync, lambda c: f"kind={c[0]} {render_bytes(c[1])}"),
    ]


# ---- DHT-facing targets: hostile keys, subkeys, expirations and values ----------------------------


def _subkey(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.6:
        return KEY.peer_id
    if pick < 0.75:
        return OTHER.peer_id
    return rng.choice((*_PLAIN[:6], KEY.peer_id + "x", KEY.peer_id[:-1], ""))


def _entry_subkey(rng: random.Random, deepest: int) -> Any:
    """A subkey as a DHT answer hands it over, decoded: any value, nested tuples included.

    A tuple about 950 deep still hashes as a dict key but no longer has a repr;
    ``deepest`` stays below the hash limit where the target needs a dict.
    """
    return _deep(rng.choice((10, deepest))) if rng.random() < 0.03 else _subkey(rng)


def _deep(depth: int) -> tuple[Any, ...]:
    """A nested tuple: hashable like a subkey, and as deep as msgpack lets a peer nest one."""
    value: tuple[Any, ...] = ()
    for _ in range(depth):
        value = (value,)
    return value


def _entry_value(rng: random.Random, own: Sequence[bytes], corpus: Corpus) -> Any:
    pick = rng.random()
    if pick < 0.75:
        return mutate_message(rng, own if rng.random() < 0.85 else corpus.sealed)
    return rng.choice(own) if pick < 0.9 else rng.choice(_PLAIN)


class _WarningTrap(logging.Handler):
    """Keeps the WARNINGs a target logs: the validator refuses quietly, so a warning is its safety net firing."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage()[:200])


def _dht_record_maker(corpus: Corpus) -> Callable[[random.Random], DHTRecord]:
    """DHT records built around one genuine record: its value, key, subkey or expiration changed."""
    genuine: list[tuple[bytes, tuple[bytes, ...], float]] = []
    for data in corpus.descriptors:
        desc = open_descriptor(data)
        genuine.append((data, record_keys(desc), desc.expires))
    for data in corpus.records:
        for kind in SYNC_PARSERS:
            if _opens(data, kind):
                record = open_record(data, kind, SYNC_PARSERS[kind])
                genuine.append((data, record_keys(record), record.created + 10.0))
    all_keys = [k for _, keys, _ in genuine for k in keys]

    def make(rng: random.Random) -> DHTRecord:
        sealed, keys, expires = rng.choice(genuine)
        pick = rng.random()
        value = sealed if pick < 0.3 else mutate_message(rng, (sealed,)) if pick < 0.85 else None
        raw = MSGPackSerializer.dumps(value) if value is not None else encode(hostile(rng))
        raw = mutate_bytes(rng, raw, corpus.sealed) if rng.random() < 0.1 else raw
        pick = rng.random()
        subkey = DHTProtocol.IS_REGULAR_VALUE if pick < 0.1 else MSGPackSerializer.dumps(_subkey(rng))
        subkey = mutate_bytes(rng, subkey, [subkey]) if pick > 0.9 else subkey
        pick = rng.random()
        key = rng.choice(keys) if pick < 0.75 else rng.choice(all_keys) if pick < 0.9 else rng.randbytes(20)
        odd_expiration = rng.choice((expires + 1.0, NOW + 10**6, math.nan, math.inf, -1.0, 0.0))
        return DHTRecord(key, subkey, raw, expires if rng.random() < 0.6 else odd_expiration)

    return make


def _opens(data: bytes, kind: str) -> bool:
    try:
        open_record(data, kind, SYNC_PARSERS[kind])
    except MessageRejected:
        return False
    return True


def validator_target(corpus: Corpus) -> Target[DHTRecord]:
    """The node's DHT record validator: returns a bool, never raises, never needs its catch-all."""
    validator, trap, log = node_validator(), _WarningTrap(), logging.getLogger(SignedRecordValidator.__module__)

    def validate(record: DHTRecord) -> bool:
        trap.seen.clear()
        log.addHandler(trap)
        try:
            verdict = validator.validate(record)
        finally:
            log.removeHandler(trap)
        if not isinstance(verdict, bool):
            raise UnexpectedResult(f"validate returned {type(verdict).__name__}, not a bool")
        if trap.seen:
            raise UnexpectedResult(f"validate fell back to its catch-all: {trap.seen[0]}")
        return verdict

    return Target("swarm.validator.validate", _dht_record_maker(corpus), validate, _render_record, handled=())


def entry_targets(corpus: Corpus) -> list[Target[Any]]:
    """The sync-record reader and descriptor selection, on DHT answers with hostile subkeys and values."""

    def make_entries(rng: random.Random, own: Sequence[bytes], deepest: int) -> list[tuple[Any, Any]]:
        return [(_entry_subkey(rng, deepest), _entry_value(rng, own, corpus)) for _ in range(rng.randint(1, 6))]

    def read_records(entries: list[tuple[Any, Any]]) -> bool:
        raw, accepted = dict(entries), False
        for kind, parse in SYNC_PARSERS.items():  # every reader sees the same entries
            kept, rejected = open_records(raw, kind, parse, _same_fingerprint, NOW)
            if len(kept) + len(rejected) != len(raw):
                raise UnexpectedResult(f"{kind}: {len(raw)} entries, {len(kept)} kept + {len(rejected)} rejected")
            accepted = accepted or bool(kept)
        return accepted

    def select_some(case: tuple[int, list[tuple[Any, Any]]]) -> bool:
        limit, entries = case
        chosen, rejected = select(entries, limit)
        if len(chosen) > max(limit, 0) or len(chosen) + len(rejected) > len(entries):
            raise UnexpectedResult(f"{len(entries)} entries, limit {limit}: chose {len(chosen)}")
        return bool(chosen)

    return [
        Target("sync.open_records", lambda r: make_entries(r, corpus.records, 200), read_records, _render_entries, ()),
        Target(
            "exchange.select_descriptors",
            lambda r: (r.randrange(-1, 6), make_entries(r, corpus.descriptors, 1000)),
            select_some,
            lambda c: f"limit={c[0]} {_render_entries(c[1])}",
            handled=(),
        ),
    ]


def _same_fingerprint(record: Any) -> str | None:
    """The context check dhtio passes for state records."""
    return None if record.fingerprint == FP else "other fingerprint"


def _render_record(record: DHTRecord) -> str:
    return (
        f"key={record.key.hex()} subkey={record.subkey[:80].hex()} expiration={record.expiration_time!r} "
        f"value: {render_bytes(record.value)}"
    )


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()  # Python 3.11: no keyword arguments yet
    short.maxlevel, short.maxstring, short.maxother = 3, 70, 70
    return short


_SHORT = _short_repr()


def _render_entries(entries: list[tuple[Any, Any]]) -> str:
    """Entries for a reproducer; reprlib bounds depth and length (a plain repr of a deep subkey recurses)."""
    return "; ".join(
        f"{_SHORT.repr(k)}: {render_bytes(v, 128) if isinstance(v, bytes) else _SHORT.repr(v)}" for k, v in entries
    )


def all_targets() -> list[Target[Any]]:
    """Every target, built on one deterministic corpus."""
    corpus = build_corpus()
    return [
        *message_targets(corpus),
        validator_target(corpus),
        *entry_targets(corpus),
        *stream_targets(corpus),
        *verify_targets(corpus),
    ]
