"""Aggregating experiment runs: cumulative reward per split, mean and spread over seeds, tables.

Everything here except :func:`load_run` is a pure function of its arguments,
so the numbers in ``results.json`` and the Markdown table can be unit-tested
without a network.

Definitions (as in SAPO, arXiv 2509.08721, table 1):

- a node's *reward curve* is its ``reward_mean`` per round: the mean reward of
  the completions it generated itself that round (external groups do not count);
- a run's *cumulative reward* is the sum over rounds of each node's curve,
  averaged over the nodes of the run;
- a split's cumulative reward is the mean (and sample standard deviation) of
  its runs' cumulative rewards over seeds; its *ratio* divides that mean by the
  mean of the no-sharing split (J = 0) run with the same sampling policy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from node.observe.metrics import read_events

SAPO_REFERENCE: dict[str, float] = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
"""The cumulative reward per local/external split that the SAPO paper reports (8 nodes, Qwen2.5-0.5B, 2000
rounds): the paper's numbers, shown as a footnote beside the measured ones, never as a measurement."""


@dataclass(frozen=True)
class NodeResult:
    """One node's outcome in one run."""

    peer: str
    model: str
    curve: tuple[float, ...]
    external_groups: int = 0
    trained_groups: int = 0
    fetch_failed: int = 0
    rejected: int = 0
    round_s: float = 0.0
    diagnostics: dict[str, float] = field(default_factory=dict)
    diagnostic_curves: dict[str, list[float | None]] = field(default_factory=dict)
    heldout: tuple[tuple[int, float], ...] = ()
    """(round, greedy held-out accuracy) of each evaluation (round 0: before training)."""
    heldout_reward: tuple[tuple[int, float], ...] = ()
    """(round, mean reward of sampled completions on the held-out questions)."""
    cpu_s: float = 0.0
    """CPU seconds the node process used (user + system), 0 where its summary is missing."""
    eval_items: int = 0
    """Questions in the node's largest held-out evaluation (0: none): accuracy moves in steps of 1/eval_items."""

    @property
    def cumulative(self) -> float:
        """Sum over rounds of this node's local reward."""
        return math.fsum(self.curve)


@dataclass(frozen=True)
class RunResult:
    """One swarm run: a (sampling policy, split, seed) configuration."""

    sampling: str
    split: str
    seed: int
    nodes: tuple[NodeResult, ...]
    wall_s: float = 0.0

    @property
    def cumulative(self) -> float:
        """Cumulative reward of the run: per-node sums averaged over nodes."""
        return statistics.fmean(n.cumulative for n in self.nodes)

    def mean_curve(self) -> list[float]:
        """Reward per round averaged over nodes (over the rounds every node reached)."""
        return mean_curves([n.curve for n in self.nodes])

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, with the derived cumulative rewards included."""
        out = asdict(self)
        out["cumulative"] = self.cumulative
        for node, raw in zip(self.nodes, out["nodes"], strict=True):
            raw["cumulative"] = node.cumulative
        return out


def mean_curves(curves: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise mean of curves, truncated to the shortest one.

    >>> mean_curves([[0.0, 1.0, 1.0], [1.0, 0.0]])
    [0.5, 0.5]
    """
    if not curves:
        return []
    length = min(len(c) for c in curves)
    return [statistics.fmean(c[i] for c in curves) for i in range(length)]


