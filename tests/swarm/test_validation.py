"""SignedRecordValidator on constructed DHT records (no network)."""

from __future__ import annotations

import time

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from protocol import Descriptor, SigningKey, seal_descriptor
from protocol.messages import DESCRIPTOR_KIND, ROLLOUT_BATCH_KIND
from protocol.signing import seal
from swarm.validation import SignedRecordValidator, rollout_validator

ALICE, MALLORY = SigningKey(b"a" * 32), SigningKey(b"m" * 32)


def _desc(publisher: str, created: float | None = None) -> Descriptor:
    t = time.time() if created is None else created
    return Descriptor(publisher, 3, "ab" * 32, 1000, ("arith",), t, t + 300)


def _record(value: object, subkey: object) -> DHTRecord:
    return DHTRecord(
        key=b"\x01" * 20,
        subkey=MSGPackSerializer.dumps(subkey),
        value=MSGPackSerializer.dumps(value),
        expiration_time=time.time() + 300,
    )


def test_accepts_own_descriptor_under_own_subkey() -> None:
    sealed = seal_descriptor(_desc(ALICE.peer_id), ALICE)
    assert rollout_validator().validate(_record(sealed, ALICE.peer_id))


def test_rejects_descriptor_under_another_peers_subkey() -> None:
    sealed = seal_descriptor(_desc(MALLORY.peer_id), MALLORY)
    assert not rollout_validator().validate(_record(sealed, ALICE.peer_id))


def test_rejects_descriptor_signed_by_someone_else() -> None:
    forged = seal(DESCRIPTOR_KIND, _desc(ALICE.peer_id), MALLORY)  # claims Alice, signed by Mallory
    assert not rollout_validator().validate(_record(forged, ALICE.peer_id))


def test_rejects_descriptor_without_subkey_and_tampered_bytes() -> None:
    sealed = seal_descriptor(_desc(ALICE.peer_id), ALICE)
    regular = DHTRecord(b"\x01" * 20, DHTProtocol.IS_REGULAR_VALUE, MSGPackSerializer.dumps(sealed), 0.0)
    assert not rollout_validator().validate(regular)
    tampered = sealed.replace(b"arith", b"arixh")
    assert not rollout_validator().validate(_record(tampered, ALICE.peer_id))


def test_rejects_invalid_schema_even_when_signed() -> None:
    bad = Descriptor(ALICE.peer_id, 3, "ab" * 32, 1000, ("arith",), 10.0, 10.0 + 99999)  # TTL too long
    assert not rollout_validator().validate(_record(seal(DESCRIPTOR_KIND, bad, ALICE), ALICE.peer_id))


def test_leaves_foreign_records_to_other_validators() -> None:
    v = rollout_validator()
    assert v.validate(_record({"some": "other value"}, "x"))
    assert v.validate(_record(b"\xc1 not msgpack", ALICE.peer_id))
    assert v.validate(_record(12345, None))
    # an envelope of a kind that is not registered is not ours either
    other_kind = seal(ROLLOUT_BATCH_KIND, _desc(ALICE.peer_id), ALICE)
    assert v.validate(_record(other_kind, MALLORY.peer_id))


def test_merge_unions_kinds() -> None:
    a = SignedRecordValidator({DESCRIPTOR_KIND: (Descriptor.from_wire, lambda d: d.publisher)})
    b = SignedRecordValidator({"other": (Descriptor.from_wire, lambda d: d.publisher)})
    assert a.merge_with(b) and set(a.kinds) == {DESCRIPTOR_KIND, "other"}
