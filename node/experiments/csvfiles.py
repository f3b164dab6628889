"""An experiment's numbers as CSV beside ``results.json``: one long table of every measurement, one per table.

``results.csv`` is in long format (one value per row, named by its run, node, round and metric), the shape
pandas, R and spreadsheets pivot from; ``summary.csv``, ``heldout.csv`` and ``paired.csv`` hold the rows of
the tables ``results.md`` prints, one column per table column, with the number of seeds (``n``) in each.
Numbers are written at full precision, so a reader gets what ``results.json`` holds. Every function here
is a pure function of the aggregated results and returns the file's text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from node.experiments.learning import HeldoutSummary
from node.experiments.results import DIAGNOSTICS, NodeResult, PairedTest, RunResult, SplitSummary, sync_of

LONG_COLUMNS = (
    "run", "label", "sampling", "objective", "sync", "split", "local", "external", "seed", "model", "node",
    "round", "metric", "value",
)  # fmt: skip
"""The columns of ``results.csv``; ``round`` is empty for a node's totals, ``node`` and ``model`` for a run's."""

METRICS = {"reward": "per round: the node's mean reward on its own completions"}
METRICS |= {key: f"per round, a diagnostic: {text}" for key, text in DIAGNOSTICS.items()}
METRICS |= {
    "heldout_accuracy": "per evaluation: greedy accuracy on the held-out questions (round 0: before training)",
    "heldout_sample_reward": "per evaluation: mean reward of sampled completions on the held-out questions",
    "cumulative_reward": "per node: sum over rounds of its reward; per run (no node): the mean over its nodes",
    "external_groups": "per node: peers' groups taken over the run",
    "trained_groups": "per node: groups with signal trained on over the run",
    "fetch_failed": "per node: peer batches that could not be fetched",
    "rejected": "per node: peer completions refused",
    "round_s_mean": "per node: mean seconds per round",
    "cpu_s": "per node: CPU seconds the node process used",
    "wall_s": "per run: seconds the run took",
}
"""What each ``metric`` of ``results.csv`` means."""


def csv_text(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """CSV with a header line; a missing or None cell is empty, a float keeps every digit (``repr``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return buf.getvalue()


def label_parts(label: str) -> dict[str, str]:
    """A policy label's sampling policy, objective and sync setting (see :class:`node.experiments.sweep.Run`).

    >>> label_parts("advantage+baseline+tis+sync10")
    {'sampling': 'advantage', 'objective': 'baseline+tis', 'sync': 'sync10'}
    """
    sync = sync_of(label)
    sampling, _, objective = label.removesuffix(sync).partition("+")
    return {"sampling": sampling, "objective": objective or "plain", "sync": sync.removeprefix("+")}


def _run_id(run: RunResult) -> dict[str, Any]:
    local, _, external = run.split.partition("/")
    name = f"runs/{run.sampling}/{local}-{external}/seed{run.seed}"  # the run's folder, as the sweep names it
    out: dict[str, Any] = {"run": name, "label": run.sampling, **label_parts(run.sampling), "split": run.split}
    return out | {"local": local, "external": external, "seed": run.seed}


def _node_rows(base: dict[str, Any], n: NodeResult) -> Iterable[dict[str, Any]]:
    node = base | {"model": n.model, "node": n.peer}
    for i, value in enumerate(n.curve, 1):
        yield node | {"round": i, "metric": "reward", "value": value}
    for key in DIAGNOSTICS:
        for i, maybe in enumerate(n.diagnostic_curves.get(key, ()), 1):
            if maybe is not None:
                yield node | {"round": i, "metric": key, "value": maybe}
    for metric, series in (("heldout_accuracy", n.heldout), ("heldout_sample_reward", n.heldout_reward)):
        for rnd, value in series:
            yield node | {"round": rnd, "metric": metric, "value": value}
    totals = {"cumulative_reward": n.cumulative, "external_groups": n.external_groups}
    totals |= {"trained_groups": n.trained_groups, "fetch_failed": n.fetch_failed, "rejected": n.rejected}
    totals |= {"round_s_mean": n.round_s, "cpu_s": n.cpu_s}
    for metric, value in totals.items():
        yield node | {"metric": metric, "value": value}


def long_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Every measurement of every run, one row each: per node and round, per evaluation, per node and per run."""
    rows: list[dict[str, Any]] = []
    for run in results:
        base = _run_id(run)
        for n in run.nodes:
            rows += _node_rows(base, n)
        rows += [base | {"metric": "cumulative_reward", "value": run.cumulative}]
        rows += [base | {"metric": "wall_s", "value": run.wall_s}]
    return rows


SUMMARY_COLUMNS = (
    "label", "sampling", "objective", "sync", "split", "n", "cumulative_mean", "cumulative_std", "ratio_vs_no_sharing",
    "final_reward", "external_per_node_round", "trained_per_node_round", "fetch_failed", "rejected",
    "equal_compute",
)  # fmt: skip


def summary_rows(summaries: Sequence[SplitSummary], reference_splits: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rows of the training-reward table; the spread is empty where one seed (n = 1) has none."""
    return [_summary_row(s, s.split not in reference_splits) for s in summaries]


def _summary_row(s: SplitSummary, equal_compute: bool) -> dict[str, Any]:
    return {
        "label": s.sampling, **label_parts(s.sampling), "split": s.split, "n": s.seeds,
        "cumulative_mean": s.cumulative_mean, "cumulative_std": s.cumulative_std if s.seeds > 1 else None,
        "ratio_vs_no_sharing": s.ratio, "final_reward": s.final_reward,
        "external_per_node_round": s.external_per_round, "trained_per_node_round": s.trained_per_round,
        "fetch_failed": s.fetch_failed, "rejected": s.rejected, "equal_compute": equal_compute,
    }  # fmt: skip


HELDOUT_COLUMNS = (
    "label", "sampling", "objective", "sync", "split", "n", "baseline", "primary", "start", "final_mean",
    "final_std", "n_paired", "mean_ratio", "t_p", "sign_p", "reach_share_mean", "reached_seeds", "reward_per_cpu_s",
)  # fmt: skip


def heldout_rows(
    learned: Sequence[HeldoutSummary], baseline: tuple[str, str], primary: str = ""
) -> list[dict[str, Any]]:
    """The rows of the held-out table (``reach_share_mean``: over the seeds that reach the baseline's final)."""
    return [_heldout_row(h, (h.label, h.split) == baseline, primary == f"{h.label}:{h.split}") for h in learned]


def _heldout_row(h: HeldoutSummary, is_baseline: bool, is_primary: bool) -> dict[str, Any]:
    got = [x for x in h.reach if x is not None]
    return {
        "label": h.label, **label_parts(h.label), "split": h.split, "n": len(h.seeds), "baseline": is_baseline,
        "primary": is_primary, "start": h.start, "final_mean": h.final,
        "final_std": h.final_std if len(h.seeds) > 1 else None, "n_paired": len(h.ratios),
        "mean_ratio": h.mean_ratio, "t_p": h.t_p, "sign_p": h.sign_p,
        "reach_share_mean": sum(got) / len(got) if got else None, "reached_seeds": len(got),
        "reward_per_cpu_s": h.reward_per_cpu_s,
    }  # fmt: skip


PAIRED_COLUMNS = (
    "label", "sampling", "objective", "sync", "split", "seed", "ratio", "n", "mean_ratio", "t_p", "sign_p",
)  # fmt: skip


def paired_rows(tests: Sequence[PairedTest]) -> list[dict[str, Any]]:
    """One row per seed of each paired comparison, with the comparison's mean ratio and p-values beside it."""
    rows = []
    for t in tests:
        same = {"label": t.sampling, **label_parts(t.sampling), "split": t.split, "n": len(t.seeds)}
        same |= {"mean_ratio": t.mean_ratio, "t_p": t.t_p, "sign_p": t.sign_p}
        rows += [same | {"seed": seed, "ratio": ratio} for seed, ratio in zip(t.seeds, t.ratios, strict=True)]
    return rows
