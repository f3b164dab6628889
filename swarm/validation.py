"""A DHT record validator for our signed envelopes, bound to the record's subkey.

hivemind calls ``validate`` in the DHT process whenever a peer asks it to store
a record and whenever a peer's answer to a lookup is received. A record whose
value is one of *our* envelopes (of a registered kind) must open cleanly
(schema and Ed25519 signature) and must be stored under the subkey of the peer
that signed it, so no peer can overwrite or forge another peer's entry. Values
that are not our envelopes are left to other validators (return True); readers
re-verify everything they take from the DHT anyway.

Every node of a swarm must run the same validators (docs/ARCHITECTURE.md, "Validators").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from protocol import codec, limits
from protocol.errors import MessageRejected
from protocol.messages import DESCRIPTOR_KIND
from protocol.schema import Descriptor
from protocol.signing import open_envelope

logger = logging.getLogger(__name__)

Parse = Callable[[Any], Any]
Signer = Callable[[Any], str]

_MAX_DHT_VALUE_BYTES = 4 * 1024 * 1024  # hivemind's message cap (docs/ARCHITECTURE.md, "Message cap")


def _descriptor_signer(desc: Descriptor) -> str:
    return desc.publisher


class SignedRecordValidator(RecordValidatorBase):  # type: ignore[misc]  # hivemind is not type-checked: Any
    """Validates DHT records whose value is a signed envelope of a registered kind.

    ``kinds`` maps an envelope kind to ``(parse, signer)`` as
    :func:`protocol.signing.open_envelope` takes them; ``max_bytes`` caps the
    envelope size of every registered kind.
    """

    def __init__(self, kinds: Mapping[str, tuple[Parse, Signer]], max_bytes: int = limits.MAX_DESCRIPTOR_BYTES) -> None:
        if not kinds:
            raise ValueError("SignedRecordValidator needs at least one kind, e.g. rollout_validator()")
        self.kinds = dict(kinds)
        self.max_bytes = max_bytes

    def validate(self, record: DHTRecord) -> bool:
        envelope = _our_envelope(record.value, self.kinds)
        if envelope is None:
            return True  # not ours: other validators decide
        data, kind = envelope
        parse, signer = self.kinds[kind]
        try:
            signed_by = signer(open_envelope(data, kind, self.max_bytes, parse, signer))
        except MessageRejected as e:
            logger.debug("rejected DHT record of kind %s: %s", kind, e.reason)
            return False
        subkey = _decode_subkey(record.subkey)
        if subkey != signed_by:
            logger.debug(
                "rejected DHT record of kind %s: stored under subkey %r, signed by %s",
                kind,
                subkey,
                signed_by[-6:],
            )
            return False
        return True

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Merge another instance by taking the union of kinds (a record must pass both)."""
        if not isinstance(other, SignedRecordValidator) or other.max_bytes != self.max_bytes:
            return False
        for kind, spec in other.kinds.items():
            if kind in self.kinds and self.kinds[kind] != spec:
                return False
        self.kinds.update(other.kinds)
        return True


def _our_envelope(value: bytes, kinds: Mapping[str, Any]) -> tuple[bytes, str] | None:
    """(envelope bytes, kind) if ``value`` is a serialized envelope of a registered kind."""
    try:
        data = codec.unpack(value, _MAX_DHT_VALUE_BYTES)  # hivemind msgpack-serializes values
        if not isinstance(data, bytes):
            return None
        env = codec.unpack(data, _MAX_DHT_VALUE_BYTES)
    except MessageRejected:
        return None
    if not isinstance(env, dict) or set(env) != {"kind", "body", "sig"}:
        return None
    kind = env["kind"]
    if not isinstance(kind, str) or kind not in kinds:
        return None
    return data, kind


def _decode_subkey(subkey: bytes) -> str | None:
    """The subkey as text, or None for a regular value / anything that is not a string."""
    try:
        value = codec.unpack(subkey, limits.MAX_ID_CHARS * 4)
    except MessageRejected:
        return None
    return value if isinstance(value, str) else None


def rollout_validator() -> SignedRecordValidator:
    """The validator for rollout descriptors (every node must register it)."""
    return SignedRecordValidator({DESCRIPTOR_KIND: (Descriptor.from_wire, _descriptor_signer)})
