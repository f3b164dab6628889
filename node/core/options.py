"""Every option a user sets on a node, in one place: the CLI flags, TOML keys and child flag lists come from here.

:class:`NodeOptions` lists the options of ``start``, ``join`` and ``local``
(with :class:`JoinOptions` and :class:`LocalOptions` adding their own). Each
field carries its help text and CLI spelling in its metadata;
:mod:`node.cli.flags` turns the fields into argparse flags (and so into the
keys of the config file and the file ``swarm-node init`` writes), and
:func:`to_argv` turns values back into a command line for child processes.

This module imports only the standard library, so parsing the command line
(and every one-sentence error) stays fast. Where an option feeds a
component's config it carries that config field's name (the flag keeps the
user's word, e.g. ``--sync-window`` for ``matchmaking_timeout_s``) and its
default: :func:`node.core.assemble.node_configs` builds the components by
matching names, and ``tests/node/test_options.py`` checks that every option
feeds a field of its name and that the default options give exactly the
components' own defaults.
"""

from __future__ import annotations

import importlib.util
import operator
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

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


def bounds(
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    or_zero: bool = False,
) -> dict[str, Any]:
    """A number field's range as field metadata, read by :func:`range_error` (see :func:`option`)."""
    return {"min": min, "max": max, "above": above, "below": below, "or_zero": or_zero}


def first_range_error(obj: Any, flagged: list[Any]) -> str | None:
    """The first of ``flagged`` (fields of ``obj``) whose value lies outside its range, as :func:`range_error`."""
    for f in flagged:
        problem = range_error(f, getattr(obj, f.name))
        if problem:
            return problem
    return None


REPORT_TO = ("none", "tensorboard", "wandb")
"""Where ``--report-to`` also logs per-round scalars (TRL's ``report_to``): each but none is an optional package."""

DEFAULT_MODEL = "tiny-s"
DEFAULT_IDENTITY = "~/.swarm-node/identity.key"