def std_curves(curves: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise sample standard deviation (0 where only one curve)."""
    if len(curves) < 2:
        return [0.0] * (min(len(c) for c in curves) if curves else 0)
    length = min(len(c) for c in curves)
    return [statistics.stdev(c[i] for c in curves) for i in range(length)]


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` values (shorter at the start).

    >>> smooth([0.0, 1.0, 2.0, 3.0], 2)
    [0.0, 0.5, 1.5, 2.5]
    """
    if window < 1:
        raise ValueError("window must be >= 1")
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def smooth_sparse(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` values that skips NaN (NaN where the window has none).

    >>> smooth_sparse([1.0, math.nan, 3.0, math.nan], 2)
    [1.0, 1.0, 3.0, 3.0]
    """
    out = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(statistics.fmean(seen) if seen else math.nan)
    return out


def split_key(local: int, external: int) -> str:
    """The display name of a split: ``"I/J"``."""
    return f"{local}/{external}"


def parse_split(text: str) -> tuple[int, int]:
    """``"6/2"`` -> (6, 2); raises ValueError with a one-line reason."""
    left, sep, right = text.strip().partition("/")
    if not sep or not left.strip().isdigit() or not right.strip().isdigit():
        raise ValueError(f"split {text!r} is not LOCAL/EXTERNAL, e.g. 6/2")
    return int(left), int(right)


@dataclass(frozen=True)
class SplitSummary:
    """Cumulative reward of one (sampling, split) over its seeds."""

    sampling: str
    split: str
    seeds: int
    cumulative_mean: float
    cumulative_std: float
    ratio: float | None
    final_reward: float
    external_per_round: float
    trained_per_round: float
    fetch_failed: int
    rejected: int
    curve_mean: list[float] = field(repr=False)
    curve_std: list[float] = field(repr=False)
    per_model: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)
    diagnostic_curves: dict[str, list[float]] = field(default_factory=dict, repr=False)


def _final(curve: Sequence[float], frac: float = 0.1) -> float:
    k = max(1, int(len(curve) * frac))
    return statistics.fmean(curve[-k:]) if curve else 0.0


def _per_model(runs: Sequence[RunResult]) -> dict[str, float]:
    """Model -> cumulative reward of its nodes, averaged over nodes and seeds."""
    by_model: dict[str, list[float]] = {}
    for r in runs:
        for n in r.nodes:
            by_model.setdefault(n.model, []).append(n.cumulative)
    return {m: statistics.fmean(v) for m, v in sorted(by_model.items())}


def summarize_split(runs: Sequence[RunResult], baseline: float | None) -> SplitSummary:
    """Summary of the runs of one (sampling, split); ``baseline`` is the 8/0 mean (or None)."""
    if not runs:
        raise ValueError("need at least one run")
    cums = [r.cumulative for r in runs]
    mean = statistics.fmean(cums)
    curves = [r.mean_curve() for r in runs]
    rounds = sum(len(n.curve) for r in runs for n in r.nodes)
    return SplitSummary(
        sampling=runs[0].sampling,
        split=runs[0].split,
        seeds=len(runs),
        cumulative_mean=mean,
        cumulative_std=statistics.stdev(cums) if len(cums) > 1 else 0.0,
        ratio=mean / baseline if baseline else None,
        final_reward=statistics.fmean(_final(c) for c in curves),
        external_per_round=sum(n.external_groups for r in runs for n in r.nodes) / max(rounds, 1),
        trained_per_round=sum(n.trained_groups for r in runs for n in r.nodes) / max(rounds, 1),
        fetch_failed=sum(n.fetch_failed for r in runs for n in r.nodes),
        rejected=sum(n.rejected for r in runs for n in r.nodes),
        curve_mean=mean_curves(curves),
        curve_std=std_curves(curves),
        per_model=_per_model(runs),
        diagnostics=_mean_diagnostics(runs),
        diagnostic_curves=_mean_diagnostic_curves(runs),
    )


def _mean_diagnostic_curves(runs: Sequence[RunResult]) -> dict[str, list[float]]:
    """Per round, each diagnostic averaged over the nodes and runs that report it that round (NaN: none)."""
    out: dict[str, list[float]] = {}
    for key in DIAGNOSTICS:
        curves = [n.diagnostic_curves[key] for r in runs for n in r.nodes if key in n.diagnostic_curves]
        if not curves:
            continue
        length = max(len(c) for c in curves)
        values: list[list[float]] = [[] for _ in range(length)]
        for c in curves:
            for i, x in enumerate(c):
                if x is not None:
                    values[i].append(x)
        out[key] = [statistics.fmean(v) if v else math.nan for v in values]
    return out


def _mean_diagnostics(runs: Sequence[RunResult]) -> dict[str, float]:
    """Each diagnostic averaged over the nodes (of every run) that report it."""
    values: dict[str, list[float]] = {}
    for r in runs:
        for n in r.nodes:
            for k, v in n.diagnostics.items():
                values.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in sorted(values.items())}


def share_baseline(runs: Sequence[RunResult], samplings: Sequence[str]) -> list[RunResult]:
    """``runs`` plus a copy of every no-sharing (J = 0) run for each policy in ``samplings`` that lacks it.

    Without external groups the sampling policy is never consulted, so the
    experiment runs the J = 0 split once and shows it under every policy.
    """
    out = list(runs)
    have = {(r.sampling, r.split, r.seed) for r in runs}
    for r in runs:
        if parse_split(r.split)[1] != 0:
            continue
        for s in samplings:
            if sync_of(s) == sync_of(r.sampling) and (s, r.split, r.seed) not in have:
                out.append(replace(r, sampling=s))
                have.add((s, r.split, r.seed))
    return out


def sync_of(label: str) -> str:
    """The sync part of a policy label (``"+sync10"`` of ``"advantage+sync10"``, ``"+sync60s"`` of a clock's),
    "" for an unsynced one.

    >>> sync_of("advantage+sync10"), sync_of("advantage+sync60s"), sync_of("advantage+tis")
    ('+sync10', '+sync60s', '')
    """
    last = label.rpartition("+")[2]
    return "+" + last if last.startswith("sync") and last[4:].removesuffix("s").isdigit() else ""


def split_order(split: str) -> tuple[int, int]:
    local, external = parse_split(split)
    return external, -local


def summarize(
    runs: Sequence[RunResult], order: Sequence[str] = (), baseline_split: str | None = None
) -> list[SplitSummary]:
    """One summary per (sampling, split), ordered by sampling (as in ``order``, else by name) then J.

    The ratio of each split is to the no-sharing split (``baseline_split``, else any J = 0 split) of
    the same sampling policy if there is one, else to any such split in ``runs``
    (sampling does not matter without external groups).
    """
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in runs:
        groups.setdefault((r.sampling, r.split), []).append(r)
    baselines: dict[str, float] = {}
    for (sampling, split), rs in groups.items():
        if sync_of(sampling):
            continue  # a synced run's ratio is to the unsynced baseline, like every other row's
        if split == baseline_split or (baseline_split is None and parse_split(split)[1] == 0):
            baselines[sampling] = statistics.fmean(r.cumulative for r in rs)
    fallback = next(iter(baselines.values()), None)
    rank = {name: i for i, name in enumerate(order)}
    keys = sorted(groups, key=lambda k: (rank.get(k[0], len(rank)), k[0], split_order(k[1])))
    return [summarize_split(groups[k], baselines.get(k[0], fallback)) for k in keys]


def markdown_table(
    summaries: Sequence[SplitSummary],
    reference: Mapping[str, float] = SAPO_REFERENCE,
    reference_splits: Sequence[str] = (),
) -> str:
    """The results table: cumulative reward (mean ± std over n seeds), ratio to 8/0; then SAPO's reported numbers
    as a footnote, apart from the measured ones.

    Splits in ``reference_splits`` (more local data, e.g. 16/0) are marked as not equal compute.
    """
    head = "| sampling | split I/J | n (seeds) | cumulative reward (mean ± std) | vs no sharing | final reward "
    head += "| external / node-round | trained (informative) / node-round | fetch failed | rejected |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        ratio = "-" if s.ratio is None else f"{s.ratio:.2f}x ({(s.ratio - 1) * 100:+.0f}%)"
        split = f"{s.split} (not equal compute)" if s.split in reference_splits else s.split
        lines.append(
            f"| {s.sampling} | {split} | {s.seeds} | {spread_text(s.cumulative_mean, s.cumulative_std, s.seeds)} "
            f"| {ratio} | {s.final_reward:.3f} | {s.external_per_round:.2f} | {s.trained_per_round:.2f} "
            f"| {s.fetch_failed} | {s.rejected} |"
        )
    note = sapo_footnote([s.split for s in summaries], reference)
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def sapo_footnote(splits: Sequence[str], reference: Mapping[str, float] = SAPO_REFERENCE) -> str:
    """One line with the SAPO paper's reported cumulative reward for the ``splits`` it has ("" for none of them):
    the paper's numbers, never measured here, so they stay out of the table's columns.

    >>> sapo_footnote(["8/0", "4/4", "16/0"])[:60]
    'SAPO paper reports (arXiv 2509.08721, table 1; not measured '
    """
    base = reference.get("8/0")
    shown = [s for s in dict.fromkeys(splits) if s in reference]
    if not shown or not base:
        return ""
    cells = ", ".join(f"{s} {reference[s]:.2f} ({reference[s] / base:.2f}x)" for s in shown)
    return (
        "SAPO paper reports (arXiv 2509.08721, table 1; not measured here: 8 nodes of Qwen2.5-0.5B, 2000 rounds) "
        f"a cumulative reward of {cells}."
    )


NO_SPREAD = "(n=1, no spread)"
"""What a cell shows instead of "± 0.000" when one seed measured it: one run has no spread to report."""

ONE_SEED_WARNING = (
    "One seed per configuration gives no noise estimate: a difference between rows may be run-to-run noise; "
    "rerun with --seeds 3 or more to measure it."
)


def spread_text(mean: float, std: float, n: int, digits: int = 2) -> str:
    """``mean ± std`` over ``n`` seeds, or the mean marked :data:`NO_SPREAD` when ``n`` is 1.

    >>> spread_text(1.5, 0.25, 3), spread_text(1.5, 0.0, 1, 3)
    ('1.50 ± 0.25', '1.500 (n=1, no spread)')
    """
    if n < 2:
        return f"{mean:.{digits}f} {NO_SPREAD}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def mean_text(mean: float, n: int, digits: int = 3) -> str:
    """A mean over ``n`` seeds, marked :data:`NO_SPREAD` when ``n`` is 1 (one value is no average).

    >>> mean_text(1.25, 2), mean_text(1.25, 1)
    ('1.250', '1.250 (n=1, no spread)')
    """
    return f"{mean:.{digits}f}" + (f" {NO_SPREAD}" if n < 2 else "")


def one_seed_warning(seed_counts: Sequence[int]) -> str | None:
    """:data:`ONE_SEED_WARNING` when any row of a table stands on one seed; None when every row has two or more."""
    return ONE_SEED_WARNING if any(n < 2 for n in seed_counts) else None


def per_model_table(summaries: Sequence[SplitSummary]) -> str:
    """Cumulative reward per model (averaged over its nodes and seeds) for each (sampling, split)."""
    models = sorted({m for s in summaries for m in s.per_model})
    lines = ["| sampling | split | n (seeds) | " + " | ".join(models) + " |", "|---|---|---|" + "---|" * len(models)]
    for s in summaries:
        cells = [f"{s.per_model[m]:.2f}" if m in s.per_model else "-" for m in models]
        lines.append(f"| {s.sampling} | {s.split} | {s.seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class PairedTest:
    """One (policy, split) against the no-sharing split, paired by seed (same initial weights and questions)."""

    sampling: str
    split: str
    seeds: list[int]
    ratios: list[float]
    mean_ratio: float
    mean_diff: float
    t_p: float | None  # paired t-test, two-sided (None below 2 seeds or with no spread)
    sign_p: float  # exact sign-flip permutation test, one-sided (this split better)


def sign_flip_p(diffs: Sequence[float]) -> float:
    """One-sided exact p-value that the mean of ``diffs`` is > 0: the share of the 2^n sign flips whose
    mean is at least the observed one (n <= 16).

    >>> sign_flip_p([1.0, 2.0, 3.0])  # only the observed signs reach 2.0: 1 of 8
    0.125
    """
    n = len(diffs)
    if not 1 <= n <= 16:
        raise ValueError("sign_flip_p needs 1-16 differences")
    observed = sum(diffs)
    hits = 0
    for mask in range(2**n):
        total = sum(-d if mask >> i & 1 else d for i, d in enumerate(diffs))
        hits += int(total >= observed - 1e-12)
    return hits / float(2**n)


def paired_t_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of a paired t-test on ``diffs`` (None below 2 values or with no spread)."""
    if len(diffs) < 2 or statistics.stdev(diffs) == 0:
        return None
    from scipy import stats  # lazy: only the aggregation needs it

    return float(stats.ttest_1samp(list(diffs), 0.0).pvalue)


def paired_tests(runs: Sequence[RunResult], baseline_split: str, order: Sequence[str] = ()) -> list[PairedTest]:
    """Every (policy, split) other than ``baseline_split`` against that split's run of the same seed."""
    base = {r.seed: r.cumulative for r in runs if r.split == baseline_split and not sync_of(r.sampling)}
    groups: dict[tuple[str, str], dict[int, float]] = {}
    for r in runs:
        if (r.split != baseline_split or sync_of(r.sampling)) and r.seed in base:
            groups.setdefault((r.sampling, r.split), {})[r.seed] = r.cumulative
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for (sampling, split), by_seed in sorted(
        groups.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0][0], split_order(kv[0][1]))
    ):
        seeds = sorted(by_seed)
        diffs = [by_seed[s] - base[s] for s in seeds]
        ratios = [by_seed[s] / base[s] if base[s] else math.nan for s in seeds]
        mean_ratio, mean_diff = statistics.fmean(ratios), statistics.fmean(diffs)
        p_values = paired_t_p(diffs), sign_flip_p(diffs)
        out.append(PairedTest(sampling, split, seeds, ratios, mean_ratio, mean_diff, *p_values))
    return out


def paired_table(tests: Sequence[PairedTest]) -> str:
    """Per-seed ratios, their mean and both p-values, one row per (policy, split)."""
    lines = [
        "| sampling | split | n (seeds) | ratio per seed | mean ratio | paired t-test p (two-sided) "
        "| sign-flip p (one-sided) |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in tests:
        per_seed = ", ".join(f"{x:.2f}" for x in t.ratios)
        tp = "-" if t.t_p is None else f"{t.t_p:.3f}"
        lines.append(
            f"| {t.sampling} | {t.split} | {len(t.seeds)} | {per_seed} | {mean_text(t.mean_ratio, len(t.seeds))} "
            f"| {tp} | {t.sign_p:.3f} |"
        )
    return "\n".join(lines)


DIAGNOSTICS = {
    "token_logp_local": "log-prob / token, local",
    "token_logp_external": "log-prob / token, external",
    "weight_external": "weight, external",
    "adv_share_external": "advantage share, external",
    "grad_share_external": "gradient norm share, external",
    "grad_cos": "cos(local, external gradient)",
}
"""Per-node diagnostics averaged over the rounds that trained on both local and external groups."""


def node_diagnostics(rounds: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means of :data:`DIAGNOSTICS` over the rounds (``round`` events) that trained on both sources."""
    curves = diagnostic_curves(rounds)
    return {k: statistics.fmean(v) for k, c in curves.items() if (v := [x for x in c if x is not None])}


def diagnostic_curves(rounds: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """:data:`DIAGNOSTICS` per round (None in rounds that did not train on both local and external groups)."""
    values: dict[str, list[float | None]] = {k: [] for k in DIAGNOSTICS}
    for e in rounds:
        for v in values.values():
            v.append(None)
        sources = e.get("trained_sources") or {}
        local = sources.get("local")
        ext = [v for k, v in sources.items() if k.startswith("ext:")]
        if not local or not ext:
            continue
        n_ext = sum(v["completions"] for v in ext)
        values["token_logp_local"][-1] = local["token_logp"]
        values["token_logp_external"][-1] = sum(v["token_logp"] * v["completions"] for v in ext) / n_ext
        values["weight_external"][-1] = sum(v["weight"] * v["completions"] for v in ext) / n_ext
        values["adv_share_external"][-1] = sum(v["adv_share"] for v in ext)
        gl, ge = e.get("grad_local"), e.get("grad_external")
        if gl is not None and ge is not None and gl + ge > 0:
            values["grad_share_external"][-1] = ge / (gl + ge)
        values["grad_cos"][-1] = e.get("grad_cos")
    return {k: v for k, v in values.items() if any(x is not None for x in v)}


def diagnostics_table(summaries: Sequence[SplitSummary]) -> str:
    """The diagnostics of every (policy, split) that has them."""
    head = "| sampling | split | n (seeds) | " + " | ".join(DIAGNOSTICS.values()) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(DIAGNOSTICS)]
    for s in summaries:
        if s.diagnostics:
            cells = [f"{s.diagnostics[k]:.3f}" if k in s.diagnostics else "-" for k in DIAGNOSTICS]
            lines.append(f"| {s.sampling} | {s.split} | {s.seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_run(run_dir: Path, sampling: str, split: str, seed: int, wall_s: float = 0.0) -> RunResult:
    """Read every node's ``metrics.jsonl`` under ``run_dir`` into a :class:`RunResult`."""
    nodes = []
    for path in sorted(run_dir.glob("*/metrics.jsonl")):
        events = list(read_events(path))
        start = next((e for e in events if e.get("event") == "start"), {})
        rounds = _last_per_round(events)
        nodes.append(
            NodeResult(
                peer=str(start.get("peer", path.parent.name)),
                model=str(start.get("model", "?")),
                curve=tuple(float(e["reward_mean"]) for e in rounds),
                external_groups=sum(int(e.get("external_groups", 0)) for e in rounds),
                trained_groups=sum(int(e.get("trained_groups", 0)) for e in rounds),
                fetch_failed=sum(int(e.get("fetch_failed", 0)) for e in rounds),
                rejected=sum(int(e.get("external_rejected", 0)) for e in rounds),
                round_s=statistics.fmean(float(e["round_s"]) for e in rounds) if rounds else 0.0,
                diagnostics=node_diagnostics(rounds),
                diagnostic_curves=diagnostic_curves(rounds),
                heldout=_eval_series(events, "accuracy"),
                heldout_reward=_eval_series(events, "sample_reward"),
                cpu_s=_cpu_spent(events),
                eval_items=max((int(e.get("items", 0)) for e in events if e.get("event") == "eval"), default=0),
            )
        )
    return RunResult(sampling, split, seed, tuple(nodes), wall_s)


def _last_per_round(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A node's ``round`` events by round. A resumed node redoes the rounds after its checkpoint: the later
    record of a round is the one its history continues from."""
    by_round = {int(e["round"]): e for e in events if e.get("event") == "round"}
    return [by_round[r] for r in sorted(by_round)]


def _cpu_spent(events: Sequence[Mapping[str, Any]]) -> float:
    """CPU-seconds of every process lifetime of a node, redone rounds included (that CPU was spent).

    A lifetime starts at a ``start`` event and ends with its ``summary``; one cut off without a summary
    (SIGKILL) counts up to its last round record.
    """
    total, last = 0.0, 0.0
    for e in events:
        kind = e.get("event")
        if kind == "start":
            total, last = total + last, 0.0
        elif kind in ("round", "summary") and e.get("cpu_s") is not None:
            last = float(e["cpu_s"])
    return total + last


def _eval_series(events: Sequence[Mapping[str, Any]], key: str) -> tuple[tuple[int, float], ...]:
    """(round, value) of each complete ``eval`` event with ``key``, by round (the last one of a round wins)."""
    by_round: dict[int, float] = {}
    for e in events:
        if e.get("event") == "eval" and e.get("complete", True) and e.get(key) is not None:
            by_round[int(e["round"])] = float(e[key])
    return tuple(sorted(by_round.items()))


def _pairs(raw: Sequence[Sequence[Any]]) -> tuple[tuple[int, float], ...]:
    return tuple((int(r), float(v)) for r, v in raw)


def run_from_json(data: Mapping[str, Any]) -> RunResult:
    """Inverse of :meth:`RunResult.to_json` (derived fields are ignored)."""
    keys: tuple[str, ...] = ("peer", "model", "external_groups", "trained_groups", "fetch_failed", "rejected")
    keys += ("round_s", "diagnostics", "diagnostic_curves", "cpu_s", "eval_items")
    nodes = tuple(
        NodeResult(
            curve=tuple(n["curve"]),
            heldout=_pairs(n.get("heldout", ())),
            heldout_reward=_pairs(n.get("heldout_reward", ())),
            **{k: n[k] for k in keys if k in n},
        )
        for n in data["nodes"]
    )
    return RunResult(data["sampling"], data["split"], int(data["seed"]), nodes, float(data.get("wall_s", 0.0)))
