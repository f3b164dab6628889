"""Why a chaos run's state downloads failed to dial: was the donor running, frozen or gone at that moment?

A node that is behind downloads a state from a donor named only by its peer
id. Under chaos most of those donors are killed or frozen by the time the
download starts, and libp2p then answers "all dials failed" (and "dial
backoff" for the next few seconds). A dial that fails to a donor that was
running and answering would be a defect of the node's networking instead.

Each node process writes one log (``<out>/logs/<node>.<k>.log``) with a
timestamped line for every round (several a second while it runs). So a
donor was, at a failed dial's time ``t``:

- **running**: one of its logs has lines within :data:`LIVE_S` before and
  after ``t`` (it went on with rounds around the dial);
- **silent**: ``t`` falls inside one of its processes' logs but with no line
  that close (frozen by SIGSTOP, or stalled);
- **gone**: no process of it was logging at ``t`` (killed, left, not yet
  restarted).

Log lines carry the time of day only, so a run that crosses midnight is judged wrongly
across it. Run: ``python bench/chaos_dials.py runs/<chaos out>``. Pure functions below;
only :func:`main` reads files.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

LIVE_S = 2.0
"""Most seconds between a failed dial and the donor's nearest log lines, on both sides, for it to count as running."""

_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) \w \[(\w{6})[ \]]")
_FAILED = re.compile(
    r"^(\d\d):(\d\d):(\d\d) W \[(\w{6}) [^\]]*\] state download from (\w{6}) failed: .*all dials failed"
)


class DonorState(Enum):
    RUNNING = "running"
    SILENT = "silent"
    GONE = "gone"


@dataclass(frozen=True)
class Failure:
    """One failed dial: when (seconds of the day), who dialed, and the donor's short id."""

    t: float
    node: str
    donor: str


def seconds(h: str, m: str, s: str) -> float:
    return int(h) * 3600 + int(m) * 60 + float(s)


def parse_log(lines: Iterable[str]) -> tuple[str | None, list[float], list[Failure]]:
    """A process log's own short id, the times of its lines (sorted), and the failed dials it logged."""
    me: str | None = None
    times: list[float] = []
    failures: list[Failure] = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        times.append(seconds(*m.group(1, 2, 3)))
        me = me or m.group(4)
        f = _FAILED.match(line)
        if f is not None:
            failures.append(Failure(times[-1], f.group(4), f.group(5)))
    return me, sorted(times), failures


def classify(t: float, processes: Sequence[Sequence[float]]) -> DonorState:
    """The donor's state at ``t`` from the sorted line times of each of its processes' logs."""
    inside = False
    for times in processes:
        if not times or not times[0] <= t <= times[-1]:
            continue
        inside = True
        i = bisect.bisect_left(times, t)
        before = times[i - 1] if i > 0 else times[0]
        after = times[i] if i < len(times) else times[-1]
        if t - before <= LIVE_S and after - t <= LIVE_S:
            return DonorState.RUNNING
    return DonorState.SILENT if inside else DonorState.GONE


def tally(failures: Iterable[Failure], processes: Mapping[str, Sequence[Sequence[float]]]) -> Counter[DonorState]:
    """How many failed dials found their donor running, silent or gone."""
    return Counter(classify(f.t, processes.get(f.donor, [])) for f in failures)


def read_run(out: Path) -> tuple[list[Failure], dict[str, list[list[float]]]]:
    """Every failed dial of a run's logs, and each short id's processes (their line times)."""
    failures: list[Failure] = []
    processes: dict[str, list[list[float]]] = {}
    for log in sorted((out / "logs").glob("*.log")):
        with log.open(errors="replace") as fh:
            me, times, failed = parse_log(fh)
        failures += failed
        if me is not None:
            processes.setdefault(me, []).append(times)
    return failures, processes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path, nargs="+", help="a chaos run's --out folder")
    args = ap.parse_args(argv)
    for out in args.out:
        failures, processes = read_run(out)
        counts = tally(failures, processes)
        shown = ", ".join(f"{s.value} {counts.get(s, 0)}" for s in DonorState)
        print(f"{out}: {len(failures)} failed dials; donor {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
