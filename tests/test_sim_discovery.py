"""The discovery simulator (bench/sim_discovery.py) keeps the properties its curves are read for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.sim_discovery import Params, simulate

BASE = Params(nodes=0, round_s=10.0, rounds=6, warmup_rounds=3)


def _run(mode: str, n: int, **kw: object) -> tuple[float, float, float]:
    o = simulate(replace(BASE, mode=mode, nodes=n, **kw))  # type: ignore[arg-type]
    return o.bytes_per_node_s, o.busiest_replica_s, sum(o.filled) / max(len(o.filled), 1)


@pytest.mark.slow
def test_one_key_grows_with_the_swarm_and_shards_do_not() -> None:
    single = [_run("single", n) for n in (200, 1600)]
    sharded = [_run("sharded", n) for n in (200, 1600)]
    assert single[1][0] > 5 * single[0][0]  # every reader reads every descriptor: per-node bytes ~N
    assert single[1][1] > 40 * single[0][1]  # and the key's replicas serve all of them to everyone: ~N^2
    assert sharded[1][0] < 3 * sharded[0][0]  # a few shards per read whatever N is
    assert sharded[1][1] < 10 * sharded[0][1]
    assert min(s[2] for s in single + sharded) > 0.9  # and every collect still finds its batches


def test_gossip_delivers_every_descriptor_to_every_node() -> None:
    small, large = _run("gossip", 200), _run("gossip", 800)
    assert 3.5 < large[0] / small[0] < 4.5  # per-node bytes grow with N: each node gets each descriptor
    assert small[1] == large[1] == 0.0  # no DHT replica serves anything


def test_a_key_past_the_message_cap_reads_as_nothing() -> None:
    big = {"desc_bytes": 30_000}  # 300 x 30 kB = 9 MB in one key: over hivemind's 4 MiB
    assert _run("single", 300, **big)[2] < 0.5  # once the window's key is full, collects find nothing


@pytest.mark.slow
def test_nodes_joining_a_sharded_swarm_late_find_it() -> None:
    # 10% of the nodes join two 30 s windows after the swarm spread over shards: no key at one shard holds
    # anyone any more, and the joiners would find only each other there (an island) but for the probes
    o = simulate(replace(BASE, mode="sharded", nodes=2000, joiners=0.1, rounds=20, warmup_rounds=8))
    assert max(o.shard_counts) >= 16
    assert o.joiner_filled and sum(o.joiner_filled) / len(o.joiner_filled) > 0.7
    later = o.joiner_from_swarm[len(o.joiner_from_swarm) // 2 :]  # their later rounds: batches of earlier nodes
    assert sum(later) / len(later) > 0.6
