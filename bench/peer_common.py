"""What the comparison workers of bench/bench_sync.py share: JSON-lines reports, a file barrier, peak memory.

Used by bench/hivemind_avg_worker.py and bench/mesh_worker.py (each one
process of a 4-peer group on 127.0.0.1); no side effects at import.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

ENCODINGS = ("none", "fp16", "int8")
BYTES_PER_ELEMENT = {"none": 4, "fp16": 2, "int8": 1}


class Reporter:
    """Appends one JSON object per line; each line is flushed, so the bench can read it while the peer runs."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    def write(self, **record: Any) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()


def file_barrier(folder: Path, name: str, rank: int, peers: int, timeout: float, poll: float = 0.002) -> bool:
    """Mark ``rank`` as arrived at barrier ``name`` and wait (bounded) until all ``peers`` have; False on timeout.

    The short poll keeps the peers' release skew at a few milliseconds, small beside what is timed after it.
    """
    (folder / f"{name}.{rank}").touch()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all((folder / f"{name}.{i}").exists() for i in range(peers)):
            return True
        time.sleep(poll)
    return False


def self_peak_rss_mb() -> float:
    """This process's peak resident set size in MB (1e6 bytes; ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def pid_peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM, in kB) of a running process in MB; 0.0 when unreadable (gone, not Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) * 1024 / 1e6
