"""Metrics as JSON lines: one object per line in ``<log-dir>/<peer-short-id>/metrics.jsonl``.

Append-only and flushed per line, so a crash loses at most the line being
written and readers (``swarm-node local``, the dashboard) can tail the file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends events to ``path``; each event is one JSON object on one line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the node's life
        if self._f.tell() > 0 and not _ends_with_newline(self.path):
            self._f.write("\n")  # a crash tore the last line: start ours on a fresh one

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, **{k: _clean(v) for k, v in fields.items()}}
        self._f.write(json.dumps(record, separators=(",", ":"), sort_keys=False) + "\n")
        self._f.flush()
        return record

    def close(self) -> None:
        self._f.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; write null so every reader can parse every line.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_events(path: str | os.PathLike[str], event: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events in a metrics file, skipping a torn last line."""
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written right now, or torn by a crash
            if isinstance(rec, dict) and (event is None or rec.get("event") == event):
                yield rec
