"""One source of configuration: CLI flags, TOML keys and child command lines come from the option dataclasses,
and their defaults are the components' defaults."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from node.cli.configfile import file_options, render_default_config, subcommand_parser
from node.cli.main import build_parser, node_args_to_list
from node.core.assemble import FROM_OPTIONS, node_configs
from node.core.config import NodeConfig, NodeParts
from node.core.options import (
    DEFAULT_MODEL,
    RANGE_KEYS,
    JoinOptions,
    LocalOptions,
    NodeOptions,
    flag_of,
    option_fields,
    options_from,
    sync_partner_warning,
    to_argv,
)
from node.dashboard.server import DashboardConfig
from node.tasks.reasoning_gym import RG_TASK_NAMES
from node.training.evaluate import EvalConfig
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


def test_a_default_node_is_built_as_its_components_default_and_tiny_models_evaluate() -> None:
    cfg, parts = node_configs(NodeOptions(), "0.0.0.0", 0)
    assert cfg == NodeConfig()
    # a tiny model evaluates where a component built without options (a test's node) does not
    assert parts == NodeParts(evaluation=EvalConfig(eval_every=TINY_DEFAULTS.eval_every))
    assert TINY_DEFAULTS.eval_every > 0 == EvalConfig().eval_every
    assert TINY_DEFAULTS.max_new_tokens == GenerationConfig().max_new_tokens
    assert TINY_DEFAULTS.learning_rate == GRPOConfig().learning_rate
    assert TINY_DEFAULTS.micro_batch_size == GRPOConfig().micro_batch_size
    assert NodeOptions().dashboard_host == DashboardConfig().host  # the dashboard is above node.core: no from_field


def _declared(f: dataclasses.Field[Any]) -> dict[str, Any]:
    """What a field declares besides its name: help, default, and range with choices (None where it has none)."""
    meta = f.metadata
    limits = (*(meta.get(k) for k in RANGE_KEYS if k != "or_zero"), tuple(meta.get("choices", ())))
    ranged = any(v is not None and v != () for v in limits)
    return {"help": meta.get("help"), "default": f.default, "range": limits if ranged else None}


def restated(option: dataclasses.Field[Any], component: dataclasses.Field[Any]) -> list[str]:
    """What ``option`` declares a second time that ``component`` (the config field it feeds) declares already."""
    mine, theirs = _declared(option), _declared(component)
    if option.metadata.get("source") is not None:  # from_field: only a node-level default of its own may differ
        taken = all(option.metadata[k] == component.metadata.get(k) for k in RANGE_KEYS if k != "or_zero")
        own = ["default"] if option.metadata["node_default"] and mine["default"] == theirs["default"] else []
        return own + ([] if taken and str(mine["help"]).startswith(str(theirs["help"])) else ["help or range"])
    return [k for k, v in mine.items() if v is not None and v == theirs[k]] or ["its own declaration"]


def test_no_option_restates_what_its_component_field_declares() -> None:
    """A component config is the one declaration of its fields' help, default and range: every option that feeds
    one is built from it by from_field (a command's own override, as ``local``'s rounds, declares nothing equal)."""
    owners = {f.name: f for cls in FROM_OPTIONS for f in dataclasses.fields(cls)}
    for command, cls in COMMANDS.items():
        for f in option_fields(cls):
            if f.name not in owners:
                continue
            problems = restated(f, owners[f.name])
            inherited = cls is not NodeOptions and f.name not in vars(cls).get("__annotations__", {})
            if cls is not NodeOptions and not inherited and problems == ["its own declaration"]:
                continue  # a command's override that restates nothing
            assert not problems, f"{command}: --{f.name} restates {problems} of its component field; use from_field"


def test_every_option_fed_component_field_has_help() -> None:
    fed = {f.name for f in option_fields(LocalOptions)} | {f.name for f in option_fields(JoinOptions)}
    for cls in FROM_OPTIONS:
        for f in dataclasses.fields(cls):
            assert f.name not in fed or f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_success_only_guidance_and_the_adaptive_share_are_a_nodes_default_and_each_flag_turns_one_off() -> None:
    assert NodeParts().offpolicy.successes_only and NodeParts().offpolicy.adaptive_share
    args = build_parser().parse_args(["start", "--no-external-successes-only", "--no-adaptive-share"])
    _, parts = node_configs(options_from(NodeOptions, args), "0.0.0.0", 0)
    assert not parts.offpolicy.successes_only and not parts.offpolicy.adaptive_share


def test_sync_options_feed_the_sync_config() -> None:
    _, parts = node_configs(NodeOptions(sync_every=5), "0.0.0.0", 0)
    # a node's outer step is plain averaging (what taught in RL); the library's default stays DiLoCo's
    plain = dataclasses.replace(OuterSyncConfig(), sync_every=5, outer_lr=1.0, outer_momentum=0.0)
    assert parts.sync == plain and OuterSyncConfig().outer_lr == 0.7
    given = NodeOptions(sync_every=5, compression="int8", outer_lr=0.5, outer_momentum=0.0)
    _, parts = node_configs(given, "0.0.0.0", 0)
    assert parts.sync is not None
    assert (parts.sync.compression, parts.sync.outer_lr, parts.sync.outer_momentum) == ("int8", 0.5, 0.0)
    with pytest.raises(ValueError, match="sync-every"):
        node_configs(NodeOptions(sync_every=-1), "0.0.0.0", 0)


def test_a_sync_period_turns_the_shared_clock_on_and_bad_sync_flags_name_the_fix() -> None:
    given = NodeOptions(sync_period_s=30, eager=False, matchmaking_timeout_s=2, allreduce_timeout_s=20)
    _, parts = node_configs(given, "", 0)
    assert parts.sync is not None
    got = (parts.sync.sync_period_s, parts.sync.eager, parts.sync.matchmaking_timeout_s, parts.sync.allreduce_timeout_s)
    assert got == (30, False, 2, 20)
    assert node_configs(NodeOptions(), "", 0)[1].sync is None
    for bad, fix in (
        (NodeOptions(sync_period_s=0.5), "--sync-period must be 0 or >= 1, got 0.5"),
        (NodeOptions(sync_every=4, matchmaking_timeout_s=0), "--sync-window must be > 0, got 0"),
        (NodeOptions(sync_every=4, allreduce_timeout_s=1), "--sync-timeout must be >= 5, got 1"),
    ):
        with pytest.raises(ValueError, match=fix):
            node_configs(bad, "", 0)
    warning = sync_partner_warning(0, 100, ["tiny-s", "tiny-m"], sync_period=60)
    assert warning is not None and warning.startswith("--sync-period 60: no two of the 2 nodes")


def test_per_model_defaults_apply_only_to_flags_not_given() -> None:
    smol = recommended_defaults("smollm2-135m")
    _, parts = node_configs(NodeOptions(model="smollm2-135m"), "0.0.0.0", 0)
    assert (parts.generation.max_new_tokens, parts.grpo.learning_rate) == (smol.max_new_tokens, smol.learning_rate)
    _, parts = node_configs(NodeOptions(model="smollm2-135m", max_new_tokens=7, learning_rate=0.01), "0.0.0.0", 0)
    assert (parts.generation.max_new_tokens, parts.grpo.learning_rate) == (7, 0.01)
    # adapters start at zero and are few: their own default, 10x full fine-tuning's; --lr still wins
    _, parts = node_configs(NodeOptions(model="smollm2-135m", adapter="lora"), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == smol.adapter_learning_rate == pytest.approx(10 * smol.learning_rate)
    _, parts = node_configs(NodeOptions(model="smollm2-135m", adapter="lora", learning_rate=0.01), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == 0.01
    _, parts = node_configs(NodeOptions(model="tiny-s", adapter="lora"), "0.0.0.0", 0)
    assert parts.grpo.learning_rate == TINY_DEFAULTS.learning_rate
    # tasks: where the model gets a signal, unless --task is given
    assert node_configs(NodeOptions(model="smollm2-135m"), "", 0)[0].tasks == smol.tasks
    assert set(smol.tasks) < set(RG_TASK_NAMES)
    assert node_configs(NodeOptions(model="smollm2-135m", tasks=("rg:gcd",)), "", 0)[0].tasks == ("rg:gcd",)
    assert node_configs(NodeOptions(model="/some/hf-folder"), "", 0)[0].tasks == RG_TASK_NAMES
    assert node_configs(NodeOptions(model="tiny-s"), "", 0)[0].tasks == ()  # the node's built-ins
    # held-out evaluation: on for a tiny model (it costs a few rounds), off for a real LM; --eval-every wins
    assert node_configs(NodeOptions(), "", 0)[1].evaluation.eval_every == TINY_DEFAULTS.eval_every > 0
    assert node_configs(NodeOptions(model="smollm2-135m"), "", 0)[1].evaluation.eval_every == 0
    assert node_configs(NodeOptions(model="/some/hf-folder"), "", 0)[1].evaluation.eval_every == 0
    assert node_configs(NodeOptions(eval_every=0), "", 0)[1].evaluation.eval_every == 0
    assert node_configs(NodeOptions(model="smollm2-135m", eval_every=5), "", 0)[1].evaluation.eval_every == 5


def test_local_hands_children_every_inherited_option() -> None:
    """What ``local`` passes to a child parses, as ``start``, back to the same values."""
    opts = LocalOptions(
        tasks=("max", "min"), rounds=7, local_groups=3, external_groups=5, num_generations=4, max_new_tokens=2,
        temperature=0.5, learning_rate=0.01, sampling="advantage", device="cpu", verbose=2, sync_every=3,
        compression="fp16", eager=False, overlap_network=False, outer_lr=0.4, checkpoint_every=9, resume=True,
        swarm_id="s1", adapter="lora",
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
    opts = LocalOptions(nodes=3, local_groups=6, no_dashboard=True, tasks=("max",))
    argv = to_argv(opts, only="changed")
    assert argv == ["--task", "max", "--local", "6", "--nodes", "3", "--no-dashboard"]
    assert to_argv(LocalOptions(), only="changed") == []


def test_init_file_lists_every_visible_option_once() -> None:
    parser = build_parser()
    text = render_default_config(parser)
    for command in COMMANDS:
        for key in file_options(subcommand_parser(parser, command)):
            assert text.count(f"# {key} = ") + text.count(f"# {key}: unset by default") == 1, key
    assert not re.search(r"\b(ready.file|go.file|hold)\b", text)  # the flags `local` gives its children
    assert "(one of: none, fp16, int8)" in text  # a key with choices lists them where it is written


def test_help_shows_the_choices_with_the_default() -> None:
    actions = _actions("start")
    text = subcommand_parser(build_parser(), "start").format_help()
    assert "{uniform,advantage,credit}" in text and "(default: advantage)" in text
    for dest, action in actions.items():
        switch_or_list = isinstance(
            action,
            argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._AppendAction | argparse._CountAction,
        )
        if switch_or_list or action.help == argparse.SUPPRESS:
            continue
        assert "default" in str(action.help), f"--{dest}: help does not say its default"


# ---- options -> components: matched by name, defaults carried through -------------------------------------

CLI_ONLY = {
    "verbose", "dashboard_port", "dashboard_host", "ready_file", "hold", "go_file",  # the process's, not a node's
    "host_port", "peer",  # resolved by the CLI into the membership's host, port and initial_peers
    "nodes", "isolated", "models", "round_timeout", "no_dashboard", "fresh_processes",  # local's own
}  # fmt: skip
"""The options no component config receives."""


def test_every_option_feeds_a_component_field_of_its_own_name() -> None:
    """The assembly matches names: an option renamed on either side would feed nothing and fail here."""
    fed = {f.name for cls in FROM_OPTIONS for f in dataclasses.fields(cls)}
    for command, cls in COMMANDS.items():
        names = {f.name for f in option_fields(cls)}
        assert names - fed == names & CLI_ONLY, f"{command}: options that feed no component field of their name"


def _received(argv: list[str]) -> dict[str, Any]:
    """What the components of a node started with ``argv`` receive, by option name."""
    opts = options_from(NodeOptions, build_parser().parse_args(argv))
    cfg, parts = node_configs(opts, "127.0.0.1", 0)
    names = {f.name for f in option_fields(NodeOptions)}
    configs = [cfg, *(getattr(parts, f.name) for f in dataclasses.fields(parts))]
    return {
        f.name: getattr(c, f.name) for c in configs if c is not None for f in dataclasses.fields(c) if f.name in names
    }


def _expected(defaults: type[NodeOptions], model: str, **given: Any) -> dict[str, Any]:
    """Each option's default (of the command's options), ``given`` where set, then the model's own defaults
    where an option is left unset (the one table of :func:`node.core.assemble.per_model`)."""
    out = {f.name: f.default for f in option_fields(NodeOptions)} | {"model": model}
    out |= {f.name: f.default for f in option_fields(defaults) if f.name in out} | given
    rec = recommended_defaults(model)
    out["tasks"] = out["tasks"] or rec.tasks
    out["max_new_tokens"] = out["max_new_tokens"] or rec.max_new_tokens
    out["micro_batch_size"] = out["micro_batch_size"] or rec.micro_batch_size
    out["eval_every"] = rec.eval_every if out["eval_every"] is None else out["eval_every"]
    out["learning_rate"] = rec.lr(out["adapter"]) if out["learning_rate"] is None else out["learning_rate"]
    return out


def _check(received: dict[str, Any], expected: dict[str, Any]) -> None:
    wrong = {k: (v, expected[k]) for k, v in received.items() if v != expected[k]}
    assert not wrong, f"option -> (component received, expected): {wrong}"


@pytest.mark.parametrize("flags", [[], ["--sync-period", "60"]], ids=["no flags", "sync on"])
def test_start_components_receive_the_option_defaults(flags: list[str]) -> None:
    received = _received(["start", *flags])
    given = {"sync_period_s": 60.0} if flags else {}
    _check(received, _expected(NodeOptions, DEFAULT_MODEL, **given))
    fed = {f.name for f in dataclasses.fields(OuterSyncConfig)} & {f.name for f in option_fields(NodeOptions)}
    assert (fed <= set(received)) == bool(flags)  # every sync option reached the sync when it is on


def _local_child(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """``local``'s first node: its command line, and what ``local`` sets for it beyond the options it hands on."""
    from node.cli.local import child_argv, node_models

    model, log_dir = node_models(args)[0], Path(args.log_dir)
    argv = child_argv(args, 0, model, log_dir, [])
    own = {"model": model, "identity": str(log_dir / "keys" / "node0.key"), "max_threads": 1, "log_dir": args.log_dir}
    return argv, own


