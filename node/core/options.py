"""Every option a user sets on a node, in one place: the CLI flags, TOML keys and child flag lists come from here.

:class:`NodeOptions` lists the options of ``start``, ``join`` and ``local``
(with :class:`JoinOptions` and :class:`LocalOptions` adding their own). Each
field carries its help text and CLI spelling in its metadata;
:mod:`node.cli.flags` turns the fields into argparse flags (and so into the
keys of the config file and the file ``swarm-node init`` writes), and
:func:`to_argv` turns values back into a command line for child processes.

This module imports only the standard library and the component configs'
stdlib-only modules (:mod:`node.core.configs`, :mod:`node.training.configs`,
:mod:`node.training.offpolicy`, :mod:`swarm.configs`), so parsing the command
line (and every one-sentence error) stays fast. Where an option feeds a
component's config it is built by :func:`from_field` from that config field,
the one declaration of its help, default, range and choices; the option adds
only the user's spelling (e.g. ``--sync-window`` for ``matchmaking_timeout_s``)
and, where the node's default differs (0 or None: the model's own), that
default. :func:`node.core.assemble.node_configs` builds the components by
matching names; ``tests/node/test_options.py`` walks every option and refuses
one that restates what its component field declares.
"""

from __future__ import annotations

import importlib.util
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from node.core.configs import DEFAULT_IDENTITY as DEFAULT_IDENTITY
from node.core.configs import DEFAULT_MODEL as DEFAULT_MODEL
from node.core.configs import REPORT_TO as REPORT_TO
from node.core.configs import CheckpointConfig, IngestConfig, NodeConfig
from node.training.configs import AdapterConfig, EvalConfig, GenerationConfig, GRPOConfig
from node.training.offpolicy import OffPolicyConfig
from swarm.configs import MembershipConfig, OuterSyncConfig
from swarm.declared import broken_rule, number_text

NODE = "node"
SYNC = "outer sync (DiLoCo, among peers of the same architecture)"
CHECKPOINTS = "checkpoints"
DASHBOARD = "dashboard"
NETWORK = "network"
OFFPOLICY = "peers' completions in the loss (off-policy)"
ADAPTER = "adapter (train a small add-on, the base model frozen)"
EVAL = "held-out evaluation (questions no node trains on)"


def option(
    default: Any,
    help: str,
    *,
    group: str = NODE,
    flag: str = "",
    short: str = "",
    count: bool = False,
    hidden: bool = False,
    inherit: bool = False,
    choices: tuple[str, ...] = (),
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    or_zero: bool = False,
    csv: bool = False,
) -> Any:
    """A dataclass field that is also a CLI flag.

    The field is named as the component config field it feeds (the node's
    assembly matches them by name); ``flag`` is the user's spelling where it
    differs (default ``--field-name``). ``count`` makes a repeatable switch
    (``-vv``); ``hidden`` flags are internal (not in help or config files);
    ``inherit`` marks options that ``local`` hands to every child node. A
    ``bool`` field is a switch that sets the opposite of its default (so
    ``--wait-network`` turns ``overlap_network`` off; one on by default without
    its own ``flag`` is ``--no-field-name``); a ``tuple[str, ...]`` field is a
    repeatable flag, or with ``csv`` one flag of comma-separated values
    (``--splits 8/0,4/4``). ``choices`` are the only values the flag takes
    (argparse refuses any other before anything heavy is imported). A number's
    range is ``min``/``max`` (inclusive) and ``above``/``below`` (exclusive);
    ``or_zero`` also admits 0 (off). :func:`check_options` checks them as the
    command line is parsed, before anything heavy is imported.
    """
    meta = {"help": help, "group": group, "flag": flag, "short": short, "count": count}
    meta |= {"hidden": hidden, "inherit": inherit, "choices": choices, "csv": csv}
    meta |= bounds(min=min, max=max, above=above, below=below, or_zero=or_zero)
    return field(default=default, metadata=meta)


RANGE_KEYS = ("min", "max", "above", "below", "or_zero")
"""A number field's range keys in its metadata (see :func:`option`); a component field declares them the same way."""
FROM_SOURCE = ("help", "choices", *RANGE_KEYS)
"""What an option built by :func:`from_field` takes from its component field."""
_SOURCE: Any = object()  # from_field's "the component field's own default"


