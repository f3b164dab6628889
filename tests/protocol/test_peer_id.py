from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol import SigningKey, peer_id_from_public_key, public_key_from_peer_id
from protocol.peer_id import b58decode, b58encode


@given(st.binary(max_size=64))
def test_base58_round_trip(data: bytes) -> None:
    assert b58decode(b58encode(data)) == data


def test_peer_id_matches_libp2p_format() -> None:
    key = SigningKey(bytes(32))
    assert key.peer_id.startswith("12D3KooW")
    assert public_key_from_peer_id(key.peer_id) == key.public_key
    assert peer_id_from_public_key(key.public_key) == key.peer_id
