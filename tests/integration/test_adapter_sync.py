"""Two ``--adapter lora`` nodes drive DiLoCo on their adapters alone: same base, identical committed state."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.integration.nodes import NodeProc, Swarm, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]  # ~35 s on a loaded 2-core machine, most of it start-up

COMMON = ("--rounds", "0", "--local", "2", "--external", "2", "--generations", "4", "--sync-every", "2")
LORA = ("--model", "tiny-s", "--adapter", "lora", "--lora-rank", "4", "--lora-alpha", "8")


def committed(n: NodeProc) -> list[dict[str, Any]]:
    return [e for e in n.events("sync") if e["committed"]]


def test_two_adapter_nodes_commit_identical_adapter_states(swarm: Swarm) -> None:
    # different seeds: different samples; with the sync on, the same adapter init and (shared) built-in base
    a = swarm.spawn("a", *COMMON, *LORA, "--seed", "1")
    b = swarm.spawn("b", *COMMON, *LORA, "--seed", "2")
    swarm.go()
    wait_for(lambda: committed(a) and committed(b), 90, "a committed sync of a and b", watch=[a.proc, b.proc])

    (start_a,), (start_b,) = a.events("start"), b.events("start")
    trainable = start_a["trainable"]
    assert trainable == start_b["trainable"] and 0 < trainable < start_a["params"] / 2
    by_rev: dict[int, set[str]] = defaultdict(set)
    for e in committed(a) + committed(b):
        assert e["group_size"] == 2
        # at most the adapters' float32 bytes: a sync that moved the frozen base too would send more
        assert 0 < e["bytes_sent"] <= 4 * trainable, (e["bytes_sent"], trainable)
        by_rev[e["revision"]].add(e["state_hash"])
    assert by_rev and all(len(h) == 1 for h in by_rev.values()), by_rev
