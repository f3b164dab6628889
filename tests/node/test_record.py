"""docs/METRICS.md documents exactly the fields of the typed round record."""

from __future__ import annotations

import re
from pathlib import Path

from node.core.record import RoundRecord

METRICS = Path(__file__).resolve().parents[2] / "docs" / "METRICS.md"


def documented_fields(event: str) -> list[str]:
    """The field names listed for ``event`` in docs/METRICS.md's table (backticked names before any note)."""
    for line in METRICS.read_text().splitlines():
        if line.startswith(f"| `{event}` |"):
            cell = line.split("|")[2]
            # a field is a backticked name at the start of the cell or right after a comma; notes in
            # parentheses may mention other names, so strip parenthesised text first
            flat = re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "", cell)
            return re.findall(r"`([a-z_]+)`", flat)
    raise AssertionError(f"docs/METRICS.md has no metrics row for event {event!r}")


def test_documented_round_row_matches_the_round_record() -> None:
    assert sorted(documented_fields(RoundRecord.EVENT)) == sorted(RoundRecord.field_names())


def test_documented_fields_reads_names_not_notes() -> None:
    assert documented_fields("resume") == ["time", "peer", "round", "path"]
