"""msgpack codec with hard limits: the size is checked before any decoding."""

from __future__ import annotations

from typing import Any

import msgpack

from protocol import limits
from protocol.errors import MessageRejected


def pack(obj: Any) -> bytes:
    """Encode plain values (maps, lists, str, bytes, int, float, bool, None)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)  # msgpack is not type-checked (follow_imports=skip)
    return packed


def unpack(data: bytes, max_bytes: int) -> Any:
    """Decode ``data``, refusing anything over ``max_bytes`` before looking inside.

    Any malformed input raises :class:`MessageRejected`; nothing else escapes.

    >>> unpack(pack({"a": 1}), max_bytes=64)
    {'a': 1}
    >>> unpack(b"\\xc1", max_bytes=64)
    Traceback (most recent call last):
    ...
    protocol.errors.MessageRejected: malformed msgpack: ...
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageRejected(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise MessageRejected(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(
            bytes(data),
            raw=False,
            strict_map_key=False,
            use_list=True,
            max_str_len=max(limits.MAX_TEXT_CHARS * 4, 1024),
            max_bin_len=max_bytes,
            max_array_len=4096,
            max_map_len=256,
            max_ext_len=0,
        )
    except MessageRejected:
        raise
    except Exception as e:  # msgpack raises many types (ValueError, ExtraData, ...)
        raise MessageRejected(f"malformed msgpack: {type(e).__name__}: {e}") from None
