"""``swarm-node experiment``: SAPO's sharing table on a local swarm, repeated over seeds.

Each configuration (sampling policy x local/external split x seed) runs as one
``swarm-node local`` subprocess writing into its own run folder. All splits
train on the same number of groups per round (I + J is fixed), so every node
spends the same training compute; only where the groups come from changes.

A run is *finished* when its ``run.json`` (the parsed per-node results) and
then its ``DONE`` marker have been written, each atomically. Running the same
command again skips finished runs and redoes any partial one, so an interrupted
sweep resumes where it stopped. The aggregation (``results.json``,
``results.md``, PNG plots) is rebuilt from the finished runs at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from node.core.options import LocalOptions, check_options, to_argv
from node.experiments.config import ExperimentConfig
from node.experiments.csvfiles import (
    HELDOUT_COLUMNS,
    LONG_COLUMNS,
    PAIRED_COLUMNS,
    SUMMARY_COLUMNS,
    csv_text,
    heldout_rows,
    long_rows,
    paired_rows,
    summary_rows,
)
from node.experiments.learning import HeldoutSummary, heldout_table, plot_heldout, summarize_heldout
from node.experiments.parts import LOAD, RunLoad, load_line, read_load, resumable
from node.experiments.permodel import per_model_heldout
from node.experiments.permodel import per_model_table as per_model_heldout_table
from node.experiments.results import (
    PairedTest,
    RunResult,
    SplitSummary,
    diagnostics_table,
    load_run,
    markdown_table,
    one_seed_warning,
    paired_table,
    paired_tests,
    parse_split,
    per_model_table,
    run_from_json,
    share_baseline,
    summarize,
    sync_of,
)
from node.observe.metrics import read_events
from node.training.offpolicy import OBJECTIVES, OffPolicyConfig, default_objective

logger = logging.getLogger(__name__)

DONE = "DONE"
STOP_GRACE_S = 60.0


@dataclass(frozen=True)
class Run:
    """One configuration of the sweep."""

    sampling: str
    local: int
    external: int
    seed: int
    objective: str = field(default_factory=default_objective)  # a node's own
    sync_every: int = 0
    sync_period_s: int = 0

    @property
    def split(self) -> str:
        return f"{self.local}/{self.external}"

    @property
    def label(self) -> str:
        """The policy column of the tables: the sampling policy, ``+objective`` unless plain, ``+syncH`` if synced
        every H rounds, ``+syncPs`` if synced on a clock of P seconds."""
        label = self.sampling if self.objective == "plain" else f"{self.sampling}+{self.objective}"
        return label + sync_suffix(self.sync_every, self.sync_period_s)

    @property
    def name(self) -> str:
        """Folder of the run, relative to the results folder."""
        return f"runs/{self.label}/{self.local}-{self.external}/seed{self.seed}"


def sync_suffix(sync_every: int, sync_period_s: int = 0) -> str:
    """The label suffix of a synced run (``+sync10``, or ``+sync60s`` on a clock), "" without the sync."""
    if not sync_every:
        return ""
    return f"+sync{sync_period_s}s" if sync_period_s else f"+sync{sync_every}"


def plan_runs(cfg: ExperimentConfig) -> list[Run]:
    """All runs of the sweep, seed-major so that a partial sweep covers every split early.

    A split without external groups depends on neither the sampling policy nor the objective,
    so it runs once per sync setting (under the first policy) and is shared by all; reference
    splits run once, without the sync.
    """
    runs: list[Run] = []
    first = (cfg.sampling[0], cfg.objectives[0])
    period = cfg.sync_period_s
    for seed in cfg.seed_values():
        for sync in cfg.sync_every:
            for sampling in cfg.sampling:
                for objective in cfg.objectives:
                    for local, external in cfg.split_pairs():
                        if external == 0 and (sampling, objective) != first:
                            continue
                        runs.append(Run(sampling, local, external, seed, objective, sync, period))
        runs += [Run(first[0], *parse_split(s), seed, first[1]) for s in cfg.reference_splits]
    return runs


def labels(cfg: ExperimentConfig) -> list[str]:
    """Every policy label of the sweep, in table order (the unsynced ones first)."""
    return [
        Run(s, 1, 1, 0, o, h, cfg.sync_period_s).label
        for h in sorted(cfg.sync_every)
        for s in cfg.sampling
        for o in cfg.objectives
    ]


def check_primary(cfg: ExperimentConfig) -> None:
    """Raise ValueError naming the choices when ``cfg.primary`` is not one of the sweep's ``label:split`` rows."""
    rows = [f"{label}:{split}" for label in labels(cfg) for split in cfg.splits]
    if cfg.primary and cfg.primary not in rows:
        raise ValueError(f"primary={cfg.primary!r} is not a row of this sweep; use one of {', '.join(rows)}")


