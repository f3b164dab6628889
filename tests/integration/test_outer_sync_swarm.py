"""Nodes drive DiLoCo: same-architecture peers commit identical state; others share rollouts only."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.integration.nodes import NodeProc, Swarm, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

COMMON = ("--rounds", "0", "--local", "2", "--external", "2", "--generations", "4", "--sync-every", "12")


def committed(n: NodeProc) -> list[dict[str, Any]]:
    return [e for e in n.events("sync") if e["committed"]]


def test_two_architectures_two_sync_groups_one_rollout_swarm(swarm: Swarm) -> None:
    a = swarm.spawn("a", *COMMON, "--model", "tiny-s", "--seed", "1")
    b = swarm.spawn("b", *COMMON, "--model", "tiny-s", "--seed", "2")
    c = swarm.spawn("c", *COMMON, "--model", "tiny-gpt2", "--seed", "3")
    swarm.go()
    wait_for(lambda: len(committed(a)) >= 2 and len(committed(b)) >= 2, 240, "two committed syncs of a and b")
    wait_for(lambda: len(c.events("sync")) >= 1, 120, "c to attempt a sync")

    # a and b: the same state hash at every revision both committed, group of 2
    by_rev: dict[int, set[str]] = defaultdict(set)
    for e in committed(a) + committed(b):
        assert e["group_size"] == 2
        by_rev[e["revision"]].add(e["state_hash"])
    assert by_rev and all(len(h) == 1 for h in by_rev.values()), by_rev
    # the lone architecture finds no partner and trains on
    assert not committed(c) and all(e["group_size"] <= 1 and e["reason"] == "no partner" for e in c.events("sync"))
    # rollouts still flow across architectures
    sources = {n.name: {p for r in n.rounds() for p in r["external_peers"]} for n in (a, b, c)}
    wait_for(
        lambda: all(
            {m.peer_id for m in (a, b, c) if m is not n} <= {p for r in n.rounds() for p in r["external_peers"]}
            for n in (a, b, c)
        ),
        60,
        f"every node to use groups from both others (so far {sources})",
    )
