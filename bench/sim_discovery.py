"""Discrete-event simulator of rollout discovery at 100 to 10,000 nodes: one DHT key, sharded keys, push gossip.

Usage::

    python bench/sim_discovery.py [--nodes 100 1000 10000] [--round-s 30] [--png docs/experiments/sim_discovery.png]
    python bench/sim_discovery.py --validate runs/val   # against real ``swarm-node local`` runs (bench_scale --keep)

Each node runs rounds of about ``round_s`` seconds (spread +-``jitter``), as a
node does: it starts a collect at the start of its round (its DHT reads see
what is visible then), generates for ``gen_frac`` of the round, then publishes
its descriptor and ingests the collect's batches (at most ``limit``, peers'
freshest ones it has not fetched, chosen at random). A publisher's descriptor
is readable ``store_s`` after it publishes. What the modes differ in:

* ``single``: today's one key per 30 s window; a reader reads the current and
  the previous window's key in full; a key whose reply exceeds hivemind's 4 MiB
  message cap reads as nothing.
* ``sharded``: the project's ``swarm.discovery`` (the same pure functions: shard
  of a publisher, keys a publisher stores under, read plan, estimate, shard
  count): each node keeps its own shard count and estimate.
* ``gossip``: each descriptor is pushed to every node over a random mesh of
  degree ``degree`` (GossipSub's D), ``hop_s`` per hop; a node receives each
  message once from each mesh neighbour that forwards it (``degree`` copies).

Measured: per-node discovery bytes/s (DHT replies or gossip copies; the
replica reads count ``replica_reads`` replies per key read), the busiest DHT
node's bytes/s served (each key lives on ``replicas`` nodes chosen by hash),
the dissemination latency (age of a peer's descriptor when a node ingests its
batch, p50 / p95), and the share of collects that found ``limit`` fresh
batches. Costs default to what was measured here (bench/RESULTS.md, "Rollout
discovery at scale": descriptor 343 B sealed, hivemind's 5 replicas, gossip hop
9 ms from py-libp2p's measurement on this kind of machine).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm import discovery  # noqa: E402

MODES = ("single", "sharded", "gossip")
CAP_BYTES = 4 * 1024 * 1024  # hivemind's message cap: a larger reply fails as a whole


@dataclass(frozen=True)
class Params:
    """One simulated swarm (costs in seconds and bytes, measured here unless stated)."""

    nodes: int
    mode: str = "single"
    round_s: float = 30.0
    jitter: float = 0.2
    gen_frac: float = 0.5
    read_s: float = 0.05
    store_s: float = 0.05
    window_s: float = 30.0
    desc_bytes: int = 343
    limit: int = 4
    replicas: int = 5
    replica_reads: int = 1
    reads: int = 2
    degree: int = 6
    hop_s: float = 0.009
    rounds: int = 8
    warmup_rounds: int = 3  # not measured: every node starts with an empty view (one shard, no estimate)
    seed: int = 0
    durations: tuple[float, ...] = ()  # if given, each round's length is drawn from these (measured rounds)
    together: bool = False  # every node starts its first round at once (``local``'s go file), else at random
    joiners: float = 0.0  # this share of the nodes joins only after the warm-up, knowing nothing (one shard)
    read_fail: float = 0.0  # chance that one DHT read times out (an overloaded DHT), measured
    store_fail: float = 0.0  # chance that a publish's DHT store fails: the key keeps the older descriptor
    collect_durations: tuple[float, ...] = ()  # if given, each collect takes one of these (reads, fetches, checks)


@dataclass
class Outcome:
    """What one simulation measured."""

    params: Params
    bytes_per_node_s: float = 0.0
    busiest_replica_s: float = 0.0
    ages: list[float] = field(default_factory=list)
    collect_ages: list[float] = field(default_factory=list)  # the median age of each collect's batches
    filled: list[float] = field(default_factory=list)
    seen_per_collect: list[int] = field(default_factory=list)
    shard_counts: list[int] = field(default_factory=list)
    joiner_filled: list[float] = field(default_factory=list)  # collects of late joiners, filled share
    joiner_from_swarm: list[bool] = field(default_factory=list)  # per batch a joiner took: from an earlier node?

    def pct(self, q: float) -> float:
        s = sorted(self.ages)
        return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")

    def row(self) -> dict[str, float | int | str]:
        p = self.params
        return {
            "mode": p.mode, "nodes": p.nodes, "bytes_per_node_s": round(self.bytes_per_node_s, 1),
            "busiest_replica_s": round(self.busiest_replica_s, 1), "age_p50": round(self.pct(0.5), 3),
            "age_p95": round(self.pct(0.95), 3), "filled": round(statistics.fmean(self.filled or [0.0]), 3),
            "seen": round(statistics.fmean(self.seen_per_collect or [0]), 1),
            "shards": max(self.shard_counts or [1]),
        }  # fmt: skip


@functools.lru_cache(maxsize=1 << 16)
def _replicas_of(key: str, nodes: int, k: int) -> tuple[int, ...]:
    """The ``k`` DHT nodes holding ``key`` (uniform by hash, as XOR distance to hashed ids is)."""
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    return tuple(rng.sample(range(nodes), min(k, nodes)))


def _gossip_delays(p: Params, rng: random.Random) -> list[list[float]]:
    """Per source (a sample of 16), each node's arrival delay over a random mesh of degree about ``degree``."""
    n = p.nodes
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        while len(nbrs[i]) < min(p.degree, n - 1):
            j = rng.randrange(n)
            if j != i:
                nbrs[i].add(j)
                nbrs[j].add(i)
    out = []
    for src in rng.sample(range(n), min(16, n)):
        hops = [-1] * n
        hops[src], frontier = 0, [src]
        while frontier:
            nxt = []
            for u in frontier:
                for v in nbrs[u]:
                    if hops[v] < 0:
                        hops[v] = hops[u] + 1
                        nxt.append(v)
            frontier = nxt
        out.append([h * p.hop_s * rng.uniform(0.7, 1.6) for h in hops])
    return out