def is_finished(run_dir: Path) -> bool:
    """True when the run's results are complete (its marker exists)."""
    return (run_dir / DONE).is_file()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


PER_RUN = {"sampling", "sync_every"}
"""Node options a sweep varies: each run takes one value of the axis (:class:`Run`)."""
SYNCED_ONLY = {"outer_lr", "outer_momentum", "aggregator", "sync_period_s", "matchmaking_timeout_s"}
"""Node options a sweep passes only to its synced runs (a node says a sync setting without a sync is idle)."""


def local_command(cfg: ExperimentConfig, run: Run, run_dir: Path, resume: bool = False) -> list[str]:
    """The ``swarm-node local`` command line of one run (flags generated from :class:`LocalOptions`)."""
    opts = local_options(cfg, run, run_dir, resume)
    return [sys.executable, "-m", "node", "local", *to_argv(opts, only="changed")]


def local_options(cfg: ExperimentConfig, run: Run, run_dir: Path, resume: bool = False) -> LocalOptions:
    """The ``swarm-node local`` options of one run.

    Every sweep field that is a node option of the same name passes through
    (None: the node's default); the run's place in the sweep sets the rest. ``resume``: every node goes
    on from its last checkpoint in ``run_dir``.
    """
    shared = {f.name for f in fields(LocalOptions)} & {f.name for f in fields(ExperimentConfig)}
    values = {n: getattr(cfg, n) for n in sorted(shared - PER_RUN) if getattr(cfg, n) is not None}
    if not run.sync_every:
        values = {n: v for n, v in values.items() if n not in SYNCED_ONLY}
    opts = LocalOptions(
        **values | {"models": ",".join(cfg.models), "tasks": tuple(cfg.tasks)} | objective_options(run.objective),
        local_groups=run.local, external_groups=run.external, sampling=run.sampling, seed=run.seed,
        sync_every=run.sync_every, log_dir=str(run_dir), swarm_id=f"exp-{run.label}-{run.local}-{run.seed}",
        no_dashboard=True, resume=resume,
    )  # fmt: skip
    return opts


def objective_options(name: str) -> dict[str, Any]:
    """The node options of an objective: every field its preset (:data:`OBJECTIVES`) names.

    All of them, not a chosen few, so that a preset's new field reaches the nodes without a change here; the
    fields it does not name keep the sweep's value or the node's default.
    """
    preset = OffPolicyConfig.preset(name)  # validates the name
    named = {f.name for f in fields(LocalOptions)}
    return {key: getattr(preset, key) for key in OBJECTIVES[name] if key in named}


def check_sweep(cfg: ExperimentConfig) -> None:
    """Raise ValueError, before any run starts, when ``--primary`` is no row of the sweep or a node would
    refuse one of its runs (naming the run and the node's reason)."""
    check_primary(cfg)
    for run in plan_runs(cfg):
        try:
            check_options(local_options(cfg, run, Path(cfg.out) / run.name))
        except ValueError as e:
            raise ValueError(f"run {run.label} {run.split} seed {run.seed} would stop at once: {e}") from None


def rounds_done(run_dir: Path) -> int:
    """Node-rounds recorded so far under ``run_dir`` (for the progress display; a resumed node's redone rounds
    count once)."""
    return sum(len({e.get("round") for e in read_events(p, "round")}) for p in run_dir.glob("*/metrics.jsonl"))