@dataclass
class NodeOptions:
    """The options of every node command (``start``, ``join``, ``local``)."""

    model: str = option(DEFAULT_MODEL, "built-in model name or local HF model folder")
    tasks: tuple[str, ...] = option(
        (),
        "task family (repeatable; default: the model's: the tiny built-ins for a tiny model, the reasoning-gym "
        "families where it gets a learning signal for a real LM)",
        flag="--task",
        inherit=True,
    )
    accept_tasks: tuple[str, ...] = option(
        (), "task family learned from peers' groups without generating it (repeatable)", flag="--accept-task",
        inherit=True,
    )  # fmt: skip
    accept_tokens: int = option(
        0, "longest peer completion accepted, in this model's tokens (0: its own --max-new-tokens)", inherit=True, min=0
    )
    seed: int = option(
        0,
        "seed for sampling, generation and the initial weights (with the outer sync on, every peer of one model "
        "starts from the same weights)",
    )
    rounds: int = option(0, "rounds to run; 0 runs until stopped", inherit=True, min=0)
    warm_start_steps: int = option(
        0, "supervised steps on gold answers before the first round, the same on every node (a stand-in for "
        "a pretrained model: all nodes of one model and task set start from one prior); 0: off",
        flag="--warm-start", inherit=True, min=0, max=100_000,
    )  # fmt: skip
    local_groups: int = option(4, "I: local groups per round", flag="--local", inherit=True, min=1)
    external_groups: int = option(4, "J: external groups per round", flag="--external", inherit=True, min=0)
    num_generations: int = option(8, "G: completions per question", flag="--generations", inherit=True, min=2, max=64)
    max_new_tokens: int = option(
        0, "tokens per completion (0: the model's default: 1 for built-in tiny models, 32 smollm2-135m, else 64)",
        inherit=True, min=0, max=4096,
    )  # fmt: skip
    temperature: float = option(1.0, "sampling temperature", inherit=True, min=0, max=100)
    sample_precision: str = option(
        "auto", "weights that sample: auto (bfloat16 where the CPU has native bf16 and the node trains an "
        "adapter on a model of 10M+ parameters; training and held-out scoring stay float32), float32, bfloat16",
        inherit=True, choices=("auto", "float32", "bfloat16"),
    )  # fmt: skip
    learning_rate: float | None = option(
        None,
        "learning rate (default: the model's: 1e-3 tiny, 2e-6 smollm2-135m, 2e-5 with --adapter lora)",
        flag="--lr",
        inherit=True,
        above=0,
        below=1,
    )
    lr_scheduler_type: str = option(
        "constant", "learning-rate schedule by round: constant, or linear or cosine decay from --lr to --lr-floor x "
        "--lr over --lr-decay-rounds, then held there", flag="--lr-schedule", inherit=True,
        choices=("constant", "linear", "cosine"),
    )  # fmt: skip
    lr_decay_rounds: int = option(
        0, "rounds over which --lr-schedule decays the rate (0: --rounds)", inherit=True, min=0, max=10_000_000
    )
    min_lr_rate: float = option(
        0.0, "the rate at the end of --lr-schedule's decay, as a fraction of --lr", flag="--lr-floor", inherit=True,
        min=0, max=1,
    )  # fmt: skip
    sampling: str = option(
        "advantage",
        "external group choice: uniform, advantage (groups with signal first) or credit (then by what their sources "
        "taught this node)",
        inherit=True,
        choices=("uniform", "advantage", "credit"),
    )
    max_source_share: float = option(
        0.5, "most rows one peer may supply to a training step, as a share of this node's own rows (I x G); with "
        "each peer group cut to G completions and its mean |advantage| at most 1, it bounds that peer's share of "
        "the step's advantage mass too", inherit=True, above=0, max=16,
    )  # fmt: skip
    min_token_logp: float | None = option(
        None, "likelihood filter: drop a peer's completion whose mean token log-prob here is below this (e.g. -5)",
        group=OFFPOLICY, flag="--external-min-logp", inherit=True, below=0,
    )  # fmt: skip
    is_cap: float = option(
        0.0, "truncated importance weight of a peer's completion: min(p_here / p_publisher, cap); 0: off",
        group=OFFPOLICY, flag="--external-is-cap", inherit=True, min=0, max=100,
    )  # fmt: skip
    max_publisher_share: float = option(
        0.34, "most of a step's informative rows (non-zero advantage) and of its advantage mass one peer may supply; "
        "this node's own rows count in the whole and are never cut; 1: off",
        group=OFFPOLICY, inherit=True, above=0, max=1,
    )  # fmt: skip
    max_logp_gap: float = option(
        2.0, "plausibility gate: weight 0 for a peer's completion whose mean token log-prob here lies more than this "
        "many nats below the median of this node's own recent completions; 0: off",
        group=OFFPOLICY, flag="--external-max-logp-gap", inherit=True, min=0, max=50,
    )  # fmt: skip
    baseline: str = option(
        "receiver", "baseline of peers' groups: group (their mean) or receiver (this node's mean reward on the family)",
        group=OFFPOLICY, flag="--external-baseline", inherit=True, choices=("group", "receiver"),
    )  # fmt: skip
    successes_only: bool = option(
        True, "success-only guidance, on by default: a peer's completions teach only where they did better than this "
        "node expects (their negative advantages become 0); this flag turns it off (docs/EXPERIMENTS.md)",
        group=OFFPOLICY, flag="--no-external-successes-only", inherit=True,
    )  # fmt: skip
    adaptive_share: bool = option(
        True, "adaptive share, on by default: each step measures what a peer's group moves this node's own objective "
        "against one of its own, and gives a slot of --external back to its own groups (one more generated) while "
        "peers' do less; this flag keeps all --external slots for peers' groups",
        group=OFFPOLICY, flag="--no-adaptive-share", inherit=True,
    )  # fmt: skip
    share_threshold: float = option(
        1.0, "the adaptive share keeps peers' groups while one moves this node's objective at least this many "
        "times as far as one of its own", group=OFFPOLICY, inherit=True, above=0, max=10,
    )  # fmt: skip
    gradient_checkpointing: bool = option(
        False,
        "recompute activations in the backward pass: less memory for a real LM, ~1/3 more training time",
        inherit=True,
    )
    micro_batch_size: int = option(
        0, "completions per forward/backward pass (0: the model's default)", flag="--micro-batch", inherit=True, min=0
    )
    diagnose_groups: bool = option(
        False, "record per round and source what training used (log-probs, weights, gradient shares)",
        group=OFFPOLICY, inherit=True,
    )  # fmt: skip
    adapter: str = option(
        "none", "none (train every weight) or lora (train low-rank adapters on the frozen model: a fraction of the "
        "memory; only the adapters are checkpointed and averaged)", group=ADAPTER, inherit=True,
        choices=("none", "lora"),
    )  # fmt: skip
    lora_rank: int = option(16, "rank r of each adapter", group=ADAPTER, inherit=True, min=1, max=4096)
    lora_alpha: int = option(
        32, "adapter scale: its update is multiplied by alpha / r", group=ADAPTER, inherit=True, min=1, max=65536
    )
    lora_dropout: float = option(
        0.0, "dropout on the adapters' input in training passes", group=ADAPTER, inherit=True, min=0, below=1
    )
    lora_targets: str = option(
        "", "comma list of module names to adapt (default: the attention and MLP projections the model has: "
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj on Llama-family, c_attn,c_proj,c_fc on GPT-2)",
        group=ADAPTER, inherit=True,
    )  # fmt: skip
    overlap_network: bool = option(
        True, "each round waits for its own publish and collect (default: they run beside the rounds)",
        flag="--wait-network", inherit=True,
    )  # fmt: skip
    network_wait_s: float = option(
        0.05,
        "longest a round waits for the collect it started (s; at most its own generation time); a slower one is "
        "ingested later",
        flag="--network-wait",
        inherit=True,
        min=0,
        max=60,
    )
    min_generate_s: float = option(
        0.0,
        "shortest a round's generation lasts (s): a faster node waits out the rest before sharing, as a bigger "
        "model would, so a local swarm of tiny models keeps a real swarm's round length (0: off)",
        flag="--min-generate",
        inherit=True,
        min=0,
        max=3600,
    )
    log_dir: str = option("runs", "metrics go to <log-dir>/<peer-short-id>/metrics.jsonl")
    device: str = option(
        "auto",
        "where the model runs (auto: cuda, then mps, then cpu)",
        inherit=True,
        choices=("auto", "cpu", "cuda", "mps"),
    )
    max_threads: int = option(0, "cap torch CPU threads (0: torch default)", min=0)
    verbose: int = option(0, "more log detail (-vv for debug)", short="-v", count=True, inherit=True)
    report_to: str = option(
        "none", "also log per-round scalars (reward, held-out accuracy, groups used, sync commits; step: the round) "
        "to tensorboard (files in <log-dir>/<peer-short-id>/tensorboard) or wandb; each needs its package",
        inherit=True, choices=REPORT_TO,
    )  # fmt: skip
    sync_every: int = option(0, "rounds between outer syncs (H); 0 turns sync off", group=SYNC, inherit=True, min=0)
    sync_period_s: float = option(
        0.0,
        "sync on a shared clock instead: every peer of an architecture starts a sync at each multiple of this many "
        "seconds of wall time, so peers of different speeds meet (turns the sync on; e.g. 60)",
        group=SYNC,
        flag="--sync-period",
        inherit=True,
        min=1,
        or_zero=True,
    )
    eager: bool = option(
        True, "training waits for each sync (default: it runs beside training, applied one step late)", group=SYNC,
        flag="--sync-blocking", inherit=True,
    )  # fmt: skip
    matchmaking_timeout_s: float = option(
        5.0, "gather window: peers arriving within it form a group (s)", group=SYNC, flag="--sync-window",
        inherit=True, above=0,
    )  # fmt: skip
    allreduce_timeout_s: float = option(
        60.0, "bound on one sync's all-reduce (s); grows for a model whose bytes take longer at --sync-min-mbit",
        group=SYNC, flag="--sync-timeout", inherit=True, min=5,
    )  # fmt: skip
    min_link_mbit: float = option(
        20.0, "slowest link (Mbit/s each way) a sync member is expected to have: the all-reduce and state "
        "download bounds grow to what the model's bytes take at this rate", group=SYNC, flag="--sync-min-mbit",
        inherit=True, above=0,
    )  # fmt: skip
    compression: str = option(
        "none", "wire encoding of the all-reduce", group=SYNC, flag="--sync-compression", inherit=True,
        choices=("none", "fp16", "int8"),
    )  # fmt: skip
    direct_payloads: bool = option(
        True,
        "move the all-reduce's bytes on the encrypted P2P streams only (default: on direct TCP connections, "
        "each payload's sha256 checked over the stream; about a third of the CPU, not encrypted)",
        group=SYNC,
        flag="--sync-stream-only",
        inherit=True,
    )
    outer_lr: float = option(
        1.0,
        "outer SGD learning rate; with --outer-momentum 0 each commit sets the anchor to the group's (clipped) "
        "average, which taught best on held-out questions in two RL settings (docs/EXPERIMENTS.md); DiLoCo's "
        "pretraining setting is 0.7 with momentum 0.9",
        group=SYNC,
        inherit=True,
        above=0,
    )
    outer_momentum: float = option(
        0.0,
        "outer (Nesterov) SGD momentum; 0 with --outer-lr 1: the outer step is plain averaging",
        group=SYNC,
        inherit=True,
        min=0,
        below=1,
    )
    aggregator: str = option(
        "centered_clip",
        "how a reducer combines the (norm-clipped) parts: centered_clip, median, trimmed_mean (robust to one "
        "member reversing the group's progress, from 3 members up) or mean",
        group=SYNC,
        flag="--sync-aggregator",
        inherit=True,
        choices=("mean", "trimmed_mean", "median", "centered_clip"),
    )
    eval_every: int | None = option(
        None, "rounds between held-out evaluations, also run before the first round and after the last (default: "
        "the model's: every 200 rounds for built-in tiny models, 2-13 percent of their run; off for a real LM, "
        "whose evaluation takes minutes on a CPU; 0: off)", group=EVAL, inherit=True, min=0,
    )  # fmt: skip
    eval_items: int = option(64, "held-out questions per task family", group=EVAL, inherit=True, min=1, max=4096)
    eval_samples: int = option(
        8, "sampled completions per held-out question, for the mean reward beside greedy accuracy (0: greedy only)",
        group=EVAL, inherit=True, min=0, max=64,
    )  # fmt: skip
    eval_timeout_s: float = option(
        60.0, "longest one evaluation runs (s); past it the scores cover the questions done", group=EVAL,
        flag="--eval-timeout", inherit=True, above=0,
    )  # fmt: skip
    checkpoint_every: int = option(
        50, "rounds between checkpoints (also written on leave); 0: off", group=CHECKPOINTS, inherit=True, min=0
    )
    resume: bool = option(
        False, "continue from the latest intact checkpoint in the log dir", group=CHECKPOINTS, inherit=True
    )
    dashboard_port: int | None = option(
        None, "serve the live dashboard on this port (0: any)", group=DASHBOARD, min=0, max=65535
    )
    dashboard_host: str = option("127.0.0.1", "dashboard bind address (0.0.0.0: your network)", group=DASHBOARD)
    identity: str = option(DEFAULT_IDENTITY, "Ed25519 key file (created if missing)", group=NETWORK)
    host_port: str | None = option(
        None,
        "listen address as PORT or HOST:PORT; port 0 reuses this identity's last port if free, else any "
        "(default 0.0.0.0:0)",
        group=NETWORK,
    )
    announce: tuple[str, ...] = option((), "multiaddr to announce (repeatable)", group=NETWORK)
    client_mode: bool = option(False, "accept no incoming connections (behind NAT)", group=NETWORK)
    use_relay: bool = option(True, "do not use libp2p circuit relays to reach peers", group=NETWORK, flag="--no-relay")
    use_auto_relay: bool = option(
        False, "find a relay to be reachable through (behind NAT)", group=NETWORK, flag="--auto-relay"
    )
    bootstrap_attempts: int = option(4, "tries to reach --peer (backoff 1 s, doubling)", group=NETWORK, min=1)
    swarm_id: str = option("swarm-node", "swarm name; keys are namespaced by it", group=NETWORK, inherit=True)
    alone_after_s: float = option(
        60.0, "seconds without a batch from a peer of this swarm before the node warns that it trains alone",
        group=NETWORK, flag="--alone-after", inherit=True, above=0,
    )  # fmt: skip
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


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def range_error(f: Any, value: Any) -> str | None:
    """Why ``value`` lies outside option ``f``'s range, in one sentence naming its flag; None if inside.

    >>> f = next(f for f in option_fields(NodeOptions) if f.name == "sync_period_s")
    >>> range_error(f, 0.5), range_error(f, 0.0)
    ('--sync-period must be 0 or >= 1, got 0.5', None)
    """
    meta = f.metadata
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if meta.get("or_zero") and value == 0:
        return None
    rules = [("above", ">", operator.gt), ("min", ">=", operator.ge), ("below", "<", operator.lt)]
    rules.append(("max", "<=", operator.le))
    bounds = [(meta[key], word, test) for key, word, test in rules if meta.get(key) is not None]
    if all(test(value, bound) for bound, _, test in bounds):  # NaN fails every bound
        return None
    rule = " and ".join(f"{word} {_number(bound)}" for bound, word, _ in bounds)
    return f"{flag_of(f)} must be {'0 or ' if meta.get('or_zero') else ''}{rule}, got {_number(value)}"


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
    """Every option's range, then the checks across options: the first problem as a ValueError naming the flag.

    Standard library only, so the command line refuses bad input before torch loads.
    """
    problem = first_range_error(opts, option_fields(type(opts))) or report_to_problem(opts.report_to)
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
