"""Crash-safe checkpoints: ``<log-dir>/<peer-short>/checkpoint.pt`` and the one before it.

File layout: an 8-byte magic, the 32-byte sha256 of the payload, then the
payload (``torch.save`` of a dict). Writing goes to a temporary file that is
fsynced and then renamed over the current one (the current one first becomes
``checkpoint.prev.pt``), so a crash at any moment leaves at least one intact
file; loading verifies the checksum and falls back to the previous file.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from pathlib import Path
from typing import Any

import torch

from node.core.checkpoint_round import CHECKPOINT_FILE, write_round
from node.core.configs import CheckpointConfig as CheckpointConfig

logger = logging.getLogger(__name__)

MAGIC = b"SWNCKPT1"
CURRENT = CHECKPOINT_FILE
PREVIOUS = "checkpoint.prev.pt"
TEMPORARY = "checkpoint.pt.tmp"


class CheckpointError(Exception):
    """No intact checkpoint could be loaded although some exist."""


def encode(state: dict[str, Any]) -> bytes:
    """Magic + sha256 + the ``torch.save`` bytes of ``state``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode(data: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode`; ValueError if the file is torn or corrupt."""
    head = len(MAGIC) + 32
    if len(data) < head or not data.startswith(MAGIC):
        raise ValueError(f"not a checkpoint or truncated ({len(data)} bytes)")
    digest, payload = data[len(MAGIC) : head], data[head:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch (torn or corrupt file)")
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError("checkpoint payload is not a dict")
    return state


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(directory: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically as ``checkpoint.pt``, keeping the previous one as ``checkpoint.prev.pt``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = encode(state)
    tmp, current = directory / TEMPORARY, directory / CURRENT
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if current.exists():
        os.replace(current, directory / PREVIOUS)
    os.replace(tmp, current)
    if isinstance(state.get("round"), int):  # the command line reads it without torch (checkpoint_round)
        write_round(directory, state["round"])
    _fsync_dir(directory)
    return current


def load_latest(directory: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest intact checkpoint in ``directory`` and its path; None if there is none at all.

    A torn or corrupt file is skipped with a warning. Raises CheckpointError if
    files exist but none is intact.
    """
    found = [p for p in (directory / CURRENT, directory / PREVIOUS) if p.exists()]
    for path in found:
        try:
            return decode(path.read_bytes()), path
        except (ValueError, RuntimeError, EOFError, OSError) as e:
            logger.warning("checkpoint %s is unusable (%s); trying the previous one", path, e)
    if found:
        raise CheckpointError(
            f"no intact checkpoint in {directory} ({len(found)} corrupt); move them away or run without --resume"
        )
    return None
