"""SIGKILL a node again and again, often while it writes its checkpoint; every restart resumes intact.

The node checkpoints every round (``--checkpoint-every 1``) and restarts with
``--resume``. Half of the kills wait for the temporary checkpoint file to
appear (the write is in progress), the others come at a random moment.
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest

from node.core.checkpoint import TEMPORARY
from node.observe.metrics import read_events
from protocol import short_id
from swarm.identity import load_or_create
from tests.integration.nodes import Zygote
from tests.procs import poll_until, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

KILLS = 10


def segments(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per process run: its resume round (None: fresh) and its round numbers."""
    runs: list[dict[str, Any]] = []
    for ev in events:
        if ev["event"] == "start":
            runs.append({"resume": None, "rounds": []})
        elif ev["event"] == "resume":
            runs[-1]["resume"] = ev["round"]
        elif ev["event"] == "round":
            runs[-1]["rounds"].append(ev["round"])
    return runs


def test_sigkill_during_checkpoints_always_resumes(zygote: Zygote, tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    run_dir = tmp_path / "runs" / short_id(load_or_create(key).peer_id)
    metrics = run_dir / "metrics.jsonl"
    argv = ["start", "--resume", "--checkpoint-every", "1", "--rounds", "0", "--local", "2", "--generations", "4"]
    argv += ["--identity", str(key), "--log-dir", str(tmp_path / "runs"), "--host-port", "127.0.0.1:0"]
    argv += ["--max-threads", "1", "--seed", "3"]
    rng = random.Random(7)
    log = tmp_path / "node.log"
    t0, mid_write = time.monotonic(), 0
    for i in range(KILLS + 1):
        seen = len(list(read_events(metrics, "round")))

        def trained(seen: int = seen) -> bool:
            return len(list(read_events(metrics, "round"))) > seen

        node = zygote.start(argv, log)
        wait_for(trained, 60, f"run {i} to train", poll=0.05, watch=[node])
        assert node.alive(), log.read_text()[-3000:]
        if i == KILLS:
            break
        # When the SIGKILL lands is the thing under test, so these waits are deliberate:
        if i % 2 == 0:  # while the checkpoint is being written: spin (no sleep) to catch the short window
            poll_until((run_dir / TEMPORARY).exists, 2.0, poll=0.0)
        else:  # at a random moment of the round
            time.sleep(rng.uniform(0.0, 0.4))
        node.kill()
        mid_write += (run_dir / TEMPORARY).exists()
        node.wait(10)

    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    runs = segments(list(read_events(metrics)))
    assert len(runs) == KILLS + 1 and runs[0]["resume"] is None
    for before, after in itertools.pairwise(runs):
        last = max(before["rounds"], default=before["resume"] or 0)
        resumed = after["resume"] or 0  # None: no checkpoint was complete yet (killed writing round 1's)
        assert last - 1 <= resumed <= last, f"resumed at {resumed} after round {last}: {runs}"
        assert after["rounds"][0] == resumed + 1, "the round counter must continue from the checkpoint"
    fallbacks = text.count("trying the previous one")
    took = time.monotonic() - t0
    print(f"{KILLS} kills in {took:.1f}s, {mid_write} mid-write; {fallbacks} fell back to the previous checkpoint")
    assert mid_write >= 1, "no kill landed during a checkpoint write"
