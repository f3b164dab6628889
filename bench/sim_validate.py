"""The discovery simulator against real ``swarm-node local`` runs: descriptors seen per collect and the age of
peers' batches when a node ingests them, measured and predicted for the same N.

Usage::

    python bench/bench_scale.py --nodes 4 8 16 32 64 --rounds 50 --keep runs/val
    python bench/sim_discovery.py --validate runs/val

The simulator gets what each run measured as its costs (the round lengths and
the collects' durations, drawn from the run's own; the share of a round before
its batch is published; the shares of DHT reads and stores that failed, from
the nodes' own warnings; the median time a store took, from the round records)
and nothing of what it predicts. Rounds 1-2 are left
out on both sides (every node starts with nothing to collect).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.sim_discovery import Outcome, Params, simulate
from node.observe.metrics import read_events

WARMUP = 2


@dataclass
class Measured:
    """One real run's rounds (warm-up left out)."""

    nodes: int
    rounds: int
    durations: list[float]
    gen_frac: float
    seen: list[int]
    ages: list[float]
    collects: list[float]

    read_fail: float = 0.0
    store_fail: float = 0.0
    store_s: float = 0.05  # the nodes' median time for a descriptor store (records' store_s), if recorded


def measure(run: Path) -> Measured:
    events = [e for path in sorted(run.glob("*/metrics.jsonl")) for e in read_events(path, "round")]
    nodes = len(list(run.glob("*/metrics.jsonl")))
    late = [e for e in events if int(e["round"]) > WARMUP]
    m = Measured(
        nodes=nodes,
        rounds=max(int(e["round"]) for e in events),
        durations=[float(e["round_s"]) for e in late],
        gen_frac=statistics.median(float(e["generate_s"]) / max(float(e["round_s"]), 1e-9) for e in late),
        seen=[int(e["descriptors_seen"]) for e in late if e.get("descriptors_seen") is not None],
        ages=[float(e["external_age_s"]) for e in late if e.get("external_age_s") is not None],
        collects=[float(e["collect_s"]) for e in late if e.get("collect_s") is not None],
    )
    # the nodes' own warnings count the DHT reads and stores that failed (timed out on an overloaded machine)
    logs = "".join(p.read_text(errors="replace") for p in run.glob("node*.log"))
    collects = sum(1 for e in events if e.get("collect_s") is not None)
    m.read_fail = min(1.0, logs.count("DHT read of") / max(2 * collects, 1))
    m.store_fail = _store_fail(run) if any("stores" in e for e in events) else (
        min(1.0, logs.count("DHT store of") / max(len(events), 1))  # runs from before the records counted stores
    )  # fmt: skip
    stores = [float(e["store_s"]) for e in late if e.get("store_s") is not None]
    if stores:
        m.store_s = statistics.median(stores)
    return m


def _store_fail(run: Path) -> float:
    """The share of descriptor stores that failed, over every node (each node's counters at its last round).

    A node near a shard-count threshold stores twice per round, so stores, not rounds, are the denominator.
    """
    ok = failed = 0
    for path in run.glob("*/metrics.jsonl"):
        last = max(read_events(path, "round"), key=lambda e: int(e["round"]), default=None)
        if last is not None:
            ok, failed = ok + int(last.get("stores", 0)), failed + int(last.get("stores_failed", 0))
    return failed / max(ok + failed, 1)


def predict(m: Measured, seed: int = 0) -> Outcome:
    p = Params(
        nodes=m.nodes, mode="single", round_s=statistics.median(m.durations), gen_frac=m.gen_frac,
        read_s=min(m.collects), collect_durations=tuple(m.collects), rounds=m.rounds, warmup_rounds=WARMUP,
        durations=tuple(m.durations), together=True, limit=8, seed=seed, read_fail=m.read_fail, store_s=m.store_s,
        store_fail=m.store_fail,
    )  # fmt: skip
    return simulate(p)


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def _err(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.0%}" if measured else "-"


def validate(folder: Path) -> str:
    """The validation table. Ages are compared by their mean and p95: a batch is ingested one or two of its
    reader's rounds after it was published, so the ages have two modes and their median jumps between them."""
    lines = [
        "| N | rounds | round s (median) | store s | DHT reads / stores that failed "
        "| seen per collect (mean): measured / predicted | error "
        "| age mean s: measured / predicted | error | age p95 s: measured / predicted | error "
        "| age p50 s: measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(folder.iterdir(), key=lambda r: int(r.name.split("-")[0][1:])):
        m = measure(run)
        o = predict(m)
        seen_m, seen_p = statistics.mean(m.seen), statistics.mean(o.seen_per_collect)
        mean = (statistics.mean(m.ages), statistics.mean(o.collect_ages))
        a50 = (_q(m.ages, 0.5), _q(o.collect_ages, 0.5))
        a95 = (_q(m.ages, 0.95), _q(o.collect_ages, 0.95))
        lines.append(
            f"| {m.nodes} | {m.rounds} | {statistics.median(m.durations):.2f} | {m.store_s:.2f} "
            f"| {m.read_fail:.0%} / {m.store_fail:.0%} "
            f"| {seen_m:.0f} / {seen_p:.0f} | {_err(seen_p, seen_m)} "
            f"| {mean[0]:.2f} / {mean[1]:.2f} | {_err(mean[1], mean[0])} "
            f"| {a95[0]:.2f} / {a95[1]:.2f} | {_err(a95[1], a95[0])} | {a50[0]:.2f} / {a50[1]:.2f} |"
        )
    return "\n".join(lines)