def test_local_components_receive_the_option_defaults() -> None:
    argv, own = _local_child(build_parser().parse_args(["local"]))
    _check(_received(argv), _expected(LocalOptions, own.pop("model"), **own))


def test_experiment_components_receive_the_option_defaults(tmp_path: Path) -> None:
    """An experiment's own defaults where it has the option, the node's elsewhere."""
    from node.experiments.config import ExperimentConfig
    from node.experiments.sweep import local_command, plan_runs
    from node.training.offpolicy import OffPolicyConfig

    cfg = ExperimentConfig()
    run = plan_runs(cfg)[0]
    args = build_parser().parse_args(local_command(cfg, run, tmp_path)[3:])
    argv, own = _local_child(args)
    preset = OffPolicyConfig.preset(run.objective)
    experiment = {
        "rounds": cfg.rounds, "eval_every": cfg.eval_every, "eval_items": cfg.eval_items,
        "eval_samples": cfg.eval_samples, "max_new_tokens": cfg.max_new_tokens, "tasks": cfg.tasks,
        "num_generations": cfg.num_generations, "learning_rate": cfg.learning_rate,
        "diagnose_groups": cfg.diagnose_groups, "min_generate_s": cfg.min_generate_s,
        "warm_start_steps": cfg.warm_start_steps, "checkpoint_every": cfg.checkpoint_every,
        # the run's place in the sweep
        "sampling": run.sampling, "local_groups": run.local, "external_groups": run.external, "seed": run.seed,
        "sync_every": run.sync_every, "swarm_id": f"exp-{run.label}-{run.local}-{run.seed}",
        "min_token_logp": preset.min_token_logp, "is_cap": preset.is_cap, "baseline": preset.baseline,
    }  # fmt: skip
    _check(_received(argv), _expected(LocalOptions, own.pop("model"), **experiment, **own))