@dataclass
class _Swarm:
    """The simulation's state: what the DHT holds (or gossip delivered) and each node's view."""

    p: Params
    rng: random.Random
    # key -> publisher -> its stores not yet superseded by a landed later one: (visible at, created)
    keys: dict[str, dict[int, list[tuple[float, float]]]] = field(default_factory=lambda: defaultdict(dict))
    key_lists: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    latest: dict[int, float] = field(default_factory=dict)  # gossip: publisher -> created of its freshest
    published: list[int] = field(default_factory=list)
    delays: list[list[float]] = field(default_factory=list)
    served: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    node_bytes: float = 0.0
    counting: bool = False  # past the warm-up: traffic and outcomes are measured

    def __post_init__(self) -> None:
        n = self.p.nodes
        self.fetched: list[set[tuple[int, float]]] = [set() for _ in range(n)]
        self.shards, self.estimates = [1] * n, [0.0] * n
        self.pending: dict[int, tuple[float, list[tuple[int, float]]]] = {}  # node -> (ready at, chosen)


def simulate(p: Params) -> Outcome:
    """Run ``p.rounds`` rounds of every node; see the module docstring for the model."""
    rng = random.Random(p.seed)
    out, sw = Outcome(p), _Swarm(p, rng)
    if p.mode == "gossip":
        sw.delays = _gossip_delays(p, rng)
    events: list[tuple[float, int, int]] = []  # (time, kind 0=publish and ingest 1=collect, node)
    warm = p.warmup_rounds * (statistics.median(p.durations) if p.durations else p.round_s * (1 + p.jitter))
    late = int(p.joiners * p.nodes)
    for i in range(p.nodes):
        period = p.round_s * rng.uniform(1 - p.jitter, 1 + p.jitter)
        t = 0.0 if p.together else rng.uniform(0, period)
        if i < late:  # joins after the warm-up
            t += warm
        for _ in range(p.rounds - (p.warmup_rounds if i < late else 0)):
            length = rng.choice(p.durations) if p.durations else period
            events += [(t, 1, i), (t + p.gen_frac * length, 0, i)]
            t += length
    events.sort()
    busy_until = [0.0] * p.nodes
    for t, kind, i in events:
        sw.counting = t >= warm
        if kind == 0:
            _publish(sw, i, t)
            ready, chosen = sw.pending.get(i, (0.0, None))
            if chosen is None or ready > t:  # no collect, or still running: its batches come a round later
                continue
            del sw.pending[i]
            if i < late:
                out.joiner_filled.append(len(chosen) / p.limit)
                out.joiner_from_swarm += [j >= late for j, _ in chosen]
            if sw.counting:
                out.ages += [t - c for _, c in chosen]
                out.filled.append(len(chosen) / p.limit)
                if chosen:
                    out.collect_ages.append(statistics.median(t - c for _, c in chosen))
        elif t >= busy_until[i]:  # one collect at a time, as a node's network worker runs them
            took = rng.choice(p.collect_durations) if p.collect_durations else p.read_s
            busy_until[i] = t + took
            sw.pending[i] = (t + took, _collect(sw, out, i, t + min(p.read_s, took)))
    span = max(events[-1][0] - warm, 1e-9) if events else 1.0
    out.bytes_per_node_s = sw.node_bytes / p.nodes / span
    out.busiest_replica_s = max(sw.served.values(), default=0.0) / span
    return out


