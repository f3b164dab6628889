"""Per-node report of a ``swarm-node local`` run: cumulative reward, sharing vs isolated, and reward curves.

``swarm-node local --isolated K`` runs its last K nodes with ``--external 0`` beside the others, so
one run holds its own baseline. This reads ``<log-dir>/node<i>.ready`` (which peer is node i) and each
node's ``metrics.jsonl``, and prints a markdown table per node and per role, then writes a PNG of each
node's mean local reward per round (trailing moving average) and of its cumulative reward.

    .venv/bin/python bench/report_local.py runs/smol4 --isolated 2 --png docs/experiments/smollm2_swarm.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.experiments.results import smooth
from node.observe.metrics import read_events


@dataclass
class NodeRun:
    """One node's rounds, in order."""

    index: int
    peer: str
    model: str
    isolated: bool
    rounds: list[dict[str, Any]]

    @property
    def rewards(self) -> list[float]:
        return [float(r["reward_mean"]) for r in self.rounds]

    def per_round(self, key: str) -> float:
        return statistics.fmean(float(r[key]) for r in self.rounds) if self.rounds else 0.0


def load(log_dir: Path, isolated: int) -> list[NodeRun]:
    """Every node of the run, node 0 first; the last ``isolated`` are the isolated ones."""
    readies = sorted(log_dir.glob("node*.ready"), key=lambda p: int(p.stem[4:]))
    runs = []
    for path in readies:
        i, peer = int(path.stem[4:]), str(json.loads(path.read_text())["peer"])
        events = read_events(log_dir / peer[-6:] / "metrics.jsonl")
        start = next((e for e in events if e.get("event") == "start"), {})
        rounds = sorted((e for e in events if e.get("event") == "round"), key=lambda e: int(e["round"]))
        runs.append(NodeRun(i, peer, str(start.get("model", "?")), i >= len(readies) - isolated, rounds))
    return runs


def table(runs: list[NodeRun], window: int) -> str:
    """One row per node and one per role (mean over its nodes)."""
    head = (
        "| node | model | role | rounds | cumulative reward | mean reward, first / last "
        f"{window} rounds | external groups / round | trained (informative) / round | median round |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]

    def row(name: str, model: str, role: str, group: list[NodeRun]) -> str:
        n = min(len(r.rounds) for r in group)
        cum = statistics.fmean(sum(r.rewards[:n]) for r in group)
        first = statistics.fmean(statistics.fmean(r.rewards[:window]) for r in group)
        last = statistics.fmean(statistics.fmean(r.rewards[n - window : n]) for r in group)
        ext = statistics.fmean(r.per_round("external_groups") for r in group)
        trained = statistics.fmean(r.per_round("trained_groups") for r in group)
        med = statistics.median(float(x["round_s"]) for r in group for x in r.rounds)
        return (
            f"| {name} | {model} | {role} | {n} | {cum:.2f} | {first:.3f} / {last:.3f} | {ext:.2f} | "
            f"{trained:.2f} | {med:.1f} s |"
        )

    for r in runs:
        lines.append(row(f"node{r.index} ({r.peer[-6:]})", r.model, "isolated" if r.isolated else "shares", [r]))
    for role, group in (("shares", [r for r in runs if not r.isolated]), ("isolated", [r for r in runs if r.isolated])):
        if group:
            lines.append(row(f"**mean, {role}**", "", role, group))
    return "\n".join(lines)


def plot(runs: list[NodeRun], path: Path, window: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in runs:
        style = "--" if r.isolated else "-"
        label = f"node{r.index} ({'isolated' if r.isolated else 'shares'})"
        xs = [int(x["round"]) for x in r.rounds]
        ax1.plot(xs, smooth(r.rewards, window), style, label=label)
        cum, acc = [], 0.0
        for v in r.rewards:
            acc += v
            cum.append(acc)
        ax2.plot(xs, cum, style, label=label)
    ax1.set(xlabel="round", ylabel=f"mean local reward (moving average, {window} rounds)", title=title)
    ax2.set(xlabel="round", ylabel="cumulative reward", title="cumulative reward per node")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log_dir", type=Path, help="the --log-dir of the local run")
    p.add_argument("--isolated", type=int, default=0, help="the run's --isolated K (its last K nodes)")
    p.add_argument("--window", type=int, default=10, help="rounds in the moving average and first/last means")
    p.add_argument("--png", type=Path, default=None, help="write the reward curves here")
    p.add_argument("--title", default="", help="title of the reward panel")
    args = p.parse_args()
    runs = load(args.log_dir, args.isolated)
    if not runs or any(not r.rounds for r in runs):
        raise SystemExit(f"{args.log_dir}: no node has finished a round yet; wait, or check the --log-dir")
    print(table(runs, args.window))
    if args.png:
        plot(runs, args.png, args.window, args.title)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
