"""Wire protocol of swarm-node: pure data, no I/O, no torch, no hivemind."""

from __future__ import annotations

from protocol.errors import MessageRejected
from protocol.limits import PROTOCOL_VERSION
from protocol.messages import (
    DESCRIPTOR_KIND,
    ROLLOUT_BATCH_KIND,
    open_batch,
    open_descriptor,
    payload_digest,
    seal_batch,
    seal_descriptor,
)
from protocol.peer_id import peer_id_from_public_key, public_key_from_peer_id, short_id
from protocol.schema import Descriptor, RolloutBatch, RolloutGroup, TaskRef, config_digest
from protocol.signing import SigningKey

__all__ = [
    "DESCRIPTOR_KIND",
    "PROTOCOL_VERSION",
    "ROLLOUT_BATCH_KIND",
    "Descriptor",
    "MessageRejected",
    "RolloutBatch",
    "RolloutGroup",
    "SigningKey",
    "TaskRef",
    "config_digest",
    "open_batch",
    "open_descriptor",
    "payload_digest",
    "peer_id_from_public_key",
    "public_key_from_peer_id",
    "seal_batch",
    "seal_descriptor",
    "short_id",
]