def _publish(sw: _Swarm, i: int, t: float) -> None:
    p = sw.p
    if p.mode == "gossip":
        if i not in sw.latest:
            sw.published.append(i)
        sw.latest[i] = t
        sw.node_bytes += sw.counting * p.nodes * p.degree * p.desc_bytes  # every node receives D copies
        return
    window = int(t // p.window_s)
    if p.mode == "single":
        keys = [discovery.descriptor_key("sim", window, 1, 0)]
    else:
        keys = discovery.publisher_keys("sim", f"node{i}", window, sw.shards[i], sw.estimates[i])
    if p.store_fail and sw.rng.random() < p.store_fail:
        return
    for key in keys:
        if i not in sw.keys[key]:
            sw.key_lists[key].append(i)
        # stores land in order after store_s; until the newest lands, readers get the last one that has
        held = sw.keys[key].setdefault(i, [])
        landed = max((c for v, c in held if v <= t), default=None)
        held[:] = [(v, c) for v, c in held if landed is None or c >= landed]
        held.append((t + p.store_s, t))
        sw.node_bytes += sw.counting * p.replicas * p.desc_bytes  # the store reaches every replica


def _collect(sw: _Swarm, out: Outcome, i: int, snap: float) -> list[tuple[int, float]]:
    """One collect at ``snap``: count what the reads return, choose up to ``limit`` fresh batches at random."""
    p = sw.p
    if p.mode == "gossip":
        src = sw.delays[i % len(sw.delays)]
        if sw.counting:
            out.seen_per_collect.append(max(0, len(sw.latest) - (i in sw.latest)))

        def freshest(j: int) -> float | None:
            c = sw.latest.get(j)
            return c if c is not None and c + src[j] <= snap else None

        return _choose(sw, i, [sw.published], freshest)
    window = int(snap // p.window_s)
    if p.mode == "single":
        plan = [discovery.ShardRead(w, 1, 0) for w in (window, window - 1)]
    else:
        plan = discovery.read_plan((window, window - 1), sw.shards[i], p.reads, sw.rng)
    found: dict[discovery.ShardRead, list[str]] = {}
    readable: list[dict[int, list[tuple[float, float]]]] = []
    lists: list[list[int]] = []
    for read in plan:
        key = read.key("sim")
        held = sw.keys.get(key, {})
        size = len(held) * p.desc_bytes
        for node in _replicas_of(key, p.nodes, p.replicas)[: p.replica_reads]:
            sw.served[node] += sw.counting * min(size, CAP_BYTES)
        sw.node_bytes += sw.counting * p.replica_reads * min(size, CAP_BYTES)
        if p.read_fail and sw.rng.random() < p.read_fail:  # timed out: nothing, and nothing to estimate from
            continue
        if size > CAP_BYTES:  # the reply fails as a whole: the key reads as empty
            found[read] = []
            continue
        found[read] = [f"node{j}" for j in held]
        readable.append(held)
        lists.append(sw.key_lists[key])
    if sw.counting:
        out.seen_per_collect.append(sum(len(x) for x in found.values()))
    if p.mode == "sharded" and sw.counting:
        out.shard_counts.append(sw.shards[i])
    if p.mode == "sharded":
        est = discovery.estimate_publishers(found, sw.shards[i])
        if est is not None:
            sw.estimates[i] = discovery.smoothed(sw.estimates[i], est)
            sw.shards[i] = discovery.next_shard_count(sw.shards[i], sw.estimates[i])

    def freshest_dht(j: int) -> float | None:
        times = [c for held in readable for v, c in held.get(j, ()) if v <= snap]
        return max(times) if times else None

    return _choose(sw, i, lists, freshest_dht)


def _choose(
    sw: _Swarm, i: int, lists: list[list[int]], freshest: Callable[[int], float | None]
) -> list[tuple[int, float]]:
    """Up to ``limit`` publishers' freshest unfetched descriptors, uniformly at random (by rejection)."""
    total = sum(len(x) for x in lists)
    chosen: list[tuple[int, float]] = []
    picked: set[int] = set()
    for _ in range(40 * sw.p.limit):
        if len(chosen) >= sw.p.limit or total == 0:
            break
        k = sw.rng.randrange(total)
        for lst in lists:
            if k < len(lst):
                j = lst[k]
                break
            k -= len(lst)
        c = freshest(j)
        if j == i or j in picked or c is None or (j, c) in sw.fetched[i]:
            continue
        picked.add(j)
        sw.fetched[i].add((j, c))
        chosen.append((j, c))
    return chosen


def sweep(sizes: list[int], base: Params) -> list[Outcome]:
    rows = []
    for mode in MODES:
        for n in sizes:
            o = simulate(replace(base, nodes=n, mode=mode))
            rows.append(o)
            print(json.dumps(o.row()), file=sys.stderr, flush=True)
    return rows


def table(rows: list[Outcome]) -> str:
    lines = [
        "| mode | N | discovery bytes/s per node | busiest DHT node, bytes/s served | age p50 / p95 s "
        "| collects filled | descriptors seen per collect | shard count |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in rows:
        r = o.row()
        lines.append(
            f"| {r['mode']} | {r['nodes']} | {_si(float(r['bytes_per_node_s']))} "
            f"| {_si(float(r['busiest_replica_s']))} "
            f"| {r['age_p50']} / {r['age_p95']} | {float(r['filled']):.0%} | {r['seen']} | {r['shards']} |"
        )
    return "\n".join(lines)


def _si(v: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f}"


def plot(rows: list[Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode in MODES:
        sel = [o for o in rows if o.params.mode == mode]
        ns = [o.params.nodes for o in sel]
        axes[0].plot(ns, [o.bytes_per_node_s for o in sel], marker="o", label=mode)
        axes[1].plot(ns, [max(o.busiest_replica_s, 1.0) for o in sel], marker="o", label=mode)
        axes[2].plot(ns, [o.pct(0.95) for o in sel], marker="o", label=f"{mode} p95")
        axes[2].plot(ns, [o.pct(0.5) for o in sel], marker=".", linestyle="--", label=f"{mode} p50")
    titles = ("discovery bytes/s per node", "busiest DHT node: bytes/s served", "age of a peer's batch at ingest (s)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("nodes")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 300, 1000, 3000, 10000])
    ap.add_argument("--round-s", type=float, default=30.0, help="median round time of a node, s")
    ap.add_argument("--rounds", type=int, default=Params.rounds)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--validate", type=Path, default=None, help="folder of bench_scale --keep runs to compare with")
    args = ap.parse_args()
    if args.validate is not None:
        from bench.sim_validate import validate

        print(validate(args.validate))
        return
    rows = sweep(args.nodes, Params(nodes=0, round_s=args.round_s, rounds=args.rounds))
    print(table(rows))
    if args.png is not None:
        plot(rows, args.png)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
