"""The node's identity: one Ed25519 key file gives both its signing key and its peer id.

The file holds a libp2p ``PrivateKey`` protobuf in the layout go-libp2p (and so
hivemind's ``p2pd``) reads: ``Type = Ed25519``, ``Data = seed || public key``.
The same file is passed to p2pd as ``identity_path``, so the peer id the
network sees is exactly the one our signatures are bound to.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from protocol import SigningKey

logger = logging.getLogger(__name__)

# protobuf PrivateKey{Type (field 1, varint) = Ed25519 (1), Data (field 2, bytes, len 64)}
_PB_PREFIX = bytes([0x08, 0x01, 0x12, 0x40])


class IdentityError(RuntimeError):
    """The identity file exists but cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class Identity:
    """A loaded identity: the signing key and where it is stored."""

    key: SigningKey
    path: Path

    @property
    def peer_id(self) -> str:
        return self.key.peer_id


def encode_key_file(key: SigningKey) -> bytes:
    """The libp2p protobuf bytes for ``key`` (go-libp2p Ed25519 layout)."""
    return _PB_PREFIX + key.seed + key.public_key


def decode_key_file(data: bytes, path: Path) -> SigningKey:
    if len(data) != len(_PB_PREFIX) + 64 or not data.startswith(_PB_PREFIX):
        raise IdentityError(
            f"{path} is not an Ed25519 identity file written by swarm-node; "
            "move it away (or pass another --identity path) and a new one will be created"
        )
    seed, public = data[4:36], data[36:68]
    key = SigningKey(seed)
    if key.public_key != public:
        raise IdentityError(f"{path} is corrupt (public key does not match seed); restore it from a backup")
    return key


def check_private(path: Path) -> None:
    """Refuse a key file that other users can read or write, as ssh does: they could act as this peer."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise IdentityError(
            f"{path} is a private key but its mode is {mode:04o} (others can read it); "
            f"make it private with: chmod 600 {path}"
        )


def load_or_create(path: str | os.PathLike[str]) -> Identity:
    """Load the identity at ``path``, creating it (mode 0600) on first run.

    Creation is atomic: a crash leaves either no file or a complete one. An
    existing file that group or others may access is refused (:func:`check_private`).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise IdentityError(f"identity {p} is a directory; pass a key file path, e.g. {p / 'identity.key'}")
    if p.exists():
        try:
            data = p.read_bytes()
        except OSError as e:
            raise IdentityError(
                f"identity {p} cannot be read ({e.strerror}); fix its permissions or pass another"
            ) from None
        key = decode_key_file(data, p)
        check_private(p)
        return Identity(key, p)
    p.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, encode_key_file(key))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, p)  # fails if another process created p meanwhile: theirs wins
    except FileExistsError:
        tmp.unlink()
        key = decode_key_file(p.read_bytes(), p)
        check_private(p)
        return Identity(key, p)
    tmp.unlink()
    logger.info("created new identity %s at %s", key.peer_id, p)
    return Identity(key, p)


class IdentityInUse(IdentityError):
    """Another running process holds this identity: two nodes with one peer id would fight over it."""


LOCK_WAIT_S = 10.0
"""How long a starting node waits for its identity's lock before refusing to start.

The lock is an ``flock``, which a forked child shares: hivemind's DHT process holds it until it exits.
When a node is SIGKILLed, that process gets SIGKILL at its parent's death (node.cli.signals) but exits
a moment later, longer on a loaded machine, so a restart at once (a supervisor's, or a test's) could be
refused with no other node running. A second node on one identity is refused after this wait."""


class IdentityLock:
    """An exclusive ``flock`` on ``<identity>.lock`` held while a node runs; the kernel drops it when we exit."""

    def __init__(self, identity: Identity) -> None:
        self.path = identity.path.with_name(identity.path.name + ".lock")
        self._fd: int | None = None

    def acquire(self, wait_s: float = LOCK_WAIT_S, poll_s: float = 0.05) -> IdentityLock:
        """Take the lock, waiting up to ``wait_s`` for a previous process to let go of it, or raise
        :class:`IdentityInUse` naming the fix."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        end, waited = time.monotonic() + wait_s, False
        while not _try_flock(fd):
            if time.monotonic() >= end:
                os.close(fd)
                key = self.path.with_name(self.path.name.removesuffix(".lock"))
                raise IdentityInUse(
                    f"identity {key} is in use by another running node; pass --identity PATH for a second node"
                )
            if not waited:
                logger.info("%s is held: waiting up to %.0f s for its last process to exit", self.path, wait_s)
                waited = True
            time.sleep(poll_s)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the flock
            self._fd = None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
