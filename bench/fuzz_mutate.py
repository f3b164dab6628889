"""Mutations for bench/fuzz_protocol.py: byte-level edits and msgpack-aware changes of genuine messages.

Every function draws only from the ``random.Random`` it is given, so a case is
a pure function of the rng's seed and can be replayed. :func:`encode` writes
msgpack by hand where ``msgpack.packb`` cannot say what an attacker can:
duplicate map keys, deep nesting, invalid UTF-8, lying length headers.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol import codec, limits
from protocol.messages import DESCRIPTOR_KIND, ROLLOUT_BATCH_KIND
from protocol.signing import SigningKey
from swarm.sync.records import JOIN_KIND, STATE_KIND, VOTE_KIND

KEY, OTHER = SigningKey(bytes(range(32))), SigningKey(b"m" * 32)
"""The genuine signer of every corpus message, and a stranger."""
KINDS = (DESCRIPTOR_KIND, ROLLOUT_BATCH_KIND, JOIN_KIND, VOTE_KIND, STATE_KIND)
MAX_CASE_BYTES = 9 << 20
"""A mutation that grows past this (> MAX_PAYLOAD_BYTES) is redone as a byte mutation."""


# ---- raw msgpack, so that mutations can say what msgpack.packb cannot ----------------------------


@dataclass(frozen=True)
class Raw:
    """Pre-encoded msgpack spliced in verbatim: deep nesting, invalid UTF-8, lying length headers."""

    data: bytes


@dataclass(frozen=True)
class Pairs:
    """A map written as (key, value) pairs, so duplicate keys reach the decoder (the last one wins)."""

    items: tuple[tuple[Any, Any], ...]


def _header(n: int, fix: int, short: int, long: int, fix_max: int) -> bytes:
    if n <= fix_max:
        return bytes([fix | n])
    return bytes([short]) + n.to_bytes(2, "big") if n < 2**16 else bytes([long]) + n.to_bytes(4, "big")


def encode(obj: Any) -> bytes:
    """msgpack bytes of ``obj``, which may contain :class:`Raw` and :class:`Pairs` nodes."""
    if isinstance(obj, Raw):
        return obj.data
    if isinstance(obj, dict):
        obj = Pairs(tuple(obj.items()))
    if isinstance(obj, Pairs):
        return _header(len(obj.items), 0x80, 0xDE, 0xDF, 15) + b"".join(encode(k) + encode(v) for k, v in obj.items)
    if isinstance(obj, list | tuple):
        return _header(len(obj), 0x90, 0xDC, 0xDD, 15) + b"".join(encode(v) for v in obj)
    return codec.pack(obj)


# ---- mutations ----------------------------------------------------------------------------------

_INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xC0, 0xC1, 0xC2, 0xCA, 0xCB, 0xCF, 0xD3, 0xD9, 0xDB, 0xDD, 0xDF, 0xFF)
_RAW_ODDITIES = (
    b"\xc1",  # reserved type byte
    b"\xa2\xff\xfe",  # invalid UTF-8 in a str
    b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
    b"\xdd\xff\xff\xff\xff",  # array32 claiming 2^32 - 1 entries
    b"\xdf\xff\xff\xff\xff",  # map32 claiming 2^32 - 1 entries
    b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
    b"\xd4\x01\x00",  # ext type
    b"\xd6\xff\x00\x00\x00\x00",  # msgpack timestamp ext
    b"\xca\x7f\xc0\x00\x00",  # float32 NaN
    b"\xcb" + struct.pack(">d", math.inf),
    b"\xcf" + (7).to_bytes(8, "big"),  # non-minimal uint64 encoding of a small int
    b"\xd3" + (-1).to_bytes(8, "big", signed=True),
)
_HOSTILE: tuple[Callable[[random.Random], Any], ...] = (
    lambda r: r.choice((2**64 - 1, 2**63, 2**63 - 1, 2**62, -(2**63), -1, 0)),
    lambda r: r.choice((math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324)),
    lambda r: r.choice((True, False, None)),
    lambda r: r.randbytes(r.choice((0, 1, 32, 64, 65))),
    lambda r: r.choice(("", "\x00", "\u202e", "\n", "é" * 64, " ")),
    lambda r: "x" * r.choice((128, 129, 4096, limits.MAX_TEXT_CHARS, limits.MAX_TEXT_CHARS + 1, 65_536, 70_000)),
    lambda r: [0] * r.choice((64, 65, 4096, 4097)),
    lambda r: ["y" * 64] * r.choice((32, 33, 4096)),
    lambda r: {f"k{i}": i for i in range(r.choice((1, 32, 33, 256, 257)))},
    lambda r: r.choice(({None: 1}, {1.5: "x"}, {b"k": 1}, {True: 1}, {2**64 - 1: 0})),
    lambda r: Raw(b"\x91" * r.choice((10, 100, 1000, 5000)) + b"\xc0"),  # deep nesting
    lambda r: Raw(r.choice(_RAW_ODDITIES)),
)


def hostile(rng: random.Random) -> Any:
    """A value no schema expects: another type, an extreme number, a huge or deep container."""
    return rng.choice(_HOSTILE)(rng)


def _fits(n: int) -> int:
    return n if -(2**63) <= n < 2**64 else 2**64 - 1


def tweak(rng: random.Random, v: Any) -> Any:
    """A near miss of ``v`` of the same type (off by one, flipped, longer, shorter)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return _fits(rng.choice((v + 1, v - 1, -v, v * 2**32, 2**63, 2**64 - 1, -(2**63))))
    if isinstance(v, float):
        return rng.choice((v + 1e-9, -v, math.nan, math.inf, v * 1e300, 0.0, v + 1e6))
    if isinstance(v, str):
        return rng.choice((v + "x", v[:-1], v.upper(), v * 2, v + "\x00", "", v[::-1], v + "\u0301"))
    if isinstance(v, bytes):
        return rng.choice((v[:-1], v + b"\x00", bytes(b ^ 1 for b in v), v * 2))
    return hostile(rng)


