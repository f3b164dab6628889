"""Small signed DHT records of outer sync: join, commit vote, and state.

Each record names its signer (``peer``) and is sealed with
:func:`protocol.signing.seal`, so a reader verifies that the peer it names
signed it, whatever the DHT returns. Readers also check the record against
its *context* (the key it was read from: fingerprint, revision, group id) and
that it sits under its signer's own subkey, so a genuine record cannot be
replayed under another key, another revision or another peer's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from protocol import limits
from protocol.errors import MessageRejected
from protocol.schema import _fields, _ident, _time
from protocol.signing import ED25519, Signatures, SigningKey, open_envelope, seal
from swarm.memo import ContentMemo
from swarm.sync.dialhints import MAX_ADDRS, valid_addr

JOIN_KIND = "sync-join"
VOTE_KIND = "sync-vote"
STATE_KIND = "sync-state"
MAX_RECORD_BYTES = 1024
ABORT_DIGEST = "abort"
MAX_SKIP = 1024
MAX_WINDOW_S = 3600.0
"""Largest window length a join record may carry (members clamp far lower: :func:`swarm.sync.decide.window_length`)."""
"""Most revisions a join record may ask its group's commit to skip. A skip must pass every number a dead
branch may have taken, and a branch can run more than a few revisions past the last one seen; a liar in a group
inflates numbers by at most this per commit, so revisions (< 2^62) last 2^52 such commits."""
_HEX = frozenset("0123456789abcdef")


def _hex(value: str, length: int, what: str) -> None:
    if len(value) != length or not set(value) <= _HEX:
        raise MessageRejected(f"{what}: expected {length} lowercase hex characters")


def valid_origin(value: object) -> bool:
    """Whether ``value`` names a history: "" (none yet: revision 0) or a state hash (64 lowercase hex)."""
    return value == "" or (isinstance(value, str) and len(value) == 64 and set(value) <= _HEX)


def _addrs(value: list[Any] | tuple[Any, ...], what: str) -> tuple[str, ...]:
    if len(value) > MAX_ADDRS or not all(valid_addr(a) for a in value):
        raise MessageRejected(f"{what}.addrs: at most {MAX_ADDRS} transport multiaddrs without a peer id")
    return tuple(value)


def _common(d: dict[str, Any], what: str) -> None:
    if d["version"] != limits.PROTOCOL_VERSION:
        raise MessageRejected(f"{what}: unsupported protocol version {d['version']}")
    _ident(d["peer"], f"{what}.peer")
    _hex(d["fingerprint"], 16, f"{what}.fingerprint")
    if not 0 <= d["revision"] < 2**62:
        raise MessageRejected(f"{what}.revision: must be in [0, 2^62)")
    _time(d["created"], f"{what}.created")


_BASE = {"version": int, "peer": str, "fingerprint": str, "revision": int, "created": float}


@dataclass(frozen=True)
class JoinRecord:
    """ "I want to average at (revision, state_hash) in the gather window opened at window_start".

    ``closed``: "every member I expected has joined this window" (an early
    close, :func:`swarm.sync.decide.should_close`). Records without the field
    (the format before it) are refused like any malformed record.
    """

    peer: str
    fingerprint: str
    revision: int
    state_hash: str
    window_start: float
    created: float
    closed: bool = False
    skip: int = 0
    """Revisions past ``revision + 1`` this peer's next commit must take: others committed them from this
    history but nobody could serve them (a dead branch). At most :data:`MAX_SKIP`; see ``decide_group``."""
    addrs: tuple[str, ...] = ()
    """The signer's transport addresses: the joiners a member pings may be known to it only second-hand
    (swarm.sync.dialhints)."""
    window_s: float = 0.0
    """The window's length as its opener chose it from its measured sync times (joiners copy it); 0 asks for
    the configured gather window. Every member clamps it (:func:`swarm.sync.decide.window_length`)."""
    version: int = limits.PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> JoinRecord:
        spec: dict[str, type | tuple[type, ...]] = {
            "state_hash": str,
            "window_start": float,
            "closed": bool,
            "skip": int,
        }
        spec["addrs"] = (list, tuple)
        d = _fields(obj, JOIN_KIND, {**_BASE, **spec}, {"window_s": float})
        _common(d, JOIN_KIND)
        window_s = d.get("window_s", 0.0)
        if not (math.isfinite(window_s) and 0.0 <= window_s <= MAX_WINDOW_S):
            raise MessageRejected(f"{JOIN_KIND}.window_s: must be a number of seconds in [0, {MAX_WINDOW_S:g}]")
        _hex(d["state_hash"], 64, f"{JOIN_KIND}.state_hash")
        _time(d["window_start"], f"{JOIN_KIND}.window_start")
        if not 0 <= d["skip"] <= MAX_SKIP:
            raise MessageRejected(f"{JOIN_KIND}.skip: must be in [0, {MAX_SKIP}]")
        return cls(**{**d, "addrs": _addrs(d["addrs"], JOIN_KIND)})


@dataclass(frozen=True)
class VoteRecord:
    """A member's commit vote: the digest of what it assembled, or ``"abort"``."""

    peer: str
    fingerprint: str
    revision: int
    group_id: str
    digest: str
    created: float
    version: int = limits.PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> VoteRecord:
        d = _fields(obj, VOTE_KIND, {**_BASE, "group_id": str, "digest": str})
        _common(d, VOTE_KIND)
        _hex(d["group_id"], 32, f"{VOTE_KIND}.group_id")
        if d["digest"] != ABORT_DIGEST:
            _hex(d["digest"], 64, f"{VOTE_KIND}.digest")
        return cls(**d)


