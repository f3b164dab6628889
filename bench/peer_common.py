"""What the comparison workers of bench/bench_sync.py share: their arguments, a file barrier, peak memory
(their JSON-lines reports are ``tests.procs.Reporter``, as tests/sync_worker.py's).

Used by bench/hivemind_avg_worker.py and bench/mesh_worker.py (each one
process of a 4-peer group on 127.0.0.1 or on rate-limited links); no side effects at import.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

ENCODINGS = ("none", "fp16", "int8")
BYTES_PER_ELEMENT = {"none": 4, "fp16": 2, "int8": 1}


def group_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every comparison worker takes (its place in the group, the encodings, its report)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--encodings", default=",".join(ENCODINGS))
    p.add_argument("--rounds-per", type=int, default=2)
    p.add_argument("--report", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (a rate-limited link's, bench/links.py)")
    return p


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