def from_field(
    source: type[Any],
    name: str,
    *,
    default: Any = _SOURCE,
    or_zero: bool = False,
    note: str = "",
    group: str = NODE,
    flag: str = "",
    short: str = "",
    count: bool = False,
    hidden: bool = False,
    inherit: bool = False,
    csv: bool = False,
) -> Any:
    """An :func:`option` that feeds field ``name`` of component config ``source``: its help, range, choices and
    default are that field's (the one place they are declared); only the CLI's spelling is given here.

    A node-level ``default`` (e.g. 0 or None for "the model's own", found by :mod:`node.core.assemble`)
    replaces the component's, ``or_zero`` admits that 0 beside the component's range, and ``note`` adds
    what that default means to the help in parentheses. ``tests/node/test_options.py`` walks every option
    and refuses one that restates what its component field declares.
    """
    src = next(f for f in fields(source) if f.name == name)
    meta = {k: src.metadata.get(k) for k in RANGE_KEYS} | {"choices": tuple(src.metadata.get("choices", ()))}
    meta["or_zero"] = bool(meta["or_zero"]) or or_zero
    meta |= {"help": f"{src.metadata['help']} ({note})" if note else src.metadata["help"], "source": source}
    meta |= {"group": group, "flag": flag, "short": short, "count": count, "hidden": hidden, "inherit": inherit}
    meta |= {"csv": csv, "node_default": default is not _SOURCE}
    return field(default=src.default if default is _SOURCE else default, metadata=meta)


def bounds(
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    or_zero: bool = False,
) -> dict[str, Any]:
    """A number field's range as field metadata, read by :func:`range_error` and :func:`swarm.declared.check_declared`
    (see :func:`option`)."""
    return {"min": min, "max": max, "above": above, "below": below, "or_zero": or_zero}


def first_option_error(obj: Any, flagged: list[Any]) -> str | None:
    """The first of ``flagged`` (fields of ``obj``) whose value lies outside its range (:func:`range_error`) or
    its choices (:func:`choice_error`)."""
    for f in flagged:
        value = getattr(obj, f.name)
        problem = range_error(f, value) or choice_error(f, value)
        if problem:
            return problem
    return None


