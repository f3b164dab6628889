"""Atomic writes of a node's own state files, readable by its user alone.

The vote journal, the address book and the last listen port say which peers a node talks to and
which rounds it voted in: nothing another local account needs, and the peers a node trusts are
worth knowing to an attacker choosing whom to impersonate. They are written 0600, like the identity
key (``swarm.identity``), whatever the process umask: a crash leaves the old file or the new one.
"""

from __future__ import annotations

import os
from pathlib import Path

MODE = 0o600
"""Owner read and write only."""


def write_private(path: Path, data: bytes, fsync: bool = False) -> None:
    """Replace ``path`` by ``data`` atomically, mode 0600 (``fsync``: on disk before the rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, MODE)
    try:
        os.fchmod(fd, MODE)  # an older temporary file of this pid keeps its mode through O_CREAT
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
