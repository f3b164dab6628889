"""``swarm-node demo``: the same four nodes trained alone and as a swarm, side by side, in about three minutes.

Both swarms run at once on this machine, each node paced to the same round length, so the two arms share
the CPU evenly and every node trains on the same number of its own groups (equal compute). The only
difference is the outer sync: the swarm's nodes average their weights every round. The configuration is
the one the project's results say teaches best between copies of one model (docs/EXPERIMENTS.md,
"Averaging every round"); the demo's one seed shows the effect, it does not measure its noise.

It ends in one table (each node's held-out accuracy alone and in the swarm, and the ratio), a plot of
both learning curves, and the same as CSV, all under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from node.cli.errors import CliError
from node.cli.flags import add_option_flags
from node.core.options import DASHBOARD, option

DEMO = "demo"
PROGRESS_EVERY_S = 15.0


@dataclass
class DemoOptions:
    """What a user may change about the demo; everything else is the preset in :func:`demo_config`."""

    rounds: int = option(80, "rounds per node in each arm", group=DEMO, min=10, max=2000)
    seed: int = option(1000, "seed of the first node (node i adds i; both arms use the same seeds)", group=DEMO)
    round_s: float = option(
        1.5, "every round of both arms lasts at least this long (s), so the swarm's sync keeps up as it would "
        "beside a real model's generation", group=DEMO, above=0, max=60,
    )  # fmt: skip
    out: str = option("runs/demo", "results folder (a second run starts over)", group=DEMO)
    dashboard_port: int | None = option(8765, "dashboard port (0: any)", group=DASHBOARD, min=0, max=65535)
    no_dashboard: bool = option(False, "do not serve the dashboard", group=DASHBOARD)


def add_demo_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to the subparsers of ``swarm-node``; its flags come from :class:`DemoOptions`."""
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="train 4 nodes alone and as a swarm side by side (~3 min) and compare them"
    )
    add_option_flags(p, DemoOptions)
    return p


def demo_config(opts: DemoOptions) -> Any:
    """The experiment both arms run: 4 ``tiny-m`` nodes, lr 6e-4 from a 20-step warm start, held-out every 10
    rounds; ``sync_every`` 0 (alone) and 1 (averaging every round, plain average)."""
    from node.experiments.config import ExperimentConfig

    return ExperimentConfig(
        nodes=4, models=("tiny-m",), splits=("8/0",), seeds=1, seed_base=opts.seed, rounds=opts.rounds,
        sync_every=(0, 1), outer_lr=1.0, outer_momentum=0.0, learning_rate=6e-4, warm_start_steps=20,
        tasks=("max", "min"), eval_every=10, min_generate_s=opts.round_s, out=opts.out, progress=False,
    )  # fmt: skip


Points = tuple[tuple[int, float], ...]
MEASURES = {"reward": "held-out sampled reward", "accuracy": "held-out greedy accuracy"}
"""What the demo compares. The sampled reward (4 samples per question) leads: it is what GRPO optimises and
the measure on which alone's better rate is the demo's 6e-4; greedy accuracy moves in steps (a node alone
does better on it at 3e-4), so it is shown beside, not judged."""


@dataclass(frozen=True)
class NodePair:
    """One node's held-out curves alone and in the swarm, by measure: ``(round, value)`` points."""

    index: int
    alone: dict[str, Points]
    swarm: dict[str, Points]

    def ratio(self, measure: str) -> float | None:
        """Final value in the swarm over alone (None without both finals, or alone at 0)."""
        a, s = self.alone.get(measure, ()), self.swarm.get(measure, ())
        if not a or not s or a[-1][1] <= 0:
            return None
        return s[-1][1] / a[-1][1]


def _curves(node: Any) -> dict[str, Points]:
    return {"reward": tuple(node.heldout_reward), "accuracy": tuple(node.heldout)}


def pair_nodes(alone: dict[int, Any], swarm: dict[int, Any]) -> list[NodePair]:
    """Pair node i of one arm with node i of the other (same seed); ``NodeResult`` values by index."""
    return [NodePair(i, _curves(alone[i]), _curves(swarm[i])) for i in sorted(alone.keys() & swarm.keys())]


def mean_final(pairs: list[NodePair], arm: str, measure: str) -> float | None:
    """Mean final value of a measure in an arm, over the nodes that have one."""
    finals = [c[-1][1] for p in pairs if (c := getattr(p, arm).get(measure))]
    return sum(finals) / len(finals) if finals else None


