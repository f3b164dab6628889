"""The revisions this peer voted to commit, written to disk before each vote goes out.

A member that votes for revision R and is then frozen or killed before it
learns the outcome restarts from a checkpoint older than R. Its partners may
have committed R; if every record of that commit is gone (they died too, and
the DHT replicas holding their records with them), nothing else tells the
restarted member that R has a state, and its next group would extend the same
parent under the same number: a second state of R. The journal is that
member's own memory of the vote. On start the sync counts every journalled
revision as reported (``CatchUpper.undecided``), so its next commit skips past
it. Written atomically (temporary file, fsync, rename) beside the identity file,
as the address book and the listen port are: the memory belongs to the peer id,
whatever ``--log-dir`` a restart uses. Where the bytes go is a seam
(:class:`JournalStore`): a simulation of many members keeps each one's in
memory, past its member's restarts, since an fsync per vote tests the disk, not the rule.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from swarm.private_files import write_private

logger = logging.getLogger(__name__)

KEPT = 64
"""Revisions kept (the newest): as many as ``CatchUpper`` remembers of its own aborted votes."""
MAX_BYTES = 16 * 1024
"""A journal file larger than this is not read (it is ours, but a disk can hold anything)."""


def journal_path(identity_path: Path) -> Path:
    """``<identity>.votes.json``: one journal per identity."""
    return identity_path.with_name(identity_path.name + ".votes.json")


class JournalStore(Protocol):
    """Where a journal's bytes are kept: read once when the sync starts, replaced whole before each vote."""

    def read(self) -> bytes | None:
        """The bytes last written (at most ``MAX_BYTES + 1`` of them), None if none; OSError if unreadable."""
        ...

    def write(self, data: bytes) -> None:
        """Replace the bytes, durably, before returning; OSError if that could not be done."""
        ...


class FileJournal:
    """A journal in one file, written atomically and fsynced (:func:`swarm.private_files.write_private`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return str(self.path)

    def read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        write_private(self.path, data, fsync=True)


class VoteJournal:
    """Revisions voted for under one sync fingerprint, newest last, in a file (``path``) or another
    :class:`JournalStore`; ``None`` keeps nothing."""

    def __init__(self, path: Path | JournalStore | None, fingerprint: str) -> None:
        self.store: JournalStore | None = FileJournal(path) if isinstance(path, Path) else path
        self.fingerprint = fingerprint
        self._voted: list[int] = self._read()

    @property
    def voted(self) -> list[int]:
        return list(self._voted)

    def record(self, revision: int) -> bool:
        """Add ``revision`` and write the journal before the vote is sent; False if it could not be written."""
        if self.store is None:
            return True
        kept = [r for r in self._voted if r != revision][-(KEPT - 1) :]
        voted = [*kept, revision]
        data = json.dumps({"fingerprint": self.fingerprint, "voted": voted})
        try:
            self.store.write(data.encode())
        except OSError as e:
            logger.warning("vote journal %s not written: %s", self.store, e)
            return False
        self._voted = voted
        return True

    def _read(self) -> list[int]:
        """The journalled revisions of this fingerprint; anything unreadable or another fingerprint's is none."""
        if self.store is None:
            return []
        try:
            raw = self.store.read()
        except OSError as e:
            logger.warning("vote journal %s not read: %s", self.store, e)
            return []
        if raw is None:
            return []
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            found = json.loads(raw)
            if not isinstance(found, dict) or found.get("fingerprint") != self.fingerprint:
                return []
            voted = found.get("voted")
            if not isinstance(voted, list):
                raise ValueError("no list of revisions")
            return [r for r in voted if isinstance(r, int) and not isinstance(r, bool) and r > 0][-KEPT:]
        except ValueError as e:
            logger.warning("vote journal %s ignored: %s", self.store, e)
            return []