@dataclass
class NodeOptions:
    """The options of every node command (``start``, ``join``, ``local``)."""

    model: str = from_field(NodeConfig, "model")
    tasks: tuple[str, ...] = from_field(NodeConfig, "tasks", flag="--task", inherit=True)
    accept_tasks: tuple[str, ...] = from_field(NodeConfig, "accept_tasks", flag="--accept-task", inherit=True)
    accept_tokens: int = from_field(IngestConfig, "accept_tokens", inherit=True)
    seed: int = from_field(NodeConfig, "seed")
    rounds: int = from_field(NodeConfig, "rounds", inherit=True)
    warm_start_steps: int = from_field(NodeConfig, "warm_start_steps", flag="--warm-start", inherit=True)
    local_groups: int = from_field(NodeConfig, "local_groups", flag="--local", inherit=True)
    external_groups: int = from_field(NodeConfig, "external_groups", flag="--external", inherit=True)
    num_generations: int = from_field(NodeConfig, "num_generations", flag="--generations", inherit=True)
    max_new_tokens: int = from_field(
        GenerationConfig,
        "max_new_tokens",
        inherit=True,
        default=0,
        or_zero=True,
        note="0: the model's default: 1 for built-in tiny models, 32 smollm2-135m, else 64",
    )
    temperature: float = from_field(GenerationConfig, "temperature", inherit=True)
    sample_precision: str = from_field(GenerationConfig, "sample_precision", inherit=True)
    learning_rate: float | None = from_field(
        GRPOConfig,
        "learning_rate",
        flag="--lr",
        inherit=True,
        default=None,
        note="default: the model's: 1e-3 tiny, 2e-6 smollm2-135m, 2e-5 with --adapter lora",
    )
    lr_scheduler_type: str = from_field(GRPOConfig, "lr_scheduler_type", flag="--lr-schedule", inherit=True)
    lr_decay_rounds: int = from_field(GRPOConfig, "lr_decay_rounds", inherit=True)
    min_lr_rate: float = from_field(GRPOConfig, "min_lr_rate", flag="--lr-floor", inherit=True)
    sampling: str = from_field(NodeConfig, "sampling", inherit=True)
    max_source_share: float = from_field(NodeConfig, "max_source_share", inherit=True)
    min_token_logp: float | None = from_field(
        OffPolicyConfig, "min_token_logp", group=OFFPOLICY, flag="--external-min-logp", inherit=True
    )
    is_cap: float = from_field(OffPolicyConfig, "is_cap", group=OFFPOLICY, flag="--external-is-cap", inherit=True)
    max_publisher_share: float = from_field(OffPolicyConfig, "max_publisher_share", group=OFFPOLICY, inherit=True)
    max_logp_gap: float = from_field(
        OffPolicyConfig, "max_logp_gap", group=OFFPOLICY, flag="--external-max-logp-gap", inherit=True
    )
    baseline: str = from_field(OffPolicyConfig, "baseline", group=OFFPOLICY, flag="--external-baseline", inherit=True)
    successes_only: bool = from_field(
        OffPolicyConfig, "successes_only", group=OFFPOLICY, flag="--no-external-successes-only", inherit=True
    )
    adaptive_share: bool = from_field(
        OffPolicyConfig, "adaptive_share", group=OFFPOLICY, flag="--no-adaptive-share", inherit=True
    )
    share_threshold: float = from_field(OffPolicyConfig, "share_threshold", group=OFFPOLICY, inherit=True)
    gradient_checkpointing: bool = from_field(GRPOConfig, "gradient_checkpointing", inherit=True)
    micro_batch_size: int = from_field(
        GRPOConfig,
        "micro_batch_size",
        flag="--micro-batch",
        inherit=True,
        default=0,
        or_zero=True,
        note="0: the model's default",
    )
    diagnose_groups: bool = from_field(NodeConfig, "diagnose_groups", group=OFFPOLICY, inherit=True)
    adapter: str = from_field(AdapterConfig, "adapter", group=ADAPTER, inherit=True)
    lora_rank: int = from_field(AdapterConfig, "lora_rank", group=ADAPTER, inherit=True)
    lora_alpha: int = from_field(AdapterConfig, "lora_alpha", group=ADAPTER, inherit=True)
    lora_dropout: float = from_field(AdapterConfig, "lora_dropout", group=ADAPTER, inherit=True)
    lora_targets: str = from_field(AdapterConfig, "lora_targets", group=ADAPTER, inherit=True)
    overlap_network: bool = from_field(NodeConfig, "overlap_network", flag="--wait-network", inherit=True)
    network_wait_s: float = from_field(NodeConfig, "network_wait_s", flag="--network-wait", inherit=True)
    min_generate_s: float = from_field(NodeConfig, "min_generate_s", flag="--min-generate", inherit=True)
    log_dir: str = from_field(NodeConfig, "log_dir")
    device: str = from_field(NodeConfig, "device", inherit=True)
    max_threads: int = from_field(NodeConfig, "max_threads")
    verbose: int = option(0, "more log detail (-vv for debug)", short="-v", count=True, inherit=True)
    report_to: str = from_field(NodeConfig, "report_to", inherit=True)
    sync_every: int = from_field(
        OuterSyncConfig, "sync_every", group=SYNC, inherit=True, default=0, note="H; 0 turns sync off"
    )
    sync_period_s: float = from_field(OuterSyncConfig, "sync_period_s", group=SYNC, flag="--sync-period", inherit=True)
    eager: bool = from_field(OuterSyncConfig, "eager", group=SYNC, flag="--sync-blocking", inherit=True)
    matchmaking_timeout_s: float = from_field(
        OuterSyncConfig, "matchmaking_timeout_s", group=SYNC, flag="--sync-window", inherit=True
    )
    allreduce_timeout_s: float = from_field(
        OuterSyncConfig, "allreduce_timeout_s", group=SYNC, flag="--sync-timeout", inherit=True
    )
    min_link_mbit: float = from_field(
        OuterSyncConfig, "min_link_mbit", group=SYNC, flag="--sync-min-mbit", inherit=True
    )
    compression: str = from_field(OuterSyncConfig, "compression", group=SYNC, flag="--sync-compression", inherit=True)
    direct_payloads: bool = from_field(
        OuterSyncConfig, "direct_payloads", group=SYNC, flag="--sync-stream-only", inherit=True
    )
    outer_lr: float = from_field(
        OuterSyncConfig,
        "outer_lr",
        group=SYNC,
        inherit=True,
        default=1.0,
        note="a node's 1 with --outer-momentum 0 sets the anchor to the group's (clipped) average at each commit, "
        "which taught best on held-out questions in two RL settings (docs/EXPERIMENTS.md)",
    )
    outer_momentum: float = from_field(OuterSyncConfig, "outer_momentum", group=SYNC, inherit=True, default=0.0)
    aggregator: str = from_field(OuterSyncConfig, "aggregator", group=SYNC, flag="--sync-aggregator", inherit=True)
    eval_every: int | None = from_field(
        EvalConfig,
        "eval_every",
        group=EVAL,
        inherit=True,
        default=None,
        note="default: the model's: every 200 rounds for built-in tiny models, 2-13 percent of their run; off for a "
        "real LM, whose evaluation takes minutes on a CPU",
    )
    eval_items: int = from_field(EvalConfig, "eval_items", group=EVAL, inherit=True)
    eval_samples: int = from_field(EvalConfig, "eval_samples", group=EVAL, inherit=True)
    eval_timeout_s: float = from_field(EvalConfig, "eval_timeout_s", group=EVAL, flag="--eval-timeout", inherit=True)
    checkpoint_every: int = from_field(CheckpointConfig, "checkpoint_every", group=CHECKPOINTS, inherit=True)
    resume: bool = from_field(CheckpointConfig, "resume", group=CHECKPOINTS, inherit=True)
    dashboard_port: int | None = option(
        None, "serve the live dashboard on this port (0: any)", group=DASHBOARD, min=0, max=65535
    )
    dashboard_host: str = option("127.0.0.1", "dashboard bind address (0.0.0.0: your network)", group=DASHBOARD)
    identity: str = from_field(NodeConfig, "identity", group=NETWORK)
    host_port: str | None = option(
        None,
        "listen address as PORT or HOST:PORT; port 0 reuses this identity's last port if free, else any "
        "(default 0.0.0.0:0)",
        group=NETWORK,
    )
    announce: tuple[str, ...] = from_field(MembershipConfig, "announce", group=NETWORK)
    client_mode: bool = from_field(MembershipConfig, "client_mode", group=NETWORK)
    use_relay: bool = from_field(MembershipConfig, "use_relay", group=NETWORK, flag="--no-relay")
    use_auto_relay: bool = from_field(MembershipConfig, "use_auto_relay", group=NETWORK, flag="--auto-relay")
    bootstrap_attempts: int = from_field(MembershipConfig, "bootstrap_attempts", group=NETWORK)
    swarm_id: str = from_field(MembershipConfig, "swarm_id", group=NETWORK, inherit=True)
    alone_after_s: float = from_field(
        MembershipConfig, "alone_after_s", group=NETWORK, flag="--alone-after", inherit=True
    )
    ready_file: str | None = option(None, "write peer id and addresses here once up (for local)", hidden=True)
    hold: bool = option(False, "after the last round keep serving rollouts until stopped", hidden=True)
    go_file: str | None = option(None, "wait for this file before the first round", hidden=True)


