"""The round of a node's current checkpoint, in a small JSON file beside it: readable without torch.

``checkpoint.pt`` is a ``torch.save`` payload, so reading its round means importing torch (seconds).
The command line checks ``--resume`` against ``--rounds`` before anything heavy loads, so every
checkpoint write also writes ``checkpoint.json`` (``{"round": N}``) beside it. It describes
``checkpoint.pt``; a missing or unreadable file only means that check is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROUND_FILE = "checkpoint.json"
CHECKPOINT_FILE = "checkpoint.pt"


def write_round(directory: Path, round_: int) -> None:
    """Record ``round_`` as the round of the checkpoint just written in ``directory`` (atomically)."""
    tmp = directory / f".{ROUND_FILE}.tmp"
    tmp.write_text(json.dumps({"round": int(round_)}))
    os.replace(tmp, directory / ROUND_FILE)


def read_round(directory: Path) -> int | None:
    """The round of ``directory``'s current checkpoint; None where there is none or it is not recorded."""
    if not (directory / CHECKPOINT_FILE).exists():
        return None
    try:
        value = json.loads((directory / ROUND_FILE).read_text()).get("round")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
