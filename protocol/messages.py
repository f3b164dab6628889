"""Sealing and opening the two rollout-sharing messages: batches and descriptors."""

from __future__ import annotations

import hashlib

from protocol import limits
from protocol.schema import Descriptor, RolloutBatch
from protocol.signing import SigningKey, open_envelope, seal

ROLLOUT_BATCH_KIND = "rollout-batch"
DESCRIPTOR_KIND = "rollout-descriptor"


def payload_digest(payload: bytes) -> str:
    """sha256 hex digest of a sealed payload, as a descriptor names it."""
    return hashlib.sha256(payload).hexdigest()


def seal_batch(batch: RolloutBatch, key: SigningKey) -> bytes:
    """Sign a batch; refuses to seal one whose signer is not its publisher."""
    if batch.publisher != key.peer_id:
        raise ValueError("batch.publisher must be the signing key's peer id")
    data = seal(ROLLOUT_BATCH_KIND, batch, key)
    if len(data) > limits.MAX_PAYLOAD_BYTES:
        raise ValueError(f"batch of {len(data)} bytes exceeds MAX_PAYLOAD_BYTES; share fewer groups")
    return data


def open_batch(data: bytes) -> RolloutBatch:
    """Size-check, decode, validate and verify a sealed batch (MessageRejected if not)."""
    return open_envelope(
        data, ROLLOUT_BATCH_KIND, limits.MAX_PAYLOAD_BYTES, RolloutBatch.from_wire, lambda b: b.publisher
    )


def seal_descriptor(desc: Descriptor, key: SigningKey) -> bytes:
    if desc.publisher != key.peer_id:
        raise ValueError("descriptor.publisher must be the signing key's peer id")
    return seal(DESCRIPTOR_KIND, desc, key)


def open_descriptor(data: bytes) -> Descriptor:
    """Size-check, decode, validate and verify a sealed descriptor (MessageRejected if not)."""
    return open_envelope(
        data, DESCRIPTOR_KIND, limits.MAX_DESCRIPTOR_BYTES, Descriptor.from_wire, lambda d: d.publisher
    )
