"""Ed25519 signatures bound to libp2p peer ids.

A signed message is an *envelope* ``{"kind", "body", "sig"}``. ``body`` is the
packed record; ``sig`` signs ``kind`` and ``body`` together (domain separation:
a signature made for one kind of record cannot be replayed as another). The
signer is named *inside* the record (its ``publisher`` / ``peer`` field), and
the verifying key is recovered from that peer id, so a record can only be
signed by the peer it names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from protocol import codec, limits
from protocol.errors import MessageRejected
from protocol.peer_id import peer_id_from_public_key, public_key_from_peer_id

_DOMAIN = b"swarm-node/v1/"


class WireRecord(Protocol):
    def to_wire(self) -> dict[str, Any]: ...


class Signatures(Protocol):
    """How an envelope's 64-byte signature is made and checked: :data:`ED25519` on every real network.

    A seam, not a choice for nodes: a simulation of many members in one process passes a keyed hash
    (the signatures are the same rule at a fraction of the cost), since what it tests is the sync's
    rules, and Ed25519's own tests stand apart (tests/protocol).
    """

    def sign(self, key: SigningKey, kind: str, body: bytes) -> bytes:
        """``key``'s 64-byte signature of (kind, body)."""
        ...

    def verify(self, peer_id: str, kind: str, body: bytes, sig: bytes) -> None:
        """Raise MessageRejected unless ``sig`` is ``peer_id``'s signature of (kind, body)."""
        ...


R = TypeVar("R")


class SigningKey:
    """An Ed25519 private key with its libp2p peer id."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.seed = seed
        self.public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.peer_id = peer_id_from_public_key(self.public_key)

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key."""
        from os import urandom

        return cls(urandom(32))

    def sign(self, kind: str, body: bytes) -> bytes:
        return self._key.sign(_signed_bytes(kind, body))


def _signed_bytes(kind: str, body: bytes) -> bytes:
    return _DOMAIN + kind.encode() + b"\0" + hashlib.sha256(body).digest()


def verify(peer_id: str, kind: str, body: bytes, sig: bytes) -> None:
    """Raise MessageRejected unless ``sig`` is ``peer_id``'s signature of (kind, body)."""
    public = Ed25519PublicKey.from_public_bytes(public_key_from_peer_id(peer_id))
    try:
        public.verify(sig, _signed_bytes(kind, body))
    except InvalidSignature:
        raise MessageRejected(f"{kind}: bad signature for claimed signer {peer_id[-6:]}") from None


class _Ed25519:
    """Signatures by the key itself (:meth:`SigningKey.sign`, :func:`verify`)."""

    def sign(self, key: SigningKey, kind: str, body: bytes) -> bytes:
        return key.sign(kind, body)

    def verify(self, peer_id: str, kind: str, body: bytes, sig: bytes) -> None:
        verify(peer_id, kind, body, sig)


ED25519: Signatures = _Ed25519()
"""The signatures of the wire protocol."""


def seal(kind: str, record: WireRecord, key: SigningKey, signatures: Signatures = ED25519) -> bytes:
    """Encode and sign ``record`` as an envelope of ``kind``."""
    body = codec.pack(record.to_wire())
    return codec.pack({"kind": kind, "body": body, "sig": signatures.sign(key, kind, body)})


def open_envelope(
    data: bytes,
    kind: str,
    max_bytes: int,
    parse: Callable[[Any], R],
    signer: Callable[[R], str],
    signatures: Signatures = ED25519,
) -> R:
    """Check size, envelope shape, kind, schema and signature; return the record.

    ``parse`` is the record's strict ``from_wire``; ``signer`` names the peer
    that must have signed it (e.g. ``lambda d: d.publisher``).
    """
    env = codec.unpack(data, max_bytes)
    if not isinstance(env, dict) or set(env) != {"kind", "body", "sig"}:
        raise MessageRejected(f"{kind}: not a signed envelope")
    if env["kind"] != kind:
        # never repr() a peer's value: a list nested 1,000 deep makes repr raise RecursionError
        other = env["kind"][: limits.MAX_ID_CHARS] if isinstance(env["kind"], str) else type(env["kind"]).__name__
        raise MessageRejected(f"{kind}: envelope is of kind {other!r}")
    body, sig = env["body"], env["sig"]
    if not isinstance(body, bytes) or not isinstance(sig, bytes) or len(sig) != 64:
        raise MessageRejected(f"{kind}: malformed envelope fields")
    record = parse(codec.unpack(body, max_bytes))
    signatures.verify(signer(record), kind, body, sig)
    return record
