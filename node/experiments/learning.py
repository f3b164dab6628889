"""What an experiment's nodes learned: held-out accuracy per configuration, paired against the baseline.

Training reward is measured on each node's own question stream, which sharing
changes; held-out accuracy (:mod:`node.training.evaluate`) is measured on one
fixed question set no node trains on, so it compares configurations fairly.
Per configuration (policy label, split) over seeds:

- *start* and *final*: held-out accuracy before the first round and after the
  last, averaged over the run's nodes, then over seeds;
- *ratio*: final over the baseline's final, paired by seed (same initial
  weights and question streams), with a paired t-test and an exact sign-flip
  test;
- *rounds to baseline*: the first evaluated round at which the run's accuracy
  reaches its seed's baseline final accuracy, as a share of the run's rounds
  (a value below 1 means the configuration got there sooner);
- *reward per CPU-second*: cumulative training reward over the CPU seconds
  the node processes used.

Everything here is a pure function of the loaded runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node.experiments.results import RunResult, mean_text, paired_t_p, sign_flip_p, split_order, spread_text


def heldout_curve(run: RunResult) -> list[tuple[int, float]]:
    """(round, accuracy averaged over the nodes) at every round all of the run's nodes evaluated."""
    series = [dict(n.heldout) for n in run.nodes if n.heldout]
    if not series or len(series) != len(run.nodes):
        return []
    common = sorted(set.intersection(*(set(s) for s in series)))
    return [(r, statistics.fmean(s[r] for s in series)) for r in common]


def rounds_to_reach(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first evaluated round (past 0) whose accuracy is at least ``target``; None if none is.

    >>> rounds_to_reach([(0, 0.1), (10, 0.3), (20, 0.5)], 0.3)
    10
    """
    return next((r for r, acc in curve if r > 0 and acc >= target - 1e-12), None)


@dataclass(frozen=True)
class HeldoutSummary:
    """Held-out accuracy of one (policy label, split) over its seeds."""

    label: str
    split: str
    seeds: list[int]
    start: float
    final: float
    final_std: float
    ratios: list[float] = field(default_factory=list)
    mean_ratio: float | None = None
    t_p: float | None = None
    sign_p: float | None = None
    reach: list[float | None] = field(default_factory=list)
    """Per seed: rounds to reach the baseline's final accuracy, as a share of the rounds (None: never)."""
    reward_per_cpu_s: float | None = None
    curve: list[tuple[int, float]] = field(default_factory=list, repr=False)


def summarize_heldout(
    runs: Sequence[RunResult], baseline: tuple[str, str], order: Sequence[str] = ()
) -> list[HeldoutSummary]:
    """One summary per (label, split) with held-out evaluations, each paired with ``baseline`` = (label, split)."""
    groups: dict[tuple[str, str], dict[int, RunResult]] = {}
    for r in runs:
        if heldout_curve(r):
            groups.setdefault((r.sampling, r.split), {})[r.seed] = r
    base = groups.get(baseline, {})
    rank = {name: i for i, name in enumerate(order)}
    keys = sorted(groups, key=lambda k: (rank.get(k[0], len(rank)), k[0], split_order(k[1])))
    return [_summary(k, groups[k], base, k == baseline) for k in keys]


def _summary(
    key: tuple[str, str], by_seed: dict[int, RunResult], base: dict[int, RunResult], is_base: bool
) -> HeldoutSummary:
    seeds = sorted(by_seed)
    curves = {s: heldout_curve(by_seed[s]) for s in seeds}
    finals = [curves[s][-1][1] for s in seeds]
    paired = [s for s in seeds if s in base and not is_base]
    ratios, reach, diffs = [], [], []
    for s in paired:
        last, target = heldout_curve(base[s])[-1]
        ratios.append(curves[s][-1][1] / target if target else math.nan)
        diffs.append(curves[s][-1][1] - target)
        hit = rounds_to_reach(curves[s], target)
        reach.append(None if hit is None else hit / last)
    cpu = sum(n.cpu_s for r in by_seed.values() for n in r.nodes)
    reward = sum(n.cumulative for r in by_seed.values() for n in r.nodes)
    return HeldoutSummary(
        label=key[0], split=key[1], seeds=seeds,
        start=statistics.fmean(curves[s][0][1] for s in seeds),
        final=statistics.fmean(finals), final_std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
        ratios=ratios, mean_ratio=statistics.fmean(ratios) if ratios else None,
        t_p=paired_t_p(diffs) if diffs else None, sign_p=sign_flip_p(diffs) if 1 <= len(diffs) <= 16 else None,
        reach=reach, reward_per_cpu_s=reward / cpu if cpu > 0 else None, curve=_mean_curve(list(curves.values())),
    )  # fmt: skip


def _mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Mean over seeds at the rounds every curve has."""
    common = sorted(set.intersection(*(set(r for r, _ in c) for c in curves))) if curves else []
    maps = [dict(c) for c in curves]
    return [(r, statistics.fmean(m[r] for m in maps)) for r in common]


def _reach_text(reach: Sequence[float | None]) -> str:
    got = [x for x in reach if x is not None]
    if not reach:
        return "-"
    mean = f"{statistics.fmean(got):.2f}" if got else "never"
    return f"{mean} ({len(got)}/{len(reach)} seeds reach it)"


def heldout_table(summaries: Sequence[HeldoutSummary], baseline: tuple[str, str], primary: str = "") -> str:
    """The held-out table in Markdown; the ``primary`` row (``label:split``, declared before the sweep) is marked."""
    head = (
        "| configuration | split | n (seeds) | held-out start | held-out final (mean ± std) | vs baseline per seed "
        "| mean ratio | t-test p | sign-flip p | rounds to baseline's final | reward / CPU-s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        name = s.label + (" **(primary)**" if primary == f"{s.label}:{s.split}" else "")
        if (s.label, s.split) == baseline:
            name += " (baseline)"
        per_seed = ", ".join(f"{x:.2f}" for x in s.ratios) or "-"
        cells = [
            name, s.split, str(len(s.seeds)), f"{s.start:.3f}", spread_text(s.final, s.final_std, len(s.seeds), 3),
            per_seed, "-" if s.mean_ratio is None else mean_text(s.mean_ratio, len(s.ratios)),
            "-" if s.t_p is None else f"{s.t_p:.3f}",
            "-" if s.sign_p is None else f"{s.sign_p:.3f}", _reach_text(s.reach),
            "-" if s.reward_per_cpu_s is None else f"{s.reward_per_cpu_s:.4f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_heldout(summaries: Sequence[HeldoutSummary], path: Path, title: str = "") -> Path:
    """Held-out accuracy against rounds, one line per configuration (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, s in enumerate(summaries):
        xs, ys = [r for r, _ in s.curve], [a for _, a in s.curve]
        ax.plot(xs, ys, marker="o", markersize=3, color=f"C{i % 10}", label=f"{s.label} {s.split} ({s.final:.3f})")
    ax.set_xlabel("round")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
