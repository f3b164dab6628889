"""Log lines prefixed with the node's short peer id and round: ``12:00:01 I [a1b2c3 r=12] ...``.

By default a node prints one concise progress line per round (logger
``node.progress``) plus warnings; ``-v`` shows every component's details,
``-vv`` debug output including hivemind's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

PROGRESS = "node.progress"


@dataclass
class LogContext:
    """What the prefix shows; the node updates it as it goes (one node per process)."""

    peer: str = ""
    round: int = 0

    def prefix(self) -> str:
        """``[peer r=N] `` once the peer is known, else empty."""
        return f"[{self.peer} r={self.round}] " if self.peer else ""


CONTEXT = LogContext()


class ContextFilter(logging.Filter):
    """Sets ``record.ctx`` to :data:`CONTEXT`'s prefix, unless the message already carries this peer's tag."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record; only adds the ``ctx`` attribute."""
        prefix = CONTEXT.prefix()
        tagged = bool(prefix) and record.getMessage().startswith(f"[{CONTEXT.peer}")
        record.ctx = "" if tagged else prefix
        return True


def configure_logging(verbose: int) -> None:
    """Level by ``-v`` count: 0 progress + warnings, 1 details (INFO), 2+ debug (hivemind too)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(ctx)s%(message)s", datefmt="%H:%M:%S"))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    logging.getLogger(PROGRESS).setLevel(logging.INFO if verbose >= 0 else logging.WARNING)
    logging.getLogger("hivemind").setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)