@dataclass
class JoinOptions(NodeOptions):
    """``join``: the node options plus the peers to join through."""

    peer: tuple[str, ...] = option((), "multiaddr of a peer (repeatable; required)", group=NETWORK)


@dataclass
class LocalOptions(NodeOptions):
    """``local``: N nodes on this machine; some node defaults differ (a short run, its own folder, a dashboard)."""

    rounds: int = option(20, "rounds to run", inherit=True, min=1)
    log_dir: str = option("runs/local", "each node's metrics go to <log-dir>/<peer-short-id>/metrics.jsonl")
    dashboard_port: int | None = option(
        8765, "serve the swarm dashboard on this port (0: any)", group=DASHBOARD, min=0, max=65535
    )
    nodes: int = option(4, "number of node processes", group="local swarm", min=1, max=64)
    isolated: int = option(
        0, "run the last K nodes with --external 0 (side-by-side baseline)", group="local swarm", min=0
    )
    models: str = option("", "comma-separated models assigned round-robin to nodes", group="local swarm")
    round_timeout: float = option(
        120.0, "give up if no node progresses this long (s; with --eval-every, --eval-timeout is added)",
        group="local swarm", above=0,
    )  # fmt: skip
    no_dashboard: bool = option(False, "do not serve the swarm dashboard", group="local swarm")
    fresh_processes: bool = option(
        False,
        "start each node as a fresh python process instead of forking one that imported everything once "
        "(slower start and more memory per node)",
        group="local swarm",
    )


