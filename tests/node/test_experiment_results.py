"""Experiment aggregation, configuration and planning: pure functions, no network."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from node.cli.experiment import config_from_args
from node.cli.local import child_argv
from node.cli.main import build_parser
from node.core.assemble import node_configs
from node.core.options import LocalOptions, NodeOptions, options_from
from node.experiments.config import ExperimentConfig
from node.experiments.parts import RunLoad, load_line, resumable
from node.experiments.results import (
    ONE_SEED_WARNING,
    NodeResult,
    RunResult,
    diagnostics_table,
    load_run,
    markdown_table,
    mean_curves,
    node_diagnostics,
    one_seed_warning,
    paired_table,
    paired_tests,
    parse_split,
    per_model_table,
    run_from_json,
    share_baseline,
    sign_flip_p,
    smooth,
    std_curves,
    summarize,
)
from node.experiments.sweep import Run, is_finished, labels, local_command, plan_runs, write_atomic
from node.observe.metrics import MetricsWriter
from node.training.offpolicy import OBJECTIVES, OffPolicyConfig


def node(curve: list[float], model: str = "tiny-s", ext: int = 0) -> NodeResult:
    return NodeResult(peer=f"p{len(curve)}{model}", model=model, curve=tuple(curve), external_groups=ext)


def run(split: str, seed: int, *curves: list[float], sampling: str = "uniform") -> RunResult:
    return RunResult(sampling, split, seed, tuple(node(c) for c in curves))


def test_cumulative_is_sum_over_rounds_mean_over_nodes() -> None:
    r = run("4/4", 0, [0.0, 1.0, 1.0], [0.5, 0.5, 0.0])
    assert r.cumulative == pytest.approx((2.0 + 1.0) / 2)
    assert r.mean_curve() == pytest.approx([0.25, 0.75, 0.5])


def test_curves_helpers() -> None:
    assert mean_curves([]) == []
    assert std_curves([[1.0, 2.0]]) == [0.0, 0.0]
    assert std_curves([[0.0, 0.0], [2.0, 2.0]]) == pytest.approx([math.sqrt(2)] * 2)
    assert smooth([1.0, 1.0, 4.0], 3) == pytest.approx([1.0, 1.0, 2.0])
    with pytest.raises(ValueError):
        smooth([1.0], 0)


@pytest.mark.parametrize("bad", ["8", "a/b", "8/", "/4", "4-4"])
def test_parse_split_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="LOCAL/EXTERNAL"):
        parse_split(bad)


def test_summarize_ratio_std_and_order() -> None:
    runs = [
        run("8/0", 0, [1.0, 1.0]),
        run("8/0", 1, [1.0, 3.0]),  # baseline mean (2 + 4) / 2 = 3
        run("4/4", 0, [3.0, 3.0]),
        run("4/4", 1, [3.0, 3.0]),  # mean 6 -> ratio 2
    ]
    s = summarize(runs)
    assert [x.split for x in s] == ["8/0", "4/4"]
    base, shared = s
    assert base.cumulative_mean == pytest.approx(3.0)
    assert base.cumulative_std == pytest.approx(math.sqrt(2))
    assert base.ratio == pytest.approx(1.0)
    assert shared.ratio == pytest.approx(2.0)
    assert shared.cumulative_std == 0.0
    assert shared.curve_mean == pytest.approx([3.0, 3.0])
    assert shared.per_model == {"tiny-s": pytest.approx(6.0)}


def test_share_baseline_copies_no_sharing_runs_to_every_policy() -> None:
    runs = [run("8/0", 0, [1.0]), run("4/4", 0, [2.0]), run("4/4", 0, [3.0], sampling="advantage")]
    all_runs = share_baseline(runs, ["uniform", "advantage"])
    assert len(all_runs) == 4
    s = summarize(all_runs, order=["uniform", "advantage"])
    assert [(x.sampling, x.split) for x in s] == [
        ("uniform", "8/0"),
        ("uniform", "4/4"),
        ("advantage", "8/0"),
        ("advantage", "4/4"),
    ]
    assert s[3].ratio == pytest.approx(3.0)


def test_tables_mention_every_split_and_name_n() -> None:
    s = summarize([run("8/0", 0, [1.0]), run("8/0", 100, [2.0]), run("4/4", 0, [1.5]), run("4/4", 100, [2.5])])
    table = markdown_table(s)
    assert "| n (seeds) |" in table.splitlines()[0]
    assert "| uniform | 4/4 | 2 | 2.00 ± 0.71 | 1.33x (+33%)" in table
    assert "| uniform | 4/4 | 2 | 2.00 |" in per_model_table(s) and "| n (seeds) |" in per_model_table(s)
    assert one_seed_warning([x.seeds for x in s]) is None


def test_one_seed_shows_no_spread_and_warns_that_it_gives_no_noise_estimate() -> None:
    """One seed has no spread: a cell says n=1 instead of "± 0.00", and the warning names the fix."""
    s = summarize([run("8/0", 0, [1.0]), run("4/4", 0, [1.5])])
    table = markdown_table(s)
    assert "| uniform | 4/4 | 1 | 1.50 (n=1, no spread) | 1.50x (+50%)" in table
    assert "±" not in "".join(table.splitlines()[2:])
    assert one_seed_warning([x.seeds for x in s]) == ONE_SEED_WARNING and "--seeds 3" in ONE_SEED_WARNING
    (t,) = paired_tests([run("8/0", 0, [1.0]), run("4/4", 0, [1.5])], "8/0")
    assert "| uniform | 4/4 | 1 | 1.50 | 1.500 (n=1, no spread) | - |" in paired_table([t])


def test_the_sapo_papers_numbers_are_a_labelled_footnote_not_a_column() -> None:
    """The paper's reported cumulative rewards stand apart from the measured table, named as the paper's."""
    s = summarize([run("8/0", 0, [1.0]), run("4/4", 0, [1.5])])
    table = markdown_table(s)
    rows, _, note = table.partition("\n\n")
    assert "SAPO" not in rows and "1093.31" not in rows
    assert note.startswith("SAPO paper reports") and "not measured here" in note
    assert "8/0 561.79 (1.00x), 4/4 1093.31 (1.95x)" in note
    assert "SAPO" not in markdown_table(summarize([run("16/0", 0, [1.0])]))  # no split the paper ran: no note


def test_run_json_round_trip() -> None:
    r = run("6/2", 100, [0.1, 0.2], [0.3, 0.4])
    data = json.loads(json.dumps(r.to_json()))
    assert data["cumulative"] == pytest.approx(r.cumulative)
    assert run_from_json(data) == r


def test_load_run_reads_metrics_files(tmp_path: Path) -> None:
    for peer, rewards in (("aaaaaa", [0.0, 0.5]), ("bbbbbb", [1.0, 1.0])):
        w = MetricsWriter(tmp_path / peer / "metrics.jsonl")
        w.write("start", peer=peer, model="tiny-m")
        for i, rew in enumerate(rewards, 1):
            w.write("round", round=i, reward_mean=rew, external_groups=2, fetch_failed=1, round_s=0.5)
        w.write("eval", round=2, accuracy=0.5, items=27, complete=True)
        w.close()
    with open(tmp_path / "aaaaaa" / "metrics.jsonl", "a") as f:
        f.write('{"event": "round", "torn')  # a torn last line is skipped
    r = load_run(tmp_path, "uniform", "6/2", 0)
    assert [n.curve for n in r.nodes] == [(0.0, 0.5), (1.0, 1.0)]
    assert r.nodes[0].model == "tiny-m" and r.nodes[0].external_groups == 4 and r.nodes[1].fetch_failed == 2
    assert r.cumulative == pytest.approx(1.25)
    assert [n.eval_items for n in r.nodes] == [27, 27] and run_from_json(r.to_json()) == r


def test_a_resumed_nodes_history_is_its_last_record_of_each_round_and_its_cpu_is_every_lifetimes(
    tmp_path: Path,
) -> None:
    """Stopped after round 3 with a checkpoint of round 2, the node redid round 3: the redone record counts."""
    w = MetricsWriter(tmp_path / "aaaaaa" / "metrics.jsonl")
    w.write("start", peer="aaaaaa", model="tiny-m")
    for i, rew in ((1, 0.1), (2, 0.2), (3, 0.0)):
        w.write("round", round=i, reward_mean=rew, external_groups=1, round_s=1.0, cpu_s=10.0 * i)
    w.write("summary", rounds=3, cpu_s=31.0)
    w.write("start", peer="aaaaaa", model="tiny-m")
    w.write("resume", round=2)
    for i, rew in ((3, 0.3), (4, 0.4)):
        w.write("round", round=i, reward_mean=rew, external_groups=1, round_s=1.0, cpu_s=5.0 * (i - 2))
    w.close()  # cut off: no summary, so its last round's CPU counts
    (node,) = load_run(tmp_path, "uniform", "6/2", 0).nodes
    assert node.curve == (0.1, 0.2, 0.3, 0.4) and node.external_groups == 4
    assert node.cpu_s == pytest.approx(31.0 + 10.0)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="differ in I \\+ J"):
        ExperimentConfig(splits=("8/0", "4/2"))
    with pytest.raises(ValueError, match="at least 1 local group"):
        ExperimentConfig(splits=("8/0", "0/8"))
    with pytest.raises(ValueError, match="sampling"):
        ExperimentConfig(sampling=("greedy",))
    with pytest.raises(ValueError, match="seeds"):
        ExperimentConfig(seeds=0)


def test_plan_runs_runs_no_sharing_once() -> None:
    cfg = ExperimentConfig(splits=("8/0", "4/4"), seeds=2, sampling=("uniform", "advantage"))
    runs = plan_runs(cfg)
    assert len(runs) == 2 * (1 + 2)
    assert runs[0] == Run("uniform", 8, 0, 0)
    assert {r.seed for r in runs} == {0, 100}
    assert len({r.name for r in runs}) == len(runs)


def test_local_command_has_equal_compute_split(tmp_path: Path) -> None:
    cfg = ExperimentConfig(nodes=3, models=("tiny-s", "tiny-m"), tasks=("max",), learning_rate=0.002)
    cmd = local_command(cfg, Run("advantage", 6, 2, 100), tmp_path)
    assert cmd[1:4] == ["-m", "node", "local"]
    args = build_parser().parse_args(cmd[3:])  # the generated flags parse back to the run's values
    got = {
        k: getattr(args, k) for k in ("nodes", "local_groups", "external_groups", "sampling", "seed", "learning_rate")
    }
    assert got == {
        "nodes": 3,
        "local_groups": 6,
        "external_groups": 2,
        "sampling": "advantage",
        "seed": 100,
        "learning_rate": 0.002,
    }
    assert (
        args.models == "tiny-s,tiny-m" and args.tasks == ["max"] and args.no_dashboard and args.log_dir == str(tmp_path)
    )


def test_config_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"nodes": 3, "splits": ["4/0", "2/2"], "rounds": 7}))
    args = build_parser().parse_args(["experiment", "--config", str(path), "--rounds", "9", "--sampling", "advantage"])
    cfg = config_from_args(args)
    assert (cfg.nodes, cfg.splits, cfg.rounds, cfg.sampling) == (3, ("4/0", "2/2"), 9, ("advantage",))
    path.write_text(json.dumps({"nodez": 3}))
    with pytest.raises(ValueError, match=r"unknown key 'nodez' \(did you mean 'nodes'\?\)"):
        config_from_args(build_parser().parse_args(["experiment", "--config", str(path)]))
    # a node option's key is its field name or its flag's spelling, as in a node's config file
    path.write_text(json.dumps({"generations": 4, "lr": 0.01, "warm_start_steps": 5, "sync_aggregator": "mean"}))
    cfg = config_from_args(build_parser().parse_args(["experiment", "--config", str(path), "--min-generate", "2"]))
    assert (cfg.num_generations, cfg.learning_rate, cfg.warm_start_steps, cfg.aggregator) == (4, 0.01, 5, "mean")
    assert cfg.min_generate_s == 2.0


def test_the_sweep_passes_its_node_options_through_by_name(tmp_path: Path) -> None:
    # every sweep field named as a node option reaches the runs' nodes; the sync's only the synced runs'
    cfg = ExperimentConfig(num_generations=4, learning_rate=0.01, sync_every=(0, 5), outer_lr=0.5, aggregator="mean")
    argv = {r.sync_every: local_command(cfg, r, tmp_path) for r in plan_runs(cfg)}
    for flag in ("--generations", "--lr"):
        assert all(flag in a for a in argv.values()), flag
    assert "--outer-lr" in argv[5] and "--sync-aggregator" in argv[5]
    assert "--outer-lr" not in argv[0] and "--sync-aggregator" not in argv[0]


def test_marker_is_atomic(tmp_path: Path) -> None:
    assert not is_finished(tmp_path)
    write_atomic(tmp_path / "DONE", "x\n")
    assert is_finished(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DONE"]


def test_plots_write_pngs(tmp_path: Path) -> None:
    from node.experiments.plots import plot_cumulative, plot_reward_curves, plot_sources

    s = summarize([run("8/0", 0, [0.1, 0.2, 0.3]), run("8/0", 1, [0.2, 0.2, 0.2]), run("4/4", 0, [0.3, 0.4, 0.5])])
    curves: dict[str, list[float | None]] = {"token_logp_external": [None, -5.0, -4.0], "grad_cos": [0.1, None, 0.3]}
    curves["token_logp_local"] = [-2.0, -1.5, None]
    diag = RunResult("advantage", "4/4", 0, (NodeResult("p", "m", (0.1, 0.2, 0.3), diagnostic_curves=curves),))
    (with_diag,) = summarize([diag])
    assert with_diag.diagnostic_curves["grad_cos"][:1] == [0.1] and math.isnan(
        with_diag.diagnostic_curves["grad_cos"][1]
    )
    pngs = [plot_reward_curves(s, tmp_path / "a.png"), plot_cumulative(s, tmp_path / "b.png")]
    pngs.append(plot_sources([*s, with_diag], tmp_path / "c.png"))
    for path in pngs:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_objective_axis_and_reference_split_plan() -> None:
    cfg = ExperimentConfig(
        splits=("8/0", "4/4"), reference_splits=("16/0",), seeds=2, sampling=("uniform", "advantage"),
        objectives=("plain", "tis"),
    )  # fmt: skip
    runs = plan_runs(cfg)
    # per seed: 8/0 and 16/0 once, 4/4 under each of 2 policies x 2 objectives
    assert len(runs) == 2 * (2 + 4)
    assert Run("uniform", 16, 0, 0, "plain") in runs and Run("advantage", 4, 4, 100, "tis") in runs
    assert Run("advantage", 4, 4, 0, "tis").name == "runs/advantage+tis/4-4/seed0"
    assert Run("advantage", 4, 4, 0, "plain").name == "runs/advantage/4-4/seed0"  # plain keeps the old layout
    assert labels(cfg) == ["uniform", "uniform+tis", "advantage", "advantage+tis"]
    assert cfg.baseline_split == "8/0"
    with pytest.raises(ValueError, match="reference split 4/4"):
        ExperimentConfig(splits=("8/0", "4/4"), reference_splits=("4/4",))
    with pytest.raises(ValueError, match="objective 'magic'"):
        ExperimentConfig(objectives=("magic",))


def test_local_command_carries_the_objective(tmp_path: Path) -> None:
    cmd = local_command(ExperimentConfig(), Run("advantage", 4, 4, 0, "baseline+tis"), tmp_path)
    args = build_parser().parse_args(cmd[3:])
    assert (args.baseline, args.is_cap, args.min_token_logp) == ("receiver", 1.0, None)
    assert args.diagnose_groups
    filt = build_parser().parse_args(local_command(ExperimentConfig(), Run("uniform", 4, 4, 0, "filter"), tmp_path)[3:])
    assert filt.min_token_logp == -5.0 and filt.is_cap == 0.0
    off = config_from_args(build_parser().parse_args(["experiment", "--no-diagnose-groups"]))
    assert not off.diagnose_groups


def test_reference_split_is_not_the_baseline() -> None:
    runs = [run("8/0", 0, [1.0]), run("16/0", 0, [3.0]), run("4/4", 0, [2.0])]
    s = {x.split: x for x in summarize(runs, baseline_split="8/0")}
    assert s["16/0"].ratio == pytest.approx(3.0) and s["4/4"].ratio == pytest.approx(2.0)
    table = markdown_table(list(s.values()), reference_splits=("16/0",))
    assert "| 16/0 (not equal compute) |" in table


def test_sign_flip_and_paired_t_by_hand() -> None:
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.125
    assert sign_flip_p([1.0, -1.0]) == 0.75  # flips giving sum >= 0: ++, --(sum 0), -+ ... 3 of 4
    assert sign_flip_p([-1.0, -2.0]) == 1.0
    runs = [run("8/0", s, [1.0, 1.0]) for s in (0, 100, 200)]
    runs += [run("4/4", 0, [1.5, 1.5]), run("4/4", 100, [1.2, 1.2]), run("4/4", 200, [1.1, 1.1])]
    (t,) = paired_tests(runs, "8/0")
    assert t.seeds == [0, 100, 200] and t.ratios == pytest.approx([1.5, 1.2, 1.1])
    # diffs 1.0, 0.4, 0.2: mean 0.5333, sd 0.4163, t = 0.5333 / (0.4163 / sqrt 3) = 2.219, 2 df: p = 0.1567
    assert t.mean_diff == pytest.approx(0.5333, abs=1e-3) and t.t_p == pytest.approx(0.1567, abs=1e-3)
    assert t.sign_p == 0.125
    assert "| uniform | 4/4 | 3 | 1.50, 1.20, 1.10 | 1.267 | 0.157 | 0.125 |" in paired_table([t])


def test_node_diagnostics_average_rounds_that_used_both_sources() -> None:
    both = {
        "trained_sources": {
            "local": {"completions": 8, "token_logp": -2.0, "weight": 1.0, "adv_share": 0.25},
            "ext:a": {"completions": 8, "token_logp": -4.0, "weight": 0.5, "adv_share": 0.5},
            "ext:b": {"completions": 24, "token_logp": -8.0, "weight": 0.1, "adv_share": 0.25},
        },
        "grad_local": 1.0, "grad_external": 3.0, "grad_cos": 0.5,
    }  # fmt: skip
    local_only = {"trained_sources": {"local": {"completions": 8, "token_logp": -1.0}}, "grad_local": 1.0}
    d = node_diagnostics([both, local_only, {}])
    assert d["token_logp_local"] == -2.0 and d["token_logp_external"] == pytest.approx(-7.0)  # (8*-4 + 24*-8) / 32
    assert d["weight_external"] == pytest.approx(0.2) and d["adv_share_external"] == pytest.approx(0.75)
    assert d["grad_share_external"] == pytest.approx(0.75) and d["grad_cos"] == 0.5
    summary = summarize([RunResult("uniform", "4/4", 0, (NodeResult("p", "m", (0.1,), diagnostics=d),))])
    assert "| uniform | 4/4 | 1 | -2.000 | -7.000 | 0.200 | 0.750 | 0.750 | 0.500 |" in diagnostics_table(summary)


def test_run_load_and_its_line(tmp_path: Path) -> None:
    load = RunLoad.of([0.5, 4.0, 6.0, 8.0])
    assert (load.start, load.mean, load.max) == (0.5, 6.0, 8.0) and load.cpus >= 1
    runs = [Run("advantage", 8, 0, 0).name, Run("advantage", 4, 4, 0).name, Run("advantage", 4, 4, 100).name]
    assert load_line(tmp_path, runs) == ""  # nothing recorded (runs from before loads were kept)
    for r, x in zip(runs[:2], (load, RunLoad(1.0, 3.0, 3.5, load.cpus)), strict=True):
        (tmp_path / r).mkdir(parents=True)
        write_atomic(tmp_path / r / "load.json", json.dumps(x.__dict__))
    (tmp_path / runs[2]).mkdir(parents=True)
    (tmp_path / runs[2] / "load.json").write_text("{not json")  # a torn file is skipped, not fatal
    line = load_line(tmp_path, runs)
    assert "each of 2 runs: run means 3.0-6.0 (median 6.0), highest 8.0" in line
    assert "in parts" not in line
    write_atomic(tmp_path / runs[1] / "load.json", json.dumps(load.then(load).__dict__))
    assert "1 of them ran in parts" in load_line(tmp_path, runs)


def test_the_parts_of_a_resumed_run_add_up_to_its_load_and_wall_time() -> None:
    first, second = RunLoad.of([0.5, 2.0, 4.0], wall_s=60.0), RunLoad.of([3.0, 8.0], wall_s=30.0)
    both = first.then(second)
    assert (both.start, both.max, both.samples, both.wall_s, both.parts) == (0.5, 8.0, 3, 90.0, 2)
    assert both.mean == pytest.approx((3.0 * 2 + 8.0) / 3, abs=0.01)  # every sample weighs the same


def test_a_stopped_run_goes_on_only_when_every_node_left_a_checkpoint(tmp_path: Path) -> None:
    for peer in ("aaaaaa", "bbbbbb"):
        (tmp_path / peer).mkdir()
        (tmp_path / peer / "metrics.jsonl").write_text("")
    assert not resumable(tmp_path, 2)  # stopped before any checkpoint: it starts over
    (tmp_path / "aaaaaa" / "checkpoint.pt").write_bytes(b"x")
    assert not resumable(tmp_path, 2)  # one node would start fresh beside a resumed partner
    (tmp_path / "bbbbbb" / "checkpoint.prev.pt").write_bytes(b"x")  # a torn current one falls back to this
    assert resumable(tmp_path, 2)
    assert not resumable(tmp_path, 3)  # a node never started


def test_a_real_lm_sweep_passes_its_adapter_and_memory_settings_to_every_node(tmp_path: Path) -> None:
    flags = ["--models", "smollm2-135m", "--adapter", "lora", "--lora-rank", "8", "--gradient-checkpointing",
             "--micro-batch", "2", "--device", "cpu", "--eval-timeout", "600"]  # fmt: skip
    cfg = config_from_args(build_parser().parse_args(["experiment", *flags, "--splits", "4/0,2/2"]))
    args = build_parser().parse_args(local_command(cfg, Run("advantage", 2, 2, 0), tmp_path)[3:])
    assert (args.adapter, args.lora_rank, args.gradient_checkpointing) == ("lora", 8, True)
    assert (args.micro_batch_size, args.device, args.eval_timeout_s) == (2, "cpu", 600.0)
    default = build_parser().parse_args(local_command(ExperimentConfig(), Run("advantage", 4, 4, 0), tmp_path)[3:])
    assert (default.adapter, default.gradient_checkpointing, default.micro_batch_size) == ("none", False, 0)


def test_the_sweep_names_the_checkpoint_files_a_node_writes() -> None:
    """parts.py names them without importing torch; they must stay the node's names."""
    from node.core import checkpoint
    from node.experiments.parts import CHECKPOINT_FILES

    assert CHECKPOINT_FILES == (checkpoint.CURRENT, checkpoint.PREVIOUS)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_each_objective_reaches_the_nodes_trainer_config(tmp_path: Path, objective: str) -> None:
    # the whole way a run's objective travels: sweep -> local's flags -> a node's flags -> its OffPolicyConfig
    cfg = ExperimentConfig(objectives=(objective,), splits=("4/4",))
    run = next(r for r in plan_runs(cfg) if r.external)
    local_args = build_parser().parse_args(local_command(cfg, run, tmp_path)[3:])
    node_args = build_parser().parse_args(child_argv(local_args, 0, "tiny-m", tmp_path, []))
    _, parts = node_configs(options_from(NodeOptions, node_args), "127.0.0.1", 0)
    preset = OffPolicyConfig.preset(objective)
    assert set(OBJECTIVES[objective]) <= {f.name for f in fields(LocalOptions)}, "a preset field no node option sets"
    assert {k: getattr(parts.offpolicy, k) for k in OBJECTIVES[objective]} == {
        k: getattr(preset, k) for k in OBJECTIVES[objective]
    }


def test_a_sweep_compares_what_a_node_does_unless_told_otherwise() -> None:
    # one source: the default objective is the preset equal to a node's own off-policy defaults, every field named
    (name,) = ExperimentConfig().objectives
    node = OffPolicyConfig()
    assert all(getattr(node, k) == v for k, v in OBJECTIVES[name].items()) and name == "baseline+guide+adapt"
    assert all(set(p) == set(OBJECTIVES["plain"]) for p in OBJECTIVES.values())
