"""One source of configuration: CLI flags, TOML keys and child command lines come from the option dataclasses,
and their defaults are the components' defaults."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from node.cli.configfile import file_options, render_default_config, subcommand_parser
from node.cli.main import build_parser, node_args_to_list
from node.core.assemble import node_configs
from node.core.config import NodeConfig, NodeParts
from node.core.options import (
    JoinOptions,
    LocalOptions,
    NodeOptions,
    flag_of,
    option_fields,
    sync_partner_warning,
    to_argv,
)
from node.dashboard.server import DashboardConfig
from node.tasks.reasoning_gym import RG_TASK_NAMES
from node.training.grpo import GRPOConfig
from node.training.models import TINY_DEFAULTS, recommended_defaults
from node.training.policy import GenerationConfig
from swarm.sync import OuterSyncConfig

COMMANDS: dict[str, type[NodeOptions]] = {"start": NodeOptions, "join": JoinOptions, "local": LocalOptions}


def _actions(command: str) -> dict[str, argparse.Action]:
    sub = subcommand_parser(build_parser(), command)
    return {a.dest: a for a in sub._actions if a.dest not in ("help", "config")}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_default_is_the_dataclass_default(command: str) -> None:
    cls = COMMANDS[command]
    actions = _actions(command)
    fields = {f.name: f for f in option_fields(cls)}
    assert set(actions) == set(fields), "every flag is a field and every field a flag"
    for name, f in fields.items():
        default = actions[name].default
        assert (tuple(default) if isinstance(default, list) else default) == f.default, name
        assert flag_of(f) in actions[name].option_strings, name


def test_default_options_give_the_components_own_defaults() -> None:
    """The options' literal defaults (kept import-light for a fast CLI) equal each component's default."""
    cfg, parts = node_configs(NodeOptions(), "0.0.0.0", 0)
    assert cfg == NodeConfig()
    assert parts == NodeParts()  # membership, exchange, generation, GRPO, no sync, checkpoints
    assert TINY_DEFAULTS.max_new_tokens == GenerationConfig().max_new_tokens
    assert TINY_DEFAULTS.learning_rate == GRPOConfig().learning_rate
    assert TINY_DEFAULTS.micro_batch_size == GRPOConfig().micro_batch_size
    assert NodeOptions().dashboard_host == DashboardConfig().host


def test_sync_options_feed_the_sync_config() -> None:
    _, parts = node_configs(NodeOptions(sync_every=5), "0.0.0.0", 0)
    assert parts.sync == dataclasses.replace(OuterSyncConfig(), sync_every=5)
    given = NodeOptions(sync_every=5, sync_compression="int8", outer_lr=0.5, outer_momentum=0.0)
    _, parts = node_configs(given, "0.0.0.0", 0)
    assert parts.sync is not None
    assert (parts.sync.compression, parts.sync.outer_lr, parts.sync.outer_momentum) == ("int8", 0.5, 0.0)
    with pytest.raises(ValueError, match="sync-every"):
        node_configs(NodeOptions(sync_every=-1), "0.0.0.0", 0)


def test_a_sync_period_turns_the_shared_clock_on_and_bad_sync_flags_name_the_fix() -> None:
    _, parts = node_configs(NodeOptions(sync_period=30, sync_blocking=True, sync_window=2, sync_timeout=20), "", 0)
    assert parts.sync is not None
    got = (parts.sync.sync_period_s, parts.sync.eager, parts.sync.matchmaking_timeout_s, parts.sync.allreduce_timeout_s)
    assert got == (30, False, 2, 20)
    assert node_configs(NodeOptions(), "", 0)[1].sync is None
    for bad, fix in (
        (NodeOptions(sync_period=0.5), "--sync-period 0.5: use 0"),
        (NodeOptions(sync_every=4, sync_window=0), "--sync-window 0: use a positive"),
        (NodeOptions(sync_every=4, sync_timeout=1), "--sync-timeout 1: use at least 5"),
    ):
        with pytest.raises(ValueError, match=fix):
            node_configs(bad, "", 0)
    warning = sync_partner_warning(0, 100, ["tiny-s", "tiny-m"], sync_period=60)
    assert warning is not None and warning.startswith("--sync-period 60: no two of the 2 nodes")


def test_per_model_defaults_apply_only_to_flags_not_given() -> None:
    smol = recommended_defaults("smollm2-135m")
    _, parts = node_configs(NodeOptions(model="smollm2-135m"), "0.0.0.0", 0)
    assert (parts.generation.max_new_tokens, parts.grpo.learning_rate) == (smol.max_new_tokens, smol.learning_rate)
    _, parts = node_configs(NodeOptions(model="smollm2-135m", max_new_tokens=7, lr=0.01), "0.0.0.0", 0)
    assert (parts.generation.max_new_tokens, parts.grpo.learning_rate) == (7, 0.01)
    # adapters start at zero and are few: their own default, 10x full fine-tuning's; --lr still wins
    _, parts = node_configs(NodeOptions(model="smollm2-135m", adapter="lora"), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == smol.adapter_learning_rate == pytest.approx(10 * smol.learning_rate)
    _, parts = node_configs(NodeOptions(model="smollm2-135m", adapter="lora", lr=0.01), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == 0.01
    _, parts = node_configs(NodeOptions(model="tiny-s", adapter="lora"), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == TINY_DEFAULTS.learning_rate
    # tasks: where the model gets a signal, unless --task is given
    assert node_configs(NodeOptions(model="smollm2-135m"), "", 0)[0].tasks == smol.tasks
    assert set(smol.tasks) < set(RG_TASK_NAMES)
    assert node_configs(NodeOptions(model="smollm2-135m", task=("rg:gcd",)), "", 0)[0].tasks == ("rg:gcd",)
    assert node_configs(NodeOptions(model="/some/hf-folder"), "", 0)[0].tasks == RG_TASK_NAMES
    assert node_configs(NodeOptions(model="tiny-s"), "", 0)[0].tasks == ()  # the node's built-ins


def test_local_hands_children_every_inherited_option() -> None:
    """What ``local`` passes to a child parses, as ``start``, back to the same values."""
    opts = LocalOptions(
        task=("max", "min"), rounds=7, local_groups=3, external_groups=5, generations=4, max_new_tokens=2,
        temperature=0.5, lr=0.01, sampling="advantage", device="cpu", verbose=2, sync_every=3,
        sync_compression="fp16", outer_lr=0.4, checkpoint_every=9, resume=True, swarm_id="s1", adapter="lora",
        lora_rank=8, lora_alpha=16, lora_dropout=0.1, lora_targets="q_proj,v_proj",
    )  # fmt: skip
    argv = node_args_to_list(argparse.Namespace(**dataclasses.asdict(opts)))
    child = build_parser().parse_args(["start", *argv])
    inherited = [f.name for f in option_fields(NodeOptions) if f.metadata["inherit"]]
    assert inherited  # the check below is not vacuous
    for name in inherited:
        got: Any = getattr(child, name)
        assert (tuple(got) if isinstance(got, list) else got) == getattr(opts, name), name


def test_changed_only_argv_round_trips() -> None:
    opts = LocalOptions(nodes=3, local_groups=6, no_dashboard=True, task=("max",))
    argv = to_argv(opts, only="changed")
    assert argv == ["--task", "max", "--local", "6", "--nodes", "3", "--no-dashboard"]
    assert to_argv(LocalOptions(), only="changed") == []


def test_init_file_lists_every_visible_option_once() -> None:
    parser = build_parser()
    text = render_default_config(parser)
    for command in COMMANDS:
        for key in file_options(subcommand_parser(parser, command)):
            assert text.count(f"# {key} = ") + text.count(f"# {key}: unset by default") == 1, key
    assert "ready-file" not in text and "go-file" not in text and "hold" not in text
    assert "(one of: none, fp16, int8)" in text  # a key with choices lists them where it is written


def test_choices_are_the_components_own_and_help_shows_them_with_the_default() -> None:
    from node.core.config import DEVICES
    from node.core.pool import SAMPLING_POLICIES
    from node.training.adapters import ADAPTERS
    from node.training.offpolicy import BASELINES
    from swarm.sync.config import AGGREGATORS, COMPRESSIONS

    actions = _actions("start")
    expected = {
        "sampling": SAMPLING_POLICIES, "external_baseline": BASELINES, "adapter": ADAPTERS, "device": DEVICES,
        "sync_compression": COMPRESSIONS, "sync_aggregator": AGGREGATORS,
    }  # fmt: skip
    for dest, values in expected.items():
        assert tuple(actions[dest].choices or ()) == values, dest
    text = subcommand_parser(build_parser(), "start").format_help()
    assert "{uniform,advantage,credit}" in text and "(default: advantage)" in text
    for dest, action in actions.items():
        switch_or_list = isinstance(action, argparse._StoreTrueAction | argparse._AppendAction | argparse._CountAction)
        if switch_or_list or action.help == argparse.SUPPRESS:
            continue
        assert "default" in str(action.help), f"--{dest}: help does not say its default"


def test_an_experiment_compares_what_a_node_runs_by_default() -> None:
    from node.experiments.config import ExperimentConfig

    assert ExperimentConfig().sampling == (NodeOptions().sampling,)