def negated(f: Any) -> bool:
    """Whether option ``f`` is a switch on by default without its own spelling: its flag is ``--no-field-name``."""
    return f.default is True and not f.metadata.get("flag")


def flag_of(f: Any) -> str:
    """The long flag of an option field (see :func:`option`)."""
    name = f.name.replace("_", "-")
    return str(f.metadata.get("flag") or ("--no-" if negated(f) else "--") + name)


def option_fields(cls: type[Any]) -> list[Any]:
    """The option fields of ``cls`` (a dataclass of :func:`option` fields) in declaration order (a subclass's
    override keeps its first place)."""
    return [f for f in fields(cls) if "group" in f.metadata]


def option_types(cls: type[Any]) -> dict[str, Any]:
    """Field name -> resolved type annotation."""
    return typing.get_type_hints(cls)


def to_argv(opts: NodeOptions, only: Literal["inherited", "changed"] = "inherited") -> list[str]:
    """``opts`` as a command line: the options ``local`` hands to children (``only="inherited"``, every value
    written out) or those that differ from their default (``only="changed"``).

    None is left out; a switch appears only when its value is not its default; a
    repeatable flag once per value; a count as that many short flags.
    """
    out: list[str] = []
    for f in option_fields(type(opts)):
        value = getattr(opts, f.name)
        if (only == "inherited" and not f.metadata["inherit"]) or (only == "changed" and value == f.default):
            continue
        out += _flag_words(f, value)
    return out


def _flag_words(f: Any, value: Any) -> list[str]:
    flag = flag_of(f)
    if isinstance(value, bool):  # a switch: given when the value is the opposite of its default
        return [flag] if value != f.default else []
    if value is None:
        return []
    if f.metadata["count"]:
        return [f.metadata["short"] or flag] * int(value)
    if isinstance(value, tuple | list):
        return [w for v in value for w in (flag, str(v))]
    return [flag, str(value)]


def choices_of(cls: type[NodeOptions], name: str) -> tuple[str, ...]:
    """The values option ``name`` takes (empty: any), without importing the component that defines them."""
    return tuple(next(f for f in fields(cls) if f.name == name).metadata["choices"])


def default_of(cls: type[NodeOptions], name: str) -> Any:
    """The default of option ``name`` in ``cls``."""
    for f in fields(cls):
        if f.name == name:
            return None if f.default is MISSING else f.default
    raise KeyError(name)


def range_error(f: Any, value: Any) -> str | None:
    """Why ``value`` lies outside option ``f``'s range, in one sentence naming its flag; None if inside.

    >>> f = next(f for f in option_fields(NodeOptions) if f.name == "sync_period_s")
    >>> range_error(f, 0.5), range_error(f, 0.0)
    ('--sync-period must be 0 or >= 1, got 0.5', None)
    """
    rule = broken_rule(f.metadata, value)
    return None if rule is None else f"{flag_of(f)} must be {rule}, got {number_text(value)}"


def choice_error(f: Any, value: Any) -> str | None:
    """Why ``value`` is none of option ``f``'s choices, in one sentence naming its flag; None if it is one (or
    ``f`` has none). argparse refuses them on the command line; this refuses them from anywhere else.

    >>> f = next(f for f in option_fields(NodeOptions) if f.name == "adapter")
    >>> choice_error(f, "qlora"), choice_error(f, "lora")
    ('--adapter qlora: use one of none, lora', None)
    """
    choices = f.metadata.get("choices")
    if not choices or value is None or value in choices:
        return None
    return f"{flag_of(f)} {value}: use one of {', '.join(map(str, choices))}"