def stop_local(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the ``local`` process (it stops its nodes), then SIGKILL its session if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def execute_run(cfg: ExperimentConfig, run: Run, out: Path, on_poll: Callable[[int], None]) -> RunResult | None:
    """Run one configuration to completion; returns its results, or None if it failed.

    An interrupted attempt whose nodes all left checkpoints goes on from them (:mod:`node.experiments.parts`);
    any other partial folder is removed first. ``on_poll`` gets the node-rounds done so far, about twice a
    second.
    """
    run_dir = out / run.name
    resume = resumable(run_dir, cfg.nodes)
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    before = read_load(run_dir) if resume else None
    if resume:
        logger.warning(
            "run %s goes on from its nodes' checkpoints (%d node-rounds done)", run.name, rounds_done(run_dir)
        )
    t0 = time.monotonic()
    loads = [os.getloadavg()[0]]  # before the run: what the machine carried in (or ran beside it)
    with open(run_dir / "local.log", "ab" if resume else "wb") as log:
        proc = subprocess.Popen(
            local_command(cfg, run, run_dir, resume), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while proc.poll() is None:
                on_poll(rounds_done(run_dir))
                loads.append(os.getloadavg()[0])
                time.sleep(0.5)
        finally:
            stop_local(proc)
            load = RunLoad.of(loads, time.monotonic() - t0)
            load = before.then(load) if before is not None else load
            write_atomic(run_dir / LOAD, json.dumps(asdict(load)))  # an interrupted part's too: the next adds to it
    on_poll(rounds_done(run_dir))
    result = load_run(run_dir, run.label, run.split, run.seed, load.wall_s)
    complete = len(result.nodes) == cfg.nodes and all(len(n.curve) >= cfg.rounds for n in result.nodes)
    if proc.returncode != 0 or not complete:
        logger.warning("run %s failed (exit %s); see %s", run.name, proc.returncode, run_dir / "local.log")
        return None
    write_atomic(run_dir / "run.json", json.dumps(result.to_json()))
    write_atomic(run_dir / DONE, f"{time.time()}\n")
    return result


def load_finished(out: Path, runs: list[Run]) -> list[RunResult]:
    """Results of the finished runs among ``runs`` (read back from their ``run.json``)."""
    done = []
    for run in runs:
        run_dir = out / run.name
        if is_finished(run_dir):
            saved = run_from_json(json.loads((run_dir / "run.json").read_text()))
            # the metrics are the source of truth: re-read them, so new summary fields cover old runs too
            done.append(load_run(run_dir, saved.sampling, saved.split, saved.seed, saved.wall_s))
    return done


@dataclass
class SweepReport:
    """What the sweep did: finished runs (now and before) and failures."""

    results: list[RunResult] = field(default_factory=list)
    skipped: int = 0
    failed: list[str] = field(default_factory=list)


def run_sweep(cfg: ExperimentConfig) -> SweepReport:
    """Run every unfinished configuration, then write the aggregate files. Resumable."""
    from node.experiments.progress import SweepProgress

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(cfg)
    write_atomic(out / "experiment.json", json.dumps(cfg.to_json(), indent=2))
    report = SweepReport()
    with SweepProgress(len(runs) * cfg.nodes * cfg.rounds, enabled=cfg.progress) as bar:
        for run in runs:
            if is_finished(out / run.name):
                report.skipped += 1
                bar.finished_run(run.name, cfg.nodes * cfg.rounds, skipped=True)
                continue
            bar.start_run(run.name, cfg.nodes * cfg.rounds)
            result = execute_run(cfg, run, out, bar.update_run)
            if result is None:
                report.failed.append(run.name)
            bar.finished_run(run.name, cfg.nodes * cfg.rounds, skipped=False)
    report.results = load_finished(out, runs)
    if report.results:
        write_outputs(cfg, report.results, out, load_line(out, [r.name for r in runs]))
    return report


def write_csv_files(
    cfg: ExperimentConfig,
    out: Path,
    results: list[RunResult],
    shown: list[SplitSummary],
    learned: list[HeldoutSummary],
    tests: list[PairedTest],
    baseline: tuple[str, str],
) -> None:
    """The CSV files beside results.json: every measurement in long format, and the rows of each table."""
    write_atomic(out / "results.csv", csv_text(LONG_COLUMNS, long_rows(results)))
    write_atomic(out / "summary.csv", csv_text(SUMMARY_COLUMNS, summary_rows(shown, cfg.reference_splits)))
    if learned:
        write_atomic(out / "heldout.csv", csv_text(HELDOUT_COLUMNS, heldout_rows(learned, baseline, cfg.primary)))
    if tests:
        write_atomic(out / "paired.csv", csv_text(PAIRED_COLUMNS, paired_rows(tests)))


def write_outputs(
    cfg: ExperimentConfig, results: list[RunResult], out: Path, load: str = "", plots: bool = True
) -> None:
    """results.json with its CSV files, results.md and (``plots``: matplotlib's seconds) the PNG plots, from the
    finished runs."""
    from node.experiments.plots import plot_cumulative, plot_reward_curves, plot_sources
    from node.experiments.results import SAPO_REFERENCE

    order = labels(cfg)
    shared = share_baseline(results, order)
    summaries = summarize(shared, order=order, baseline_split=cfg.baseline_split)
    tests = paired_tests(shared, cfg.baseline_split, order) if cfg.baseline_split else []
    firsts = {sync_of(label): label for label in reversed(order)}  # the first label of each sync setting

    def shown_row(label: str, split: str) -> bool:  # a no-sharing split: once per sync setting
        return parse_split(split)[1] != 0 or firsts.get(sync_of(label)) == label

    tests = [t for t in tests if shown_row(t.sampling, t.split)]
    baseline = (order[0], cfg.baseline_split or cfg.splits[0])
    learned = [h for h in summarize_heldout(shared, baseline, order) if shown_row(h.label, h.split)]
    data = {
        "config": cfg.to_json(),
        "sapo_paper_reported": SAPO_REFERENCE,  # the paper's numbers, not measured here
        "summary": [asdict(s) for s in summaries],
        "paired": [asdict(t) for t in tests],
        "heldout": [asdict(h) for h in learned],
        "runs": [r.to_json() for r in results],
    }
    write_atomic(out / "results.json", json.dumps(data))
    # a no-sharing split is the same runs under every policy: its rows once, under the first policy
    shown = [s for s in summaries if shown_row(s.sampling, s.split)]
    write_csv_files(cfg, out, results, shown, learned, tests, baseline)
    title = f"{cfg.nodes} nodes, {cfg.rounds} rounds, {cfg.num_generations} completions/question, tasks: "
    title += ",".join(cfg.tasks) or "all"
    table = markdown_table(shown, reference_splits=cfg.reference_splits)
    text = f"# Experiment results\n\n{title}\n\n{load}"
    if warning := one_seed_warning([s.seeds for s in shown] + [len(h.seeds) for h in learned]):
        text += f"**{warning}**\n\n"  # once, above the tables (the command prints results.md)
    if learned:
        questions = max((n.eval_items for r in results for n in r.nodes), default=0)
        text += f"Held-out accuracy ({questions} questions per evaluation), paired by seed against "
        text += f"{baseline[0]} {baseline[1]}:\n\n"
        text += heldout_table(learned, baseline, cfg.primary) + "\n\nTraining reward (each node's own stream):\n\n"
    text += f"{table}\n\nCumulative reward per model:\n\n"
    text += per_model_table(shown) + "\n"
    if len({n.model for r in results for n in r.nodes}) > 1 and learned:
        text += f"\nHeld-out per model, each against the same model in {baseline[0]} {baseline[1]} of its seed:\n\n"
        text += per_model_heldout_table(per_model_heldout(shared, baseline)) + "\n"
    if tests:
        text += f"\nPaired over seeds, each run against the {cfg.baseline_split} run of its seed:\n\n"
        text += paired_table(tests) + "\n"
    if any(s.diagnostics for s in summaries):
        text += "\nWhat training used (means over node-rounds that trained on both sources):\n\n"
        text += diagnostics_table(shown) + "\n"
    write_atomic(out / "results.md", text)
    if not plots:
        return
    plot_reward_curves(summaries, out / "reward_curves.png", title=title)
    plot_cumulative(summaries, out / "cumulative.png", title=title)
    if learned:
        plot_heldout(learned, out / "heldout.png", title=title)
    if any(s.diagnostic_curves for s in summaries):
        plot_sources(summaries, out / "sources.png", title=title)