def _other_values(value: Any) -> list[Any]:
    """Values unlike ``value`` of its kind, to try in turn until one is valid."""
    if value is None:
        return [-5.0, 0.01]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int | float):
        return [value + 1, value + 2, value / 2 if value else 0.5, -5.0]
    if isinstance(value, tuple):
        return [("max",), ("/ip4/127.0.0.1/tcp/1",)]
    words = ["tiny-m", "q_proj", "none", "group", "fp16", "median", "cpu", "uniform", "cosine", "elsewhere", "float32"]
    return [*words, "tensorboard"]  # --report-to's: tensorboard is in the test extra


def test_a_changed_option_reaches_its_component() -> None:
    """A field dropped from the assembly would leave its component at its own default; here every option-fed
    field is changed, one at a time, to a valid value, and the component must receive it."""
    # the sync, adapter and schedule options live
    base = NodeOptions(sync_every=3, adapter="lora", lr_scheduler_type="linear", lr_decay_rounds=100)
    argv = ["start", "--sync-every", "3", "--adapter", "lora", "--lr-schedule", "linear", "--lr-decay-rounds", "100"]
    for name, value in _received(argv).items():
        for other in (v for v in _other_values(value) if v != value):
            try:
                cfg, parts = node_configs(dataclasses.replace(base, **{name: other}), "127.0.0.1", 0)
            except (ValueError, TypeError):
                continue
            configs = [cfg, *(getattr(parts, f.name) for f in dataclasses.fields(parts))]
            got = [getattr(c, name) for c in configs if c is not None and hasattr(c, name)]
            assert got == [other], f"{name}={other!r} reached its component as {got}"
            break
        else:
            pytest.fail(f"no valid other value to try for {name}")


def test_a_swarm_that_evaluates_is_not_given_up_on_while_it_evaluates() -> None:
    """A real model's held-out evaluation takes minutes on a CPU, between two rounds: local waits for it."""
    from node.cli.local import stall_bound

    def bound(*flags: str) -> tuple[float, str]:
        return stall_bound(build_parser().parse_args(["local", *flags]))

    assert bound() == (120.0, "--round-timeout")
    assert bound("--eval-every", "10", "--eval-timeout", "600") == (720.0, "--round-timeout + --eval-timeout")
    assert bound("--eval-every", "0", "--eval-timeout", "600", "--round-timeout", "30") == (30.0, "--round-timeout")
