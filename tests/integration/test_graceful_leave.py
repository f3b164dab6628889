"""Leaving on a signal: SIGTERM -> clean exit 0 within the bound, with a summary and a checkpoint;
a second Ctrl-C -> immediate exit."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from node.cli.serve import LEAVE_BOUND_S
from node.core import checkpoint
from tests.integration.nodes import Swarm, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

COMMON = ("--rounds", "0", "--local", "2", "--generations", "4", "--seed", "5")


def test_sigterm_leaves_cleanly_within_the_bound(swarm: Swarm) -> None:
    # checkpoints only on leave: the one we find must be the final one
    a = swarm.spawn("a", *COMMON, "--checkpoint-every", "100000")
    swarm.go()
    wait_for(lambda: len(a.rounds()) >= 3, 60, "3 rounds")
    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    try:
        code = a.proc.wait(LEAVE_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within {LEAVE_BOUND_S}s of SIGTERM:\n{a.log()}")
    took = time.monotonic() - t0
    assert code == 0, a.log()
    summary = a.events("summary")
    assert summary, a.log()
    rounds = summary[-1]["rounds"]
    assert rounds == a.rounds()[-1]["round"], "no half-counted round"
    found = checkpoint.load_latest(a.log_dir / a.short)
    assert found is not None and found[0]["round"] == rounds, "the final checkpoint holds the last round"
    assert "Traceback" not in a.log()
    print(f"left {took:.2f}s after SIGTERM at round {rounds}")


def test_second_ctrl_c_exits_at_once(swarm: Swarm) -> None:
    a = swarm.spawn("a", *COMMON)
    swarm.go()
    wait_for(lambda: len(a.rounds()) >= 1, 60, "a round")
    a.kill(signal.SIGINT)  # the terminal sends Ctrl-C to the whole process group
    time.sleep(0.05)
    t0 = time.monotonic()
    a.kill(signal.SIGINT)
    code = a.proc.wait(5)
    assert code == 130, a.log()
    assert time.monotonic() - t0 < 2.0
