"""Held-out results per architecture: in a swarm of different models the swarm mean can hide one that loses.

For each configuration and each model, over seeds: the held-out greedy accuracy and sampled reward after the
last round (the mean over that model's nodes in a run), each as a ratio to the same model in the baseline
run of the same seed (the mean over seeds of those per-seed ratios), and the peers' groups it trained on
per round. A pure function of the loaded runs, printed by ``swarm-node experiment`` when its nodes run more
than one model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from node.experiments.results import RunResult, paired_t_p


@dataclass(frozen=True)
class ModelHeldout:
    """One model's held-out outcome in one configuration, over the seeds paired with the baseline."""

    label: str
    split: str
    model: str
    seeds: int
    greedy: float
    sampled: float | None
    greedy_ratio: float | None
    sampled_ratio: float | None
    greedy_p: float | None
    external_per_round: float


def _finals(run: RunResult, model: str) -> tuple[float, float | None, float] | None:
    """(greedy, sampled, peers' groups per round) of ``model``'s nodes in ``run``, None without evaluations."""
    nodes = [n for n in run.nodes if n.model == model and n.heldout]
    if not nodes:
        return None
    greedy = statistics.fmean(n.heldout[-1][1] for n in nodes)
    rewards = [n.heldout_reward[-1][1] for n in nodes if n.heldout_reward]
    external = statistics.fmean(n.external_groups / max(len(n.curve), 1) for n in nodes)
    return greedy, statistics.fmean(rewards) if len(rewards) == len(nodes) else None, external


def _ratio(values: Sequence[tuple[float, float]]) -> float | None:
    pairs = [(v, b) for v, b in values if b > 0]
    return statistics.fmean(v / b for v, b in pairs) if pairs else None


def per_model_heldout(runs: Sequence[RunResult], baseline: tuple[str, str]) -> list[ModelHeldout]:
    """Each (label, split, model)'s held-out outcome against the ``baseline`` (label, split) run of its seed."""
    base = {r.seed: r for r in runs if (r.sampling, r.split) == baseline}
    models = sorted({n.model for r in runs for n in r.nodes})
    out: list[ModelHeldout] = []
    for label, split in dict.fromkeys((r.sampling, r.split) for r in runs):
        mine = [r for r in runs if (r.sampling, r.split) == (label, split)]
        for model in models:
            got = []
            for r in mine:
                if (finals := _finals(r, model)) is not None:
                    got.append((finals, _finals(base[r.seed], model) if r.seed in base else None))
            if got:
                out.append(_summary(label, split, model, got))
    return out


Finals = tuple[float, float | None, float]


def _summary(label: str, split: str, model: str, got: Sequence[tuple[Finals, Finals | None]]) -> ModelHeldout:
    paired = [(f, b) for f, b in got if b is not None]
    sampled = [f[1] for f, _ in got if f[1] is not None]
    return ModelHeldout(
        label, split, model, len(got),
        greedy=statistics.fmean(f[0] for f, _ in got),
        sampled=statistics.fmean(sampled) if len(sampled) == len(got) else None,
        greedy_ratio=_ratio([(f[0], b[0]) for f, b in paired]),
        sampled_ratio=_ratio([(f[1], b[1]) for f, b in paired if f[1] is not None and b[1] is not None]),
        greedy_p=paired_t_p([f[0] - b[0] for f, b in paired]),
        external_per_round=statistics.fmean(f[2] for f, _ in got),
    )  # fmt: skip


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def per_model_table(rows: Sequence[ModelHeldout]) -> str:
    """Markdown: one line per configuration and model, its finals and its ratios to the baseline's same model."""
    head = (
        "| configuration | split | model | n (seeds) | greedy final | sampled final | greedy vs baseline | p "
        "| sampled vs baseline | peers' groups / round |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"| {r.label} | {r.split} | {r.model} | {r.seeds} | {_num(r.greedy)} | {_num(r.sampled)} | "
        f"{_num(r.greedy_ratio)} | {_num(r.greedy_p)} | {_num(r.sampled_ratio)} | {_num(r.external_per_round, 2)} |"
        for r in rows
    ]
    return "\n".join([head, *lines])
