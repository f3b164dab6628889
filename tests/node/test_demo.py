"""``swarm-node demo``: its table, verdict and CSV computed by hand, and its output format on a short real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from node.cli.demo import DemoOptions, NodePair, Points, demo_config, demo_csv, demo_table, pair_nodes, verdict
from node.cli.main import build_parser

ALONE: dict[str, Points] = {"reward": ((0, 0.1), (10, 0.2)), "accuracy": ((0, 0.4), (10, 0.5))}
SWARM: dict[str, Points] = {"reward": ((0, 0.1), (10, 0.3)), "accuracy": ((0, 0.4), (10, 0.6))}


def test_a_pair_divides_the_swarms_final_by_alones() -> None:
    assert NodePair(0, ALONE, SWARM).ratio("reward") == pytest.approx(1.5)
    assert NodePair(0, ALONE, SWARM).ratio("accuracy") == pytest.approx(1.2)
    assert NodePair(0, {}, SWARM).ratio("reward") is None
    assert NodePair(0, {"reward": ((10, 0.0),)}, SWARM).ratio("reward") is None  # no ratio to a zero


def test_the_table_has_a_row_per_node_and_the_mean_of_each_arm() -> None:
    flat: dict[str, Points] = {"reward": ((0, 0.1), (10, 0.1)), "accuracy": ((0, 0.4), (10, 0.3))}
    table = demo_table([NodePair(0, ALONE, SWARM), NodePair(1, flat, flat)]).splitlines()
    assert table[0] == ("| node | sampled reward, alone | swarm | ratio | greedy accuracy, alone | swarm | ratio |")
    assert table[2] == "| 0 | 0.200 | 0.300 | 1.50x | 0.500 | 0.600 | 1.20x |"
    assert table[3] == "| 1 | 0.100 | 0.100 | 1.00x | 0.300 | 0.300 | 1.00x |"
    # means: reward 0.15 -> 0.20, accuracy 0.40 -> 0.45
    assert table[4] == "| **mean** | **0.150** | **0.200** | **1.33x** | **0.400** | **0.450** | **1.12x** |"
    assert "round 0: 0.100 sampled reward, 0.400 greedy" in table[-1]


def test_the_verdict_judges_the_sampled_reward_and_says_one_seed_is_no_measurement() -> None:
    line = verdict([NodePair(0, ALONE, SWARM), NodePair(1, ALONE, ALONE)])  # 0.25 / 0.20
    assert "1.25x the held-out sampled reward" in line and "1 of 2 nodes better" in line and "one seed" in line
    assert "without a held-out evaluation" in verdict([NodePair(0, {}, {})])


def test_the_csv_lists_both_arms_curves_in_long_format() -> None:
    pair = NodePair(3, {"reward": ((0, 0.1),)}, {"accuracy": ((10, 0.6),)})
    assert demo_csv([pair]).splitlines() == [
        "arm,node,measure,round,value",
        "alone,3,reward,0,0.100000",
        "swarm,3,accuracy,10,0.600000",
    ]


def test_nodes_pair_by_index_across_the_arms() -> None:
    def node(curves: dict[str, Points]) -> SimpleNamespace:
        return SimpleNamespace(heldout_reward=curves["reward"], heldout=curves["accuracy"])

    pairs = pair_nodes({0: node(ALONE), 1: node(ALONE)}, {1: node(SWARM), 0: node(ALONE)})
    assert [(p.index, p.ratio("reward")) for p in pairs] == [(0, 1.0), (1, pytest.approx(1.5))]


def test_the_preset_differs_between_the_arms_only_in_the_sync_and_passes_the_node_checks() -> None:
    from node.experiments.sweep import check_sweep, local_options, plan_runs

    cfg = demo_config(DemoOptions(rounds=30, out="/tmp/unused-demo"))
    check_sweep(cfg)
    alone, swarm = (local_options(cfg, r, Path("x")) for r in plan_runs(cfg))
    assert (alone.sync_every, swarm.sync_every) == (0, 1)
    assert alone.min_generate_s == swarm.min_generate_s == 1.5  # equal pace, equal compute
    assert alone.local_groups == swarm.local_groups == 8 and alone.external_groups == swarm.external_groups == 0


def test_the_flags_come_from_the_options() -> None:
    args = build_parser().parse_args(["demo", "--rounds", "12", "--round-s", "0.5", "--no-dashboard"])
    assert (args.rounds, args.round_s, args.no_dashboard) == (12, 0.5, True)


@pytest.mark.process
@pytest.mark.slow
def test_a_short_demo_ends_in_the_table_the_verdict_and_its_files(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "node", "demo", "--rounds", "10", "--round-s", "0.2", "--no-dashboard"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "| node | sampled reward, alone | swarm | ratio | greedy accuracy, alone | swarm | ratio |" in text
    assert sum(line.startswith("| ") and line[2].isdigit() for line in text.splitlines()) == 4
    assert "| **mean** |" in text and "at equal compute, on one seed" in text
    assert (out / "demo.png").stat().st_size > 0 and (out / "demo.md").exists()
    rows = (out / "demo.csv").read_text().splitlines()
    assert rows[0] == "arm,node,measure,round,value"
    assert len(rows) == 1 + 2 * 4 * 2 * 2  # both arms, 4 nodes, 2 measures, rounds 0 and 10
