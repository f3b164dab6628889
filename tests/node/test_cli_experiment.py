"""``swarm-node experiment``'s flags: the node's generator makes them, in the spellings they always had."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from node.cli.configfile import subcommand_parser
from node.cli.flags import add_option_flags
from node.cli.main import build_parser
from node.core.options import option_fields
from node.experiments.config import ExperimentConfig

OWN = {"help", "config", "verbose"}  # the command's own flags, not ExperimentConfig fields

SPELLINGS_BEFORE_ONE_GENERATOR = [
    "--nodes", "--splits", "--seeds", "--seed-base", "--rounds", "--sampling", "--objectives", "--sync-every",
    "--outer-lr", "--outer-momentum", "--sync-aggregator", "--warm-start", "--eval-every", "--eval-items",
    "--eval-samples", "--primary", "--reference-splits", "--no-diagnose-groups", "--tasks", "--models",
    "--generations", "--lr", "--max-new-tokens", "--round-timeout", "--min-generate", "--out", "--no-progress",
]  # fmt: skip
"""``swarm-node experiment --help``'s field flags, in order, from when the command had a generator of its own."""
ADDED_SINCE = [
    "--sync-period", "--sync-window", "--lr-schedule", "--lr-decay-rounds", "--lr-floor",
    "--adapter", "--lora-rank", "--gradient-checkpointing", "--micro-batch", "--device", "--eval-timeout",
    "--checkpoint-every", "--report-to",
]  # fmt: skip
"""Flags added after that (a sync on a clock, a learning-rate schedule, a real LM's sweep, runs in parts, scalars
to TensorBoard or W&B), each the node's own spelling."""


def _fields(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in OWN}


def _shape(action: argparse.Action) -> tuple[Any, ...]:
    """Everything about a flag that its generator decides."""
    kind = (type(action), action.type, action.default, action.const, action.nargs, action.metavar)
    return (*kind, action.option_strings, action.help, action.choices)


def test_every_experiment_flag_is_the_shared_generators_output() -> None:
    assert option_fields(ExperimentConfig) == list(dataclasses.fields(ExperimentConfig)), "every field an option"
    generated = argparse.ArgumentParser()
    add_option_flags(generated, ExperimentConfig, overlay=True)
    made = _fields(generated)
    actual = _fields(subcommand_parser(build_parser(), "experiment"))
    assert list(actual) == list(made) == [f.name for f in dataclasses.fields(ExperimentConfig)]
    for name, action in actual.items():
        assert _shape(action) == _shape(made[name]), name
    groups = {a.dest: g.title for g in generated._action_groups for a in g._group_actions}
    for group in subcommand_parser(build_parser(), "experiment")._action_groups:
        assert all(groups[a.dest] == group.title for a in group._group_actions if a.dest not in OWN)


def test_experiment_flags_keep_their_spellings() -> None:
    actual = _fields(subcommand_parser(build_parser(), "experiment"))
    spellings = [s for a in actual.values() for s in a.option_strings]
    assert [s for s in spellings if s not in ADDED_SINCE] == SPELLINGS_BEFORE_ONE_GENERATOR
    assert [s for s in spellings if s in ADDED_SINCE] == ADDED_SINCE
    assert all(a.default is None for a in actual.values()), "a flag not given lets --config's value through"
    given = ["--splits", "8/0,4/4", "--sync-every", "0, 10", "--no-diagnose-groups", "--no-progress", "--lr", "0.01"]
    args = build_parser().parse_args(["experiment", *given])
    assert (args.splits, args.sync_every) == (("8/0", "4/4"), ("0", "10"))  # the config makes rounds whole numbers
    assert (args.diagnose_groups, args.progress) == (False, False)
    assert (args.learning_rate, args.nodes, args.sampling) == (0.01, None, None)


def test_experiment_help_shows_each_default_and_choice() -> None:
    text = " ".join(subcommand_parser(build_parser(), "experiment").format_help().split())
    assert "--splits SPLITS Local/external splits" in text and "(comma-separated; default: 8/0,6/2,4/4,2/6)" in text
    assert "(default: 150)" in text and "(default: runs/experiment)" in text and "(default: centered_clip)" in text
    assert "--sync-aggregator {mean,trimmed_mean,median,centered_clip}" in text
    assert "--no-progress off: Show a progress display." in text


def test_a_sweep_default_unlike_a_nodes_says_so_in_its_help() -> None:
    # the sweep runs what a node runs unless its help states the difference (None: the node's own default)
    from node.core.options import LocalOptions

    node = {f.name: f.default for f in dataclasses.fields(LocalOptions)}
    axes = {"sampling", "sync_every"}  # one node value per run (the sweep's list)
    for f in dataclasses.fields(ExperimentConfig):
        if f.name in node and f.name not in axes and f.default not in (node[f.name], None, ()):
            assert "a node's" in f.metadata["help"], f"{f.name}: {f.default!r} vs a node's {node[f.name]!r}"


def test_a_sweep_with_a_run_its_nodes_would_refuse_stops_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from node.cli.main import main

    out = tmp_path / "sweep"
    assert main(["experiment", "--splits", "2/0,1/1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    run = "run advantage+baseline+guide+adapt 1/1 seed 0"
    assert err.startswith(f"swarm-node: error: {run} would stop at once: --max-source-share")
    assert len(err.splitlines()) == 1 and not out.exists()