def report_to_problem(report_to: str) -> str | None:
    """Why ``--report-to`` cannot log here (its optional package is missing), naming the pip command; None if it can.

    Looks the package up without importing it, so the refusal comes before anything heavy loads.
    """
    if report_to == "none" or importlib.util.find_spec(report_to) is not None:
        return None
    return (
        f"--report-to {report_to} needs the {report_to} package, which is not installed; run "
        f"pip install 'swarm-node[{report_to}]' (or pip install {report_to}), or drop --report-to"
    )


def check_options(opts: NodeOptions) -> None:
    """Every option's range and choices, then the checks across options: the first problem as a ValueError
    naming the flag.

    Standard library only, so the command line refuses bad input before torch loads.
    """
    problem = first_option_error(opts, option_fields(type(opts))) or report_to_problem(opts.report_to)
    if problem:
        raise ValueError(problem)
    if opts.max_source_share * opts.local_groups < 1:
        raise ValueError(
            f"--max-source-share {opts.max_source_share:g} with --local {opts.local_groups} lets a peer supply less "
            f"than one group, so no peer's group would be trained on; use at least {1 / opts.local_groups:g}"
        )
    if opts.adapter == "none":
        for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
            value = getattr(opts, name)
            if value != default_of(NodeOptions, name):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {value} has no effect without --adapter lora; add --adapter lora or drop it")
    _check_schedule(opts)
    _check_conflicts(opts)
    if isinstance(opts, LocalOptions) and opts.isolated > opts.nodes:
        raise ValueError(f"--isolated {opts.isolated}: use 0 to {opts.nodes} (the number of nodes)")


def _check_conflicts(opts: NodeOptions) -> None:
    """An option that undoes what another promises."""
    if opts.client_mode and opts.announce:
        raise ValueError(
            f"--client-mode accepts no connections, so --announce {opts.announce[0]} would tell peers an address "
            "that refuses them; drop --announce, or --client-mode if that address is reachable"
        )


def _check_schedule(opts: NodeOptions) -> None:
    """A decay needs a length; its length and floor do nothing without a decay."""
    if opts.lr_scheduler_type == "constant":
        for name, flag in (("lr_decay_rounds", "--lr-decay-rounds"), ("min_lr_rate", "--lr-floor")):
            value = getattr(opts, name)
            if value != default_of(NodeOptions, name):
                raise ValueError(
                    f"{flag} {value:g} has no effect without --lr-schedule; add --lr-schedule linear or drop it"
                )
    elif not (opts.lr_decay_rounds or opts.rounds):
        raise ValueError(
            f"--lr-schedule {opts.lr_scheduler_type} needs a length: add --lr-decay-rounds N (or --rounds N)"
        )


def options_from(cls: type[NodeOptions], values: Any) -> NodeOptions:
    """Build ``cls`` from an argparse namespace (or any object with the fields as attributes)."""
    kwargs: dict[str, Any] = {}
    for f in option_fields(cls):
        v = getattr(values, f.name)
        kwargs[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**kwargs)


def sync_partner_warning(
    sync_every: int, rounds: int, models: list[str] | None = None, sync_period: float = 0.0
) -> str | None:
    """Why ``--sync-every`` (or ``--sync-period``) can never find a partner, in one sentence; None if it might.

    ``models`` is each node's model where all are known (``local``). A single
    ``start`` or ``join`` cannot know what others will run, so only ``--rounds``
    can rule the sync out there.

    >>> sync_partner_warning(2, 20, ["tiny-s", "tiny-m", "tiny-l"])[:40]
    '--sync-every 2: no two of the 3 nodes ru'
    >>> sync_partner_warning(2, 20, ["tiny-s", "tiny-m", "tiny-s"]) is None
    True
    """
    if sync_every <= 0 and sync_period <= 0:
        return None
    flag = f"--sync-period {sync_period:g}" if sync_period > 0 else f"--sync-every {sync_every}"
    if sync_period <= 0 and 0 < rounds < sync_every:
        return f"--sync-every {sync_every} never syncs: the run ends after --rounds {rounds}; lower --sync-every"
    if models is not None and len(set(models)) == len(models):
        return (
            f"{flag}: no two of the {len(models)} nodes run the same model "
            f"({', '.join(models)}), and only same-architecture peers sync; repeat a model in --models "
            f"(e.g. --models {models[0]},{models[0]})"
        )
    return None
