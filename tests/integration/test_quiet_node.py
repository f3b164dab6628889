"""A node is quiet by default and never silent about trouble (real processes on 127.0.0.1).

Two nodes of one swarm print progress summaries, no ERROR and no traceback, and leave silently on a
Ctrl-C to their process group (which stops p2pd at the same time). A joiner with another ``--swarm-id``
says once that the peers it reached are of another swarm; a node whose last peer is killed says once
that it trains alone. One run checks all three, to keep the suite short.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from node.observe.progress import PROGRESS_EVERY_S
from tests.integration.nodes import NodeProc, Swarm, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

COMMON = ("--rounds", "0", "--checkpoint-every", "0")
RUN_S = 20.0
FIXED_LINES = 12
"""Lines a node prints besides its progress summaries: its addresses and join hint (5), the held-out
score before the first round, a warning or two of the trainer, and its two lines on leaving."""
NOISE = re.compile(r"\bERROR\b|\] E |Traceback|hard way|FutureWarning|deprecated", re.IGNORECASE)


def _lines(node: NodeProc) -> list[str]:
    return [line for line in node.proc.output().splitlines() if line.strip()]


def _quiet(node: NodeProc, budget: int) -> int:
    """Assert ``node`` printed no error, traceback or library noise, in at most ``budget`` lines; its count."""
    lines = _lines(node)
    noisy = [line for line in lines if NOISE.search(line)]
    assert not noisy, "\n".join(noisy)
    assert len(lines) <= budget, f"{node.name}: {len(lines)} lines > {budget}:\n" + "\n".join(lines)
    assert len(node.rounds()) > len(lines), "summaries, not a line per round"
    return len(lines)


def _leave(node: NodeProc) -> None:
    node.kill(signal.SIGINT)  # a terminal's Ctrl-C: the whole process group, p2pd included
    assert node.proc.wait(30) == 0, node.log()


def test_quiet_by_default_and_never_silent_about_trouble(swarm: Swarm) -> None:
    quick = ("--alone-after", "6")
    a = swarm.spawn("a", *COMMON, *quick)
    b = swarm.spawn("b", *COMMON)
    other = swarm.spawn("other", *COMMON, *quick, "--swarm-id", "another-swarm")
    swarm.go()
    wait_for(lambda: len(b.rounds()) >= 1 and len(a.rounds()) >= 1, 90, "a's and b's first rounds")
    t0 = time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= RUN_S, RUN_S + 5, "the run", poll=1.0, watch=[a.proc, b.proc])
    budget = FIXED_LINES + int(RUN_S / PROGRESS_EVERY_S) + 2
    counts = {"b": _quiet(b, budget)}
    other_swarm = "none publishes in swarm 'another-swarm'"
    wait_for(lambda: other_swarm in other.proc.output(), 30, "the other swarm's warning", watch=[other.proc])
    assert "trains alone" not in a.proc.output() + b.proc.output(), "a and b hear each other"

    b.kill(signal.SIGKILL)  # a crash: no goodbye
    gone = "has not been heard for"
    wait_for(lambda: gone in a.proc.output(), 60, "a to notice its last peer is gone", watch=[a.proc])
    n = len(a.rounds())
    wait_for(lambda: len(a.rounds()) >= n + 10, 30, "more rounds alone", watch=[a.proc])
    _leave(other)
    _leave(a)
    assert a.proc.output().count(gone) == 1, a.log()
    assert other.proc.output().count(other_swarm) == 1, other.log()
    assert "--swarm-id" in other.proc.output()
    assert other_swarm not in a.proc.output(), "a node that heard a peer is not told about swarm ids"
    counts["a"] = _quiet(a, budget + 4)  # it ran longer, and said its peer is gone
    counts["other"] = _quiet(other, budget + 4)
    print(f"lines per node: {counts}, ~{RUN_S:.0f}s together")
