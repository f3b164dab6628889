"""libp2p peer ids for Ed25519 keys, computed without libp2p.

An Ed25519 libp2p peer id is the *identity* multihash of the protobuf-encoded
public key, so the public key can be recovered from the id itself. That lets a
receiver bind a signature to a peer id with no key registry: the id *is* the
key.
"""

from __future__ import annotations

from protocol.errors import MessageRejected

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}

# protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}
_PB_ED25519_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])
# multihash: identity function (0x00), digest length 36
_MH_IDENTITY_PREFIX = bytes([0x00, len(_PB_ED25519_PREFIX) + 32])


def b58encode(data: bytes) -> str:
    """Base58 (bitcoin alphabet), as libp2p uses for peer ids.

    >>> b58encode(b"\\x00\\x01")
    '12'
    """
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_B58_ALPHABET[rem])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Inverse of :func:`b58encode`; raises MessageRejected on bad characters."""
    n = 0
    for c in text:
        if c not in _B58_INDEX:
            raise MessageRejected(f"invalid base58 character {c!r}")
        n = n * 58 + _B58_INDEX[c]
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    pad = len(text) - len(text.lstrip("1"))
    return b"\0" * pad + body


def peer_id_from_public_key(public_key: bytes) -> str:
    """The base58 libp2p peer id ("12D3KooW...") of a raw 32-byte Ed25519 key."""
    if len(public_key) != 32:
        raise MessageRejected(f"Ed25519 public key must be 32 bytes, got {len(public_key)}")
    return b58encode(_MH_IDENTITY_PREFIX + _PB_ED25519_PREFIX + public_key)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """Recover the raw Ed25519 public key embedded in a peer id.

    Raises MessageRejected if the id is not an Ed25519 identity-multihash id
    (RSA or hashed ids cannot carry their key and are not accepted).
    """
    if not isinstance(peer_id, str) or not 40 <= len(peer_id) <= 64:
        raise MessageRejected("peer id is not an Ed25519 libp2p id")
    raw = b58decode(peer_id)
    prefix = _MH_IDENTITY_PREFIX + _PB_ED25519_PREFIX
    if len(raw) != len(prefix) + 32 or not raw.startswith(prefix):
        raise MessageRejected("peer id is not an Ed25519 libp2p id")
    return raw[len(prefix) :]


def short_id(peer_id: str) -> str:
    """A short, log-friendly form of a peer id: its last 6 characters.

    >>> short_id("12D3KooWAbCdEfGhIjK")
    'fGhIjK'
    """
    return peer_id[-6:]