def _cells(a: float | None, s: float | None) -> list[str]:
    ratio = f"{s / a:.2f}x" if a is not None and s is not None and a > 0 else "-"
    return ["-" if a is None else f"{a:.3f}", "-" if s is None else f"{s:.3f}", ratio]


def demo_table(pairs: list[NodePair]) -> str:
    """Markdown: per node and for the mean, each measure's final alone, in the swarm, and the ratio."""
    head = ["node"] + [
        c for m in MEASURES for c in (f"{MEASURES[m].removeprefix('held-out ')}, alone", "swarm", "ratio")
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in pairs:
        cells = [str(p.index)]
        for m in MEASURES:
            a, s = p.alone.get(m, ()), p.swarm.get(m, ())
            cells += _cells(a[-1][1] if a else None, s[-1][1] if s else None)
        lines.append("| " + " | ".join(cells) + " |")
    means = ["**mean**"] + [
        f"**{c}**" for m in MEASURES for c in _cells(*(mean_final(pairs, arm, m) for arm in ("alone", "swarm")))
    ]
    lines.append("| " + " | ".join(means) + " |")
    first = pairs[0].alone if pairs else {}
    if first.get("reward") and first.get("accuracy"):
        r0, a0 = first["reward"][0], first["accuracy"][0]
        lines.append(
            f"\nBoth arms start from the same weights (round {r0[0]}: {r0[1]:.3f} sampled reward, {a0[1]:.3f} greedy)."
        )
    return "\n".join(lines)


def verdict(pairs: list[NodePair]) -> str:
    """One honest sentence about what this run shows (one seed: an illustration, not a measurement)."""
    a, s = (mean_final(pairs, arm, "reward") for arm in ("alone", "swarm"))
    if a is None or s is None or a <= 0:
        return "The run ended without a held-out evaluation in both arms; see the node logs under the results folder."
    better = sum(1 for p in pairs if (r := p.ratio("reward")) is not None and r > 1)
    return (
        f"The swarm's nodes ended at {s / a:.2f}x the held-out sampled reward of the same nodes alone ({better} of "
        f"{len(pairs)} nodes better), at equal compute, on one seed. One seed shows the effect, not its noise: the "
        "project's multi-seed measurement of this setting is in docs/EXPERIMENTS.md."
    )


def demo_csv(pairs: list[NodePair]) -> str:
    """Long-format CSV of both arms' held-out curves: ``arm,node,measure,round,value``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arm", "node", "measure", "round", "value"])
    for p in pairs:
        for arm in ("alone", "swarm"):
            for measure, points in getattr(p, arm).items():
                w.writerows([arm, p.index, measure, rnd, f"{v:.6f}"] for rnd, v in points)
    return buf.getvalue()


def _mean_curve(curves: list[Points]) -> tuple[list[int], list[float]]:
    by_round: dict[int, list[float]] = {}
    for c in curves:
        for r, v in c:
            by_round.setdefault(r, []).append(v)
    rounds = sorted(by_round)
    return rounds, [sum(by_round[r]) / len(by_round[r]) for r in rounds]


def plot_demo(pairs: list[NodePair], path: Path) -> Path:
    """One panel per measure against rounds: each node thin, the mean of each arm thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MEASURES), figsize=(11, 4.2))
    for ax, (measure, name) in zip(axes, MEASURES.items(), strict=True):
        for arm, color in (("alone", "tab:gray"), ("swarm", "tab:blue")):
            curves = [c for p in pairs if (c := getattr(p, arm).get(measure))]
            for c in curves:
                ax.plot([r for r, _ in c], [v for _, v in c], color=color, alpha=0.3, lw=1)
            ax.plot(*_mean_curve(curves), color=color, lw=2.5, label=f"{arm} (mean of {len(curves)} nodes)")
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.legend()
    fig.suptitle("The same nodes alone and in a swarm (equal compute, one seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _by_index(run_dir: Path, result: Any) -> dict[int, Any]:
    """A run's node results keyed by node index (``node<i>.ready`` names each index's peer)."""
    import json

    peers = {}
    for ready in run_dir.glob("node*.ready"):
        peers[json.loads(ready.read_text())["peer"]] = int(ready.stem.removeprefix("node"))
    return {peers[n.peer]: n for n in result.nodes if n.peer in peers}


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _run_both(cfg: Any, runs: list[Any], out: Path) -> dict[str, Any]:
    """Start both arms' ``swarm-node local`` at once, print progress every 15 s, stop both on any exit; the
    finished arms' results by label (an arm that failed is missing)."""
    from node.experiments.results import load_run
    from node.experiments.sweep import local_command, rounds_done, stop_local

    procs: dict[str, subprocess.Popen[bytes]] = {}
    t0 = last = time.monotonic()
    try:
        for run in runs:
            run_dir = out / run.name
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            with open(run_dir / "local.log", "wb") as log:
                cmd = local_command(cfg, run, run_dir)
                procs[run.label] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while any(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                shown = ", ".join(f"{_arm(r)} {rounds_done(out / r.name)}/{cfg.nodes * cfg.rounds}" for r in runs)
                print(f"  node-rounds: {shown}", flush=True)
    finally:
        for p in procs.values():
            stop_local(p)
    wall = time.monotonic() - t0
    results = {r.label: load_run(out / r.name, r.label, r.split, r.seed, wall) for r in runs}
    return {k: v for k, v in results.items() if procs[k].returncode == 0 and len(v.nodes) == cfg.nodes}


def _arm(run: Any) -> str:
    return "swarm" if run.sync_every else "alone"


def _start_dashboard(opts: DemoOptions, dirs: list[Path]) -> Any:
    """One dashboard over both arms' nodes; a busy port falls back to a free one."""
    if opts.no_dashboard or opts.dashboard_port is None:
        return None
    from node.dashboard.data import SwarmView
    from node.dashboard.server import Dashboard, DashboardConfig

    view = SwarmView(
        "demo: 4 nodes alone and 4 as a swarm", lambda: [p for d in dirs for p in sorted(d.glob("*/metrics.jsonl"))]
    )
    dash = Dashboard(view, DashboardConfig(port=opts.dashboard_port))
    try:
        print(f"swarm-node demo: dashboard at {dash.start(fallback_to_free_port=True)}", flush=True)
    except OSError as e:
        raise CliError(f"cannot serve the dashboard: {e.strerror}; try --no-dashboard") from None
    return dash


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``swarm-node demo``; returns the exit status."""
    from node.experiments.sweep import check_sweep, plan_runs

    opts = DemoOptions(**{k: getattr(args, k) for k in DemoOptions.__dataclass_fields__})
    cfg = demo_config(opts)
    try:
        check_sweep(cfg)
    except ValueError as e:
        raise CliError(str(e)) from None
    out = Path(cfg.out)
    runs = plan_runs(cfg)  # alone first, then the swarm (sync settings in order)
    print(
        f"swarm-node demo: training 4 tiny-m nodes alone and the same 4 as a swarm (averaging every round), "
        f"{opts.rounds} rounds each, side by side; results in {out}/",
        flush=True,
    )
    dash = _start_dashboard(opts, [out / r.name for r in runs])
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a SIGTERM stops both arms, as Ctrl-C does
    t0 = time.monotonic()
    try:
        done = _run_both(cfg, runs, out)
    except KeyboardInterrupt:
        print("\nswarm-node demo: interrupted; both arms stopped", flush=True)
        return 130
    finally:
        if dash is not None:
            dash.close()
    alone_run, swarm_run = runs
    alone, swarm = done.get(alone_run.label), done.get(swarm_run.label)
    if alone is None or swarm is None:
        raise CliError(f"a demo run failed; see local.log in the run folders under {out}/runs")
    pairs = pair_nodes(_by_index(out / alone_run.name, alone), _by_index(out / swarm_run.name, swarm))
    return _report(pairs, out, time.monotonic() - t0)


def _report(pairs: list[NodePair], out: Path, wall_s: float) -> int:
    table, line = demo_table(pairs), verdict(pairs)
    (out / "demo.md").write_text(f"{table}\n\n{line}\n")
    (out / "demo.csv").write_text(demo_csv(pairs))
    plot = plot_demo(pairs, out / "demo.png")
    print(f"\nHeld-out, 128 questions no node trains on, after {wall_s:.0f} s:\n\n{table}\n\n{line}")
    print(f"\nplot: {plot}   table: {out / 'demo.md'}   CSV: {out / 'demo.csv'}")
    return 0
