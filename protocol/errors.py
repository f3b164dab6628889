"""The one exception the protocol layer raises."""

from __future__ import annotations


class MessageRejected(ValueError):
    """A message failed a size, schema, version or signature check.

    ``reason`` is a short, stable, human-readable string suitable for logs and
    for counting rejections by cause.

    >>> str(MessageRejected("too large"))
    'too large'
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