@dataclass(frozen=True)
class StateRecord:
    """ "After revision ``revision`` my anchor + outer momentum hash to ``state_hash``, in history ``origin``".

    ``origin`` names the history (:mod:`swarm.sync.merge`); it is hashed into
    ``state_hash``, so a record that names the wrong one names a state no donor
    can serve. Records without the field (the format before it) are refused like
    any malformed record.
    """

    peer: str
    fingerprint: str
    revision: int
    state_hash: str
    created: float
    origin: str = ""
    addrs: tuple[str, ...] = ()
    """The signer's transport addresses, dialled when it cannot be reached otherwise (swarm.sync.dialhints)."""
    version: int = limits.PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> StateRecord:
        d = _fields(obj, STATE_KIND, {**_BASE, "state_hash": str, "origin": str, "addrs": (list, tuple)})
        _common(d, STATE_KIND)
        _hex(d["state_hash"], 64, f"{STATE_KIND}.state_hash")
        if not valid_origin(d["origin"]):
            raise MessageRejected(f'{STATE_KIND}.origin: expected "" or 64 lowercase hex characters')
        return cls(**{**d, "addrs": _addrs(d["addrs"], STATE_KIND)})


Record = JoinRecord | VoteRecord | StateRecord
R = TypeVar("R", JoinRecord, VoteRecord, StateRecord)
_PARSERS: dict[str, Callable[[Any], Any]] = {
    JOIN_KIND: JoinRecord.from_wire,
    VOTE_KIND: VoteRecord.from_wire,
    STATE_KIND: StateRecord.from_wire,
}
KINDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], str]]] = {
    kind: (parse, lambda r: r.peer) for kind, parse in _PARSERS.items()
}
"""``kind -> (parse, signer)``, the shape a signed-record DHT validator takes."""


def seal_record(kind: str, record: Record, key: SigningKey, signatures: Signatures = ED25519) -> bytes:
    """Sign ``record`` as ``kind``; refuses a record that names another signer."""
    if record.peer != key.peer_id:
        raise ValueError("record.peer must be the signing key's peer id")
    return seal(kind, record, key, signatures)


def open_record(data: bytes, kind: str, parse: Callable[[Any], R], signatures: Signatures = ED25519) -> R:
    """Size-check, decode, validate and verify one sealed record (MessageRejected if not)."""
    return open_envelope(data, kind, MAX_RECORD_BYTES, parse, lambda r: r.peer, signatures)


def _open_remembered(
    data: bytes, kind: str, parse: Callable[[Any], R], memo: ContentMemo[Any] | None, signatures: Signatures
) -> R:
    """:func:`open_record`, its outcome (record or refusal) taken from ``memo`` when these bytes were opened."""
    if memo is None:
        return open_record(data, kind, parse, signatures)

    def open_it() -> R | MessageRejected:
        try:
            return open_record(data, kind, parse, signatures)
        except MessageRejected as e:
            return e

    outcome = memo.get(kind, data, open_it)
    if isinstance(outcome, MessageRejected):
        raise outcome
    return outcome  # type: ignore[no-any-return]  # the memo holds what open_it returned for this kind


def open_records(
    raw: Mapping[Any, Any],
    kind: str,
    parse: Callable[[Any], R],
    expect: Callable[[R], str | None],
    now: float,
    memo: ContentMemo[Any] | None = None,
    signatures: Signatures = ED25519,
) -> tuple[dict[str, R], list[str]]:
    """Open every ``subkey -> sealed bytes`` entry; keep the valid ones by signer.

    A record is kept only if its signature verifies, it sits under its
    signer's subkey, it is not from the future (beyond clock skew), and
    ``expect(record)`` (the context check) returns None. Returns the kept
    records and one reason per rejected entry. With a ``memo``, an entry read
    before is not decoded or verified again: a key flooded with valid records
    costs one Ed25519 check per record, not one per record per read. ``signatures`` checks them
    (:data:`protocol.signing.ED25519` but in a simulation: :class:`protocol.signing.Signatures`).
    """
    kept: dict[str, R] = {}
    rejected: list[str] = []
    for subkey, value in raw.items():
        try:
            if not isinstance(value, bytes):
                raise MessageRejected(f"{kind}: value is not bytes")
            record = _open_remembered(value, kind, parse, memo, signatures)
            if subkey != record.peer:
                raise MessageRejected(f"{kind}: stored under another peer's subkey")
            if record.created > now + limits.MAX_CLOCK_SKEW_S:
                raise MessageRejected(f"{kind}: created in the future")
            problem = expect(record)
            if problem is not None:
                raise MessageRejected(f"{kind}: {problem}")
            kept[record.peer] = record
        except MessageRejected as e:
            rejected.append(e.reason)
    return kept, rejected


def join_key(swarm_id: str, fingerprint: str, revision: int, state_hash: str, compression: str = "none") -> str:
    """Where peers at one (architecture, revision, state, wire encoding) meet to form groups."""
    return f"{swarm_id}:sync:{fingerprint}:join:{revision}:{state_hash[:16]}:{compression}"


def vote_key(swarm_id: str, fingerprint: str, group_id: str) -> str:
    """Where the members of one group publish their commit votes."""
    return f"{swarm_id}:sync:{fingerprint}:vote:{group_id}"


def state_key(swarm_id: str, fingerprint: str) -> str:
    """Where every peer of one architecture publishes its (revision, state hash)."""
    return f"{swarm_id}:sync:{fingerprint}:state"
