"""Log lines prefixed with the node's short peer id and round: ``12:00:01 I [a1b2c3 r=12] ...``.

By default a node prints a concise progress line every few seconds (logger
``node.progress``, see :mod:`node.observe.progress`) plus warnings; ``-v``
adds a line per round and every component's details, ``-vv`` debug output
including hivemind's. Lines that say nothing a user can act on are filtered
where they arise (:func:`quiet_libraries`), not by raising every level.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

PROGRESS = "node.progress"
ROUNDS = "node.rounds"
"""The per-round line: shown from ``-v`` on (the default shows the progress summary instead)."""
P2PD_LOGGER = "hivemind.p2p.p2p_daemon"
P2PD_LEAVING = "use of closed network connection"
"""What p2pd logs at ERROR when its own listener closes, which happens only when p2pd itself is stopping
(a Ctrl-C reaches it with the whole process group, or its DHT process terminates it): part of every exit."""
TRANSFORMERS_CACHE_RENAME = "`past_key_values`"
"""transformers 5 renamed the generation cache argument to ``cache``; the policy passes ``past_key_values``,
which every supported version (from 4.45) accepts, so the rename's deprecation notices are not a user's
concern. Only these two notices are filtered (a FutureWarning at the first forward and one log line)."""


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


class DropMessage(logging.Filter):
    """Drops the records whose message contains ``text`` (one known line, not a whole logger)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record carrying ``text``."""
        return self.text not in record.getMessage()


def quiet_libraries(verbose: int) -> None:
    """Filter the libraries' lines a node prints at every start or exit without anything to act on.

    Installed before the DHT process is forked, so that process (where p2pd's lines are logged) has them
    too. At ``-vv`` everything is shown.
    """
    for name, text in ((P2PD_LOGGER, P2PD_LEAVING), ("transformers.utils.generic", TRANSFORMERS_CACHE_RENAME)):
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, DropMessage)]:
            logger.removeFilter(old)  # configured again (tests, a second command): the new -v count decides
        if verbose < 2:
            logger.addFilter(DropMessage(text))
    if verbose < 2:
        warnings.filterwarnings("ignore", message=f"{TRANSFORMERS_CACHE_RENAME} is deprecated", category=FutureWarning)


def configure_logging(verbose: int) -> None:
    """Level by ``-v`` count: 0 progress + warnings, 1 details and a line per round (INFO), 2+ debug (hivemind too)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(ctx)s%(message)s", datefmt="%H:%M:%S"))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    logging.getLogger(PROGRESS).setLevel(logging.INFO if verbose >= 0 else logging.WARNING)
    logging.getLogger(ROUNDS).setLevel(logging.INFO if verbose >= 1 else logging.WARNING)
    logging.getLogger("hivemind").setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)
    quiet_libraries(verbose)