def mutate_tree(rng: random.Random, obj: Any) -> Any:
    """A copy of a decoded message with one node replaced, removed, duplicated or given a sibling."""
    if isinstance(obj, dict) and obj and rng.random() < 0.75:
        return _mutate_map(rng, obj)
    if isinstance(obj, list) and obj and rng.random() < 0.75:
        return _mutate_list(rng, obj)
    return tweak(rng, obj) if rng.random() < 0.5 else hostile(rng)


def _mutate_map(rng: random.Random, obj: dict[Any, Any]) -> Any:
    key = rng.choice(list(obj))
    op = rng.random()
    if op < 0.6:
        return {**obj, key: mutate_tree(rng, obj[key])}
    if op < 0.7:
        return {k: v for k, v in obj.items() if k != key}  # a missing field
    if op < 0.8:
        return {**obj, rng.choice((f"{key}_", "extra", 1, None, b"k")): hostile(rng)}  # an unexpected field
    if op < 0.9:
        return Pairs((*obj.items(), (key, mutate_tree(rng, obj[key]))))  # duplicate key: the later value wins
    return Pairs(((key, hostile(rng)), *obj.items()))  # duplicate key hidden before the genuine one


def _mutate_list(rng: random.Random, obj: list[Any]) -> list[Any]:
    i, op, out = rng.randrange(len(obj)), rng.random(), list(obj)
    if op < 0.6:
        out[i] = mutate_tree(rng, obj[i])
    elif op < 0.7:
        del out[i]
    elif op < 0.85:  # many copies of one entry, as many as fit the size cap
        fit = MAX_CASE_BYTES // max(1, len(encode(obj[i])))
        out += [obj[i]] * min(rng.choice((1, 63, 64, 4096)), fit)
    else:
        out.insert(i, hostile(rng))
    return out


def mutate_bytes(rng: random.Random, data: bytes, corpus: Sequence[bytes]) -> bytes:
    """1-3 byte-level edits: bit flip, odd byte, truncation, extension, repetition, cut, insert, splice."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        n, op = len(buf), rng.randrange(8)
        if op == 0 and n:
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[rng.randrange(n)] = rng.choice(_INTERESTING)
        elif op == 2:
            del buf[rng.randrange(n + 1) :]
        elif op == 3:
            buf += rng.randbytes(rng.choice((1, 8, 64, 4096)))
        elif op == 4 and n < MAX_CASE_BYTES // 4:
            buf += bytes(buf) * rng.randrange(1, 4)
        elif op == 5 and n:
            start = rng.randrange(n)
            del buf[start : start + rng.randrange(1, 64)]
        elif op == 6:
            start = rng.randrange(n + 1)
            buf[start:start] = rng.randbytes(rng.randrange(1, 64))
        else:
            other = rng.choice(corpus)
            buf = buf[: rng.randrange(n + 1)] + other[rng.randrange(len(other) + 1) :]
    return bytes(buf)


def _signature(rng: random.Random, kind: Any, body: bytes, old: Any) -> Any:
    """Re-sign by the owner (the signature holds), by a stranger, or keep the old signature."""
    if not isinstance(kind, str):
        return old
    return rng.choice((KEY.sign(kind, body), OTHER.sign(kind, body), old))


def mutate_sealed(rng: random.Random, sealed: bytes) -> bytes:
    """Change a genuine envelope's body, kind or shape; the body's owner may re-sign the result."""
    env = msgpack.unpackb(sealed, raw=False)
    kind, body = env["kind"], env["body"]
    op = rng.random()
    if op < 0.55:
        tree = msgpack.unpackb(body, raw=False, strict_map_key=False)
        body = encode(mutate_tree(rng, tree))
        return encode({**env, "body": body, "sig": _signature(rng, kind, body, env["sig"])})
    if op < 0.7:  # cross-kind replay, possibly signed for the new kind by the record's own signer
        new_kind = rng.choice((*KINDS, "", "x" * 200))
        return encode({**env, "kind": new_kind, "sig": _signature(rng, new_kind, body, env["sig"])})
    return encode(mutate_tree(rng, env))


def mutate_message(rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """One fuzzed message from a corpus of genuine envelopes (5% stay genuine: the accept path is reached)."""
    seed, op = rng.choice(corpus), rng.random()
    if op < 0.5:
        out = mutate_sealed(rng, seed)
    elif op < 0.85:
        out = mutate_bytes(rng, seed, corpus)
    elif op < 0.9:
        out = mutate_bytes(rng, mutate_sealed(rng, seed), corpus)
    elif op < 0.95:
        out = rng.randbytes(rng.choice((0, 1, 9, 64, limits.MAX_DESCRIPTOR_BYTES, 4096)))
    else:
        out = seed
    return out if len(out) <= MAX_CASE_BYTES else mutate_bytes(rng, seed, corpus)


def render_bytes(data: bytes, limit: int = 256) -> str:
    """A reproducer line: size, sha256 prefix and the first ``limit`` bytes as hex."""
    more = "..." if len(data) > limit else ""
    return f"{len(data)} bytes sha256={hashlib.sha256(data).hexdigest()[:16]} hex={data[:limit].hex()}{more}"
