"""Named failures of outer sync (re-exported by :mod:`swarm.sync`)."""

from __future__ import annotations

from swarm.sync.config import AbortCause, SyncAborted


class BadBytes(SyncAborted):
    """Received (or about to send) bytes of the wrong size or with non-finite values."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"bad bytes: {detail}", AbortCause.BAD_BYTES)


class GroupMismatch(SyncAborted):
    """A message named another group id, revision or slice than this member expects."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"group mismatch: {detail}", AbortCause.GROUP_MISMATCH)


class StateDownloadFailed(SyncAborted):
    """No donor served state that matched the target revision and hash (or the target was refused).

    ``retry``: skip this round and try again next one, rather than sync at this peer's own state.
    """

    def __init__(self, detail: str, retry: bool = False) -> None:
        super().__init__(detail, AbortCause.CATCH_UP_FAILED)
        self.retry = retry


class PeerLost(SyncAborted):
    """A peer closed its stream (crashed, killed, or gave up on the round)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"peer lost: {detail}", AbortCause.PEER_LOST)
