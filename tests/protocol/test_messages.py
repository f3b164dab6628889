"""Round trips, strict schemas, signatures, and fuzzing of the decoder."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    Descriptor,
    MessageRejected,
    RolloutBatch,
    RolloutGroup,
    SigningKey,
    TaskRef,
    codec,
    limits,
    open_batch,
    open_descriptor,
    payload_digest,
    seal_batch,
    seal_descriptor,
)
from protocol.signing import seal

KEY = SigningKey(bytes(range(32)))
OTHER = SigningKey(bytes(range(1, 33)))


def make_batch(key: SigningKey = KEY, n_groups: int = 2) -> RolloutBatch:
    groups = tuple(
        RolloutGroup(
            task=TaskRef.make("max", {"digits": 4}, seed=7, index=i),
            prompt=f"max 39{i}1=",
            completions=("9", "3", "x"),
            rewards=(1.0, 0.0, 0.0),
            model_id="tiny-s",
        )
        for i in range(n_groups)
    )
    return RolloutBatch(publisher=key.peer_id, round=3, created=1_700_000_000.0, groups=groups)


def make_descriptor(key: SigningKey = KEY, payload: bytes = b"x") -> Descriptor:
    now = 1_700_000_000.0
    return Descriptor(key.peer_id, 3, payload_digest(payload), len(payload), ("max",), now, now + 60)


def test_batch_round_trip() -> None:
    batch = make_batch()
    assert open_batch(seal_batch(batch, KEY)) == batch


def test_claimed_logprobs_are_optional_and_round_trip() -> None:
    batch = make_batch()
    assert "logprobs" not in batch.to_wire()["groups"][0]  # a group without a claim sends no field
    with_claims = RolloutBatch(
        batch.publisher, batch.round, batch.created, tuple(replace(g, logprobs=(-0.5, -3.0, 0.0)) for g in batch.groups)
    )
    opened = open_batch(seal_batch(with_claims, KEY))
    assert opened == with_claims and opened.groups[0].logprobs == (-0.5, -3.0, 0.0)


def test_descriptor_round_trip_and_small() -> None:
    desc = make_descriptor()
    data = seal_descriptor(desc, KEY)
    assert open_descriptor(data) == desc
    assert len(data) < limits.MAX_DESCRIPTOR_BYTES


def test_refuses_to_seal_for_someone_else() -> None:
    with pytest.raises(ValueError):
        seal_batch(make_batch(OTHER), KEY)


def test_forged_signer_rejected() -> None:
    # OTHER signs a batch that claims KEY as publisher: signature must not verify.
    forged = seal("rollout-batch", make_batch(KEY), OTHER)
    with pytest.raises(MessageRejected, match="bad signature"):
        open_batch(forged)


def test_kind_confusion_rejected() -> None:
    # A valid descriptor envelope must not open as a batch, and vice versa.
    with pytest.raises(MessageRejected):
        open_batch(seal_descriptor(make_descriptor(), KEY))


def test_size_cap_checked_before_decoding() -> None:
    with pytest.raises(MessageRejected, match="exceeds the limit"):
        open_descriptor(b"\x00" * (limits.MAX_DESCRIPTOR_BYTES + 1))


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda w: w.update(version=2), "unsupported protocol version"),
        (lambda w: w.update(extra=1), "unexpected fields"),
        (lambda w: w.pop("round"), "missing fields"),
        (lambda w: w.update(round="3"), "wrong type"),
        (lambda w: w.update(round=True), "wrong type"),
        (lambda w: w["groups"][0].update(rewards=[1.0]), "one reward per completion"),
        (lambda w: w["groups"][0].update(rewards=[float("nan")] * 3), "finite"),
        (lambda w: w["groups"][0]["task"].update(index=8), None),
        (lambda w: w["groups"][0]["task"]["config"].update(digits=9), "config digest"),
        (lambda w: w["groups"][0].update(prompt="x" * (limits.MAX_TEXT_CHARS + 1)), "exceeds the limit"),
        (lambda w: w["groups"][0].update(completions=["a"] * (limits.MAX_COMPLETIONS + 1)), "exceeds"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0]), "one log-probability per completion"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0, 0.5, -2.0]), r"must be in \[-1e\+06, 0\]"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0, -2e6, -2.0]), r"must be in \[-1e\+06, 0\]"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0, float("-inf"), -2.0]), "finite"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0, True, -2.0]), "finite"),
        (lambda w: w["groups"][0].update(logprobs="-1"), "wrong type"),
        (lambda w: w["groups"][0].update(logprobs=[-1.0] * (limits.MAX_COMPLETIONS + 1)), "exceeds"),
    ],
)
def test_schema_is_strict(mutate, reason) -> None:  # type: ignore[no-untyped-def]
    wire = make_batch().to_wire()
    mutate(wire)
    if reason is None:  # a valid change: re-signed by the publisher it still opens
        assert open_batch(codec_seal(wire)).groups[0].task.index == 8
        return
    with pytest.raises(MessageRejected, match=reason):
        RolloutBatch.from_wire(wire)
    with pytest.raises(MessageRejected, match=reason):
        open_batch(codec_seal(wire))


def codec_seal(wire: dict) -> bytes:  # type: ignore[type-arg]
    body = codec.pack(wire)
    return codec.pack({"kind": "rollout-batch", "body": body, "sig": KEY.sign("rollout-batch", body)})


def test_descriptor_expiry_rules() -> None:
    now = time.time()
    bad = Descriptor(KEY.peer_id, 1, "a" * 64, 10, (), now, now + limits.MAX_DESCRIPTOR_TTL_S + 5)
    with pytest.raises(MessageRejected, match="TTL"):
        open_descriptor(seal_descriptor(bad, KEY))


def test_non_ed25519_peer_id_rejected() -> None:
    wire = make_descriptor().to_wire()
    wire["publisher"] = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # an RSA-style id
    with pytest.raises(MessageRejected):
        open_descriptor(codec.pack({"kind": "rollout-descriptor", "body": codec.pack(wire), "sig": b"s" * 64}))


SEALED_BATCH = seal_batch(make_batch(), KEY)
SEALED_DESC = seal_descriptor(make_descriptor(), KEY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_mutation_of_a_signed_message_is_rejected(data: st.DataObject) -> None:
    sealed, opener = data.draw(st.sampled_from([(SEALED_BATCH, open_batch), (SEALED_DESC, open_descriptor)]))
    buf = bytearray(sealed)
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    pos = data.draw(st.integers(0, len(buf) - 1))
    if kind == "flip":
        buf[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        del buf[pos:]
    else:
        buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    if bytes(buf) == sealed:
        return
    try:
        opened = opener(bytes(buf))
    except MessageRejected:
        return
    # msgpack has a few non-canonical encodings of the same envelope (e.g. an int in a
    # wider format); those decode to the *identical* signed content, which is fine.
    assert opened == opener(sealed)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    for opener in (open_batch, open_descriptor):
        with pytest.raises(MessageRejected):
            opener(data)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_random_structures_only_raise_message_rejected(obj: object) -> None:
    for parse in (RolloutBatch.from_wire, Descriptor.from_wire, RolloutGroup.from_wire, TaskRef.from_wire):
        with pytest.raises(MessageRejected):
            parse(obj)
    env = codec.pack({"kind": "rollout-batch", "body": codec.pack(obj), "sig": b"\0" * 64})
    with pytest.raises(MessageRejected):
        open_batch(env)
