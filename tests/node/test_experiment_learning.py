"""Held-out tables of an experiment and its sync axis: numbers computed by hand from small runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from node.experiments.config import ExperimentConfig
from node.experiments.learning import heldout_curve, heldout_table, rounds_to_reach, summarize_heldout
from node.experiments.results import NodeResult, RunResult, paired_tests, share_baseline, summarize, sync_of
from node.experiments.sweep import labels, local_command, plan_runs


def _node(points: list[tuple[int, float]], cpu: float = 10.0) -> NodeResult:
    return NodeResult(peer="p", model="tiny-m", curve=(0.5, 0.5), heldout=tuple(points), cpu_s=cpu)


def _run(label: str, split: str, seed: int, *curves: list[tuple[int, float]]) -> RunResult:
    return RunResult(label, split, seed, tuple(_node(c) for c in curves))


def test_a_runs_curve_is_the_node_mean_at_rounds_every_node_evaluated() -> None:
    run = _run("a", "8/0", 0, [(0, 0.2), (10, 0.4), (20, 0.6)], [(0, 0.4), (20, 0.8)])
    curve = heldout_curve(run)
    assert [r for r, _ in curve] == [0, 20] and [a for _, a in curve] == pytest.approx([0.3, 0.7])
    assert heldout_curve(_run("a", "8/0", 0, [(0, 0.2)], [])) == []  # a node without evaluations: no curve
    assert rounds_to_reach([(0, 0.9), (10, 0.2), (20, 0.5)], 0.5) == 20  # round 0 never counts


def test_held_out_summary_pairs_each_seed_with_the_baseline() -> None:
    runs = [
        _run("adv", "8/0", 0, [(0, 0.2), (10, 0.3), (20, 0.4)]),
        _run("adv", "8/0", 100, [(0, 0.2), (10, 0.2), (20, 0.5)]),
        _run("adv", "4/4", 0, [(0, 0.2), (10, 0.4), (20, 0.6)]),
        _run("adv", "4/4", 100, [(0, 0.2), (10, 0.3), (20, 0.4)]),
    ]
    base, shared = summarize_heldout(runs, ("adv", "8/0"), ["adv"])
    assert base.ratios == [] and base.final == pytest.approx(0.45)
    assert shared.ratios == [pytest.approx(1.5), pytest.approx(0.8)]
    assert shared.mean_ratio == pytest.approx(1.15)
    assert shared.reach == [pytest.approx(0.5), None]  # seed 0 reaches 0.4 at round 10 of 20; seed 100 never 0.5
    assert shared.sign_p == pytest.approx(0.5)
    assert shared.reward_per_cpu_s == pytest.approx(1.0 / 10.0)
    table = heldout_table([base, shared], ("adv", "8/0"), primary="adv:4/4")
    assert "adv **(primary)** | 4/4 | 2 | 0.200 | 0.500 ± 0.141 | 1.50, 0.80 | 1.150" in table
    assert "adv (baseline) | 8/0" in table and "0.50 (1/2 seeds reach it)" in table


def test_the_sync_axis_runs_no_sharing_once_per_setting_and_compares_it_with_the_unsynced_baseline() -> None:
    cfg = ExperimentConfig(
        splits=("8/0", "4/4"), sampling=("advantage",), sync_every=(0, 10), seeds=1, objectives=("plain",)
    )
    runs = plan_runs(cfg)
    assert [(r.label, r.split) for r in runs] == [
        ("advantage", "8/0"), ("advantage", "4/4"), ("advantage+sync10", "8/0"), ("advantage+sync10", "4/4")
    ]  # fmt: skip
    assert labels(cfg) == ["advantage", "advantage+sync10"]
    cfg_dir = Path("x")
    argv = local_command(cfg, runs[2], cfg_dir)
    assert "--sync-every" in argv and argv[argv.index("--sync-every") + 1] == "10"
    assert "--sync-every" not in local_command(cfg, runs[0], cfg_dir)
    diloco = dataclasses.replace(cfg, outer_lr=0.7, outer_momentum=0.9, aggregator="mean")  # not a node's defaults
    argv = local_command(diloco, runs[2], cfg_dir)
    assert [argv[argv.index(f) + 1] for f in ("--outer-lr", "--outer-momentum", "--sync-aggregator")] == [
        "0.7", "0.9", "mean"
    ]  # fmt: skip
    assert "--outer-momentum" not in local_command(diloco, runs[0], cfg_dir)  # the outer step needs a sync
    with pytest.raises(ValueError, match="aggregator"):
        ExperimentConfig(aggregator="average")
    assert sync_of("advantage+sync10") == "+sync10" and sync_of("advantage") == ""

    def res(label: str, split: str, cum: float) -> RunResult:
        return RunResult(label, split, 0, (NodeResult("p", "m", (cum,)),))

    results = [res("advantage", "8/0", 2.0), res("advantage", "4/4", 3.0), res("advantage+sync10", "8/0", 4.0)]
    shared = share_baseline(results, labels(cfg))
    assert len(shared) == 3  # the unsynced 8/0 is never copied in as a synced row
    ratios = {(s.sampling, s.split): s.ratio for s in summarize(shared, labels(cfg), "8/0")}
    assert ratios[("advantage+sync10", "8/0")] == pytest.approx(2.0)  # against the unsynced baseline
    tests = {(t.sampling, t.split): t.mean_ratio for t in paired_tests(shared, "8/0", labels(cfg))}
    assert tests == {("advantage", "4/4"): pytest.approx(1.5), ("advantage+sync10", "8/0"): pytest.approx(2.0)}


def test_bad_sync_settings_name_the_fix() -> None:
    with pytest.raises(ValueError, match="sync_every"):
        ExperimentConfig(sync_every=("x",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicates"):
        ExperimentConfig(sync_every=(10, 10))
    with pytest.raises(ValueError, match="exactly one value above 0"):
        ExperimentConfig(sync_every=(0, 2, 10), sync_period_s=60)  # a clock would make sync2 and sync10 one run
    with pytest.raises(ValueError, match="--sync-period must be 0 or >= 1"):
        ExperimentConfig(sync_every=(0, 2), sync_period_s=-5)


def test_a_sync_on_a_clock_reaches_only_the_synced_runs_and_its_label_says_the_period() -> None:
    from node.cli.main import build_parser

    cfg = ExperimentConfig(
        splits=("4/0", "2/2"), sync_every=(0, 2), sync_period_s=60, matchmaking_timeout_s=20.0, seeds=1,
        objectives=("plain",),
    )  # fmt: skip
    runs = plan_runs(cfg)
    assert [(r.label, r.split) for r in runs] == [
        ("advantage", "4/0"), ("advantage", "2/2"), ("advantage+sync60s", "4/0"), ("advantage+sync60s", "2/2")
    ]  # fmt: skip
    assert labels(cfg) == ["advantage", "advantage+sync60s"] and sync_of("advantage+sync60s") == "+sync60s"
    assert runs[3].name == "runs/advantage+sync60s/2-2/seed0"
    synced = build_parser().parse_args(local_command(cfg, runs[3], Path("x"))[3:])
    assert (synced.sync_period_s, synced.matchmaking_timeout_s, synced.sync_every) == (60.0, 20.0, 2)
    alone = build_parser().parse_args(local_command(cfg, runs[1], Path("x"))[3:])
    assert (alone.sync_period_s, alone.matchmaking_timeout_s, alone.sync_every) == (0.0, 5.0, 0)  # no sync at all


def test_a_primary_that_is_no_row_of_the_sweep_names_the_rows() -> None:
    from node.experiments.sweep import check_primary

    cfg = ExperimentConfig(
        splits=("4/0", "2/2"), sync_every=(0, 2), sync_period_s=60, primary="advantage+sync2:2/2", objectives=("plain",)
    )
    with pytest.raises(ValueError, match=r"not a row of this sweep; use one of .*advantage\+sync60s:2/2"):
        check_primary(cfg)
    check_primary(dataclasses.replace(cfg, primary="advantage+sync60s:2/2"))
    check_primary(dataclasses.replace(cfg, primary=""))
