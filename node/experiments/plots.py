"""PNG plots of an experiment (matplotlib, Agg backend: no display needed).

- ``reward_curves.png``: mean local reward per round for each split (averaged
  over nodes, smoothed with a trailing moving average), a band of ± one standard
  deviation over seeds; one panel per external sampling policy.
- ``cumulative.png``: cumulative reward per split with error bars over seeds,
  side by side for each sampling policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from node.experiments.results import SplitSummary, smooth, smooth_sparse

logger = logging.getLogger(__name__)


def _samplings(summaries: Sequence[SplitSummary]) -> list[str]:
    return list(dict.fromkeys(s.sampling for s in summaries))


def _splits(summaries: Sequence[SplitSummary]) -> list[str]:
    return list(dict.fromkeys(s.split for s in summaries))


def plot_reward_curves(summaries: Sequence[SplitSummary], path: Path, window: int = 10, title: str = "") -> Path:
    """Mean reward vs round per split, band over seeds; one panel per sampling policy."""
    samplings = _samplings(summaries)
    colours = {sp: f"C{i}" for i, sp in enumerate(_splits(summaries))}
    cols = min(len(samplings), 3)
    rows = -(-len(samplings) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(samplings) :]:
        ax.set_visible(False)
    for ax, sampling in zip(axes.flat, samplings, strict=False):
        for s in (s for s in summaries if s.sampling == sampling):
            mean = smooth(s.curve_mean, window)
            std = smooth(s.curve_std, window)
            x = list(range(1, len(mean) + 1))
            label = f"{s.split} (cum. {s.cumulative_mean:.1f} ± {s.cumulative_std:.1f})"
            ax.plot(x, mean, color=colours[s.split], label=label, linewidth=1.6)
            if s.seeds > 1:
                lo = [m - d for m, d in zip(mean, std, strict=True)]
                hi = [m + d for m, d in zip(mean, std, strict=True)]
                ax.fill_between(x, lo, hi, color=colours[s.split], alpha=0.18, linewidth=0)
        ax.set_title(f"external sampling: {sampling}")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(title="local/external", fontsize=8)
    for row in axes:
        row[0].set_ylabel(f"mean local reward (moving avg {window})")
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_cumulative(summaries: Sequence[SplitSummary], path: Path, title: str = "") -> Path:
    """Bar chart: cumulative reward per split (mean ± std over seeds), grouped by sampling policy."""
    samplings = _samplings(summaries)
    splits = _splits(summaries)
    width = 0.8 / max(len(samplings), 1)
    fig, ax = plt.subplots(figsize=(1.6 * len(splits) + 3, 4))
    for k, sampling in enumerate(samplings):
        rows = {s.split: s for s in summaries if s.sampling == sampling}
        xs = [i + (k - (len(samplings) - 1) / 2) * width for i, sp in enumerate(splits) if sp in rows]
        present = [sp for sp in splits if sp in rows]
        means = [rows[sp].cumulative_mean for sp in present]
        stds = [rows[sp].cumulative_std for sp in present]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=sampling, color=f"C{k}", alpha=0.85)
    ax.set_xticks(range(len(splits)), splits)
    ax.set_xlabel("split: local / external groups per round")
    ax.set_ylabel("cumulative reward (sum over rounds, mean over nodes)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="sampling")
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


SOURCE_PANELS = {
    "token_logp_external": "external completions: log-prob / token here",
    "grad_share_external": "external share of the gradient norm",
    "grad_cos": "cos(local, external gradient)",
}


def plot_sources(summaries: Sequence[SplitSummary], path: Path, window: int = 10, title: str = "") -> Path:
    """What training used, per round, for every (policy, split) with diagnostics: one panel per quantity.

    The first panel also shows the log-probability of the node's *own* completions (dashed, one line:
    it hardly depends on the policy), the yardstick for how improbable peers' completions are here.
    """
    shown = [s for s in summaries if s.diagnostic_curves]
    fig, axes = plt.subplots(1, len(SOURCE_PANELS), figsize=(6.0 * len(SOURCE_PANELS), 4.4), squeeze=False)
    for ax, (key, name) in zip(axes[0], SOURCE_PANELS.items(), strict=True):
        for k, s in enumerate(shown):
            curve = s.diagnostic_curves.get(key, [])
            if curve:
                line = smooth_sparse(curve, window)
                ax.plot(range(1, len(line) + 1), line, color=f"C{k}", label=f"{s.sampling} {s.split}")
        if key == "token_logp_external" and shown and shown[0].diagnostic_curves.get("token_logp_local"):
            local = smooth_sparse(shown[0].diagnostic_curves["token_logp_local"], window)
            ax.plot(range(1, len(local) + 1), local, color="black", linestyle="--", label="own completions")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write the PNG and free the figure (matplotlib keeps figures alive otherwise)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    logger.info("wrote %s", path)
    return path
