"""Assembling a node's configs from its options: the node's own, and each component's.

Each option is named as the component config field it feeds, so a component is
built from the options that share its fields' names (:func:`from_options`);
only the per-model defaults that fill an unset option (:func:`per_model`) and
the addresses the CLI resolves are given by hand. Kept apart from
:mod:`node.core.options` because it imports the components (torch,
transformers, hivemind), which the command line must not wait for.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from node.core.checkpoint import CheckpointConfig
from node.core.config import NodeConfig, NodeParts
from node.core.ingest import IngestConfig
from node.core.options import NodeOptions, default_of, option_fields
from node.training.adapters import AdapterConfig
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.models import recommended_defaults
from node.training.offpolicy import BASELINES, OffPolicyConfig
from node.training.policy import GenerationConfig
from swarm.exchange import ExchangeConfig
from swarm.membership import MembershipConfig
from swarm.sync import OuterSyncConfig

C = TypeVar("C")

FROM_OPTIONS: tuple[type[Any], ...] = (
    NodeConfig, MembershipConfig, GenerationConfig, GRPOConfig, OuterSyncConfig, CheckpointConfig, IngestConfig,
    OffPolicyConfig, AdapterConfig, EvalConfig,
)  # fmt: skip
"""The configs built from the options; ``tests/node/test_options.py`` checks each option feeds one of them."""


def option_values(opts: NodeOptions) -> dict[str, Any]:
    """Every option's value by name, with the per-model defaults filled in where the option is unset."""
    values = {f.name: getattr(opts, f.name) for f in option_fields(type(opts))}
    return values | per_model(opts)


def per_model(opts: NodeOptions) -> dict[str, Any]:
    """The options whose unset value (0, None, no tasks) means the model's own default, with that default.

    See :func:`~node.training.models.recommended_defaults`: a real LM needs other lengths, learning
    rates, batch sizes and tasks than the built-in tiny models.
    """
    rec = recommended_defaults(opts.model)
    return {
        "tasks": opts.tasks or rec.tasks,
        "max_new_tokens": opts.max_new_tokens or rec.max_new_tokens,
        "learning_rate": rec.lr(opts.adapter) if opts.learning_rate is None else opts.learning_rate,
        "micro_batch_size": opts.micro_batch_size or rec.micro_batch_size,
    }


def from_options(cls: type[C], values: dict[str, Any], **given: Any) -> C:
    """``cls`` with each field that an option of the same name feeds, plus ``given`` (fields no option sets)."""
    taken = {f.name: values[f.name] for f in fields(cls) if f.name in values}  # type: ignore[arg-type]
    return cls(**(taken | given))


def node_configs(opts: NodeOptions, host: str, port: int, peers: tuple[str, ...] = ()) -> tuple[NodeConfig, NodeParts]:
    """The node's and its components' configs from the options; a bad value raises ValueError naming the fix.

    The outer sync is on when ``--sync-every`` or ``--sync-period`` is given (their 0 means off: no
    :class:`OuterSyncConfig` at all, so its own ``sync_every`` default never applies to a node).
    """
    check_options(opts)
    values = option_values(opts)
    sync_on = opts.sync_every > 0 or opts.sync_period_s != 0
    parts = NodeParts(
        membership=from_options(MembershipConfig, values, host=host, port=port, initial_peers=peers),
        exchange=ExchangeConfig(),
        generation=from_options(GenerationConfig, values),
        grpo=from_options(GRPOConfig, values),
        sync=from_options(OuterSyncConfig, values) if sync_on else None,
        checkpoint=from_options(CheckpointConfig, values),
        ingest=from_options(IngestConfig, values),
        offpolicy=from_options(OffPolicyConfig, values),
        adapter=from_options(AdapterConfig, values),
        evaluation=from_options(EvalConfig, values),
    )
    return from_options(NodeConfig, values), parts


def check_options(opts: NodeOptions) -> None:
    """The options' ranges, as one sentence naming the flag (the components check them again, in their words)."""
    if not 0 <= opts.min_generate_s <= 3600:
        raise ValueError(f"--min-generate {opts.min_generate_s:g}: use seconds in [0, 3600] (0: off), e.g. 20")
    if not 0 < opts.max_source_share <= 16:
        raise ValueError(
            f"--max-source-share {opts.max_source_share:g}: use a share of the node's own rows in (0, 16], e.g. 0.5"
        )
    if opts.max_source_share * opts.local_groups < 1:
        raise ValueError(
            f"--max-source-share {opts.max_source_share:g} with --local {opts.local_groups} lets a peer supply less "
            f"than one group, so no peer's group would be trained on; use at least {1 / opts.local_groups:g}"
        )
    if not 0 <= opts.warm_start_steps <= 100_000:
        raise ValueError(
            f"--warm-start {opts.warm_start_steps}: use 0 (off) or a number of steps up to 100000, e.g. 40"
        )
    if opts.micro_batch_size < 0:
        raise ValueError(
            f"--micro-batch {opts.micro_batch_size}: use 0 (the model's default) or a positive count, e.g. 2"
        )
    check_sync_options(opts)
    check_eval_options(opts)
    check_offpolicy_options(opts)
    check_adapter_options(opts)


def check_sync_options(opts: NodeOptions) -> None:
    """The outer sync's options, as one sentence naming the flag."""
    if opts.sync_every < 0:
        raise ValueError(f"--sync-every {opts.sync_every}: use 0 (off) or a positive number of rounds")
    if not (opts.sync_period_s == 0 or opts.sync_period_s >= 1):
        raise ValueError(
            f"--sync-period {opts.sync_period_s:g}: use 0 (count --sync-every rounds) or at least 1 second"
        )
    if not opts.matchmaking_timeout_s > 0:
        raise ValueError(f"--sync-window {opts.matchmaking_timeout_s:g}: use a positive number of seconds (default 5)")
    if not opts.allreduce_timeout_s >= OuterSyncConfig.dht_timeout_s:
        raise ValueError(
            f"--sync-timeout {opts.allreduce_timeout_s:g}: use at least {OuterSyncConfig.dht_timeout_s:g} seconds "
            "(one DHT call's bound; default 60)"
        )


def check_eval_options(opts: NodeOptions) -> None:
    """The evaluation options, as one sentence naming the flag."""
    if opts.eval_every < 0:
        raise ValueError(f"--eval-every {opts.eval_every}: use 0 (off) or a positive number of rounds, e.g. 10")
    if not 1 <= opts.eval_items <= 4096:
        raise ValueError(f"--eval-items {opts.eval_items}: use 1-4096 questions per family, e.g. 64")
    if not 0 <= opts.eval_samples <= 64:
        raise ValueError(f"--eval-samples {opts.eval_samples}: use 0 (greedy only) to 64, e.g. 8")
    if not opts.eval_timeout_s > 0:
        raise ValueError(f"--eval-timeout {opts.eval_timeout_s:g}: use a positive number of seconds, e.g. 60")


def check_offpolicy_options(opts: NodeOptions) -> None:
    """The off-policy options, as one sentence naming the flag."""
    if opts.min_token_logp is not None and not opts.min_token_logp < 0:
        raise ValueError(f"--external-min-logp {opts.min_token_logp:g}: use a negative log-probability (e.g. -5)")
    if not 0 <= opts.is_cap <= 100:
        raise ValueError(f"--external-is-cap {opts.is_cap:g}: use 0 (off) or a cap in (0, 100], e.g. 1")
    if opts.baseline not in BASELINES:
        raise ValueError(f"--external-baseline {opts.baseline}: use one of {', '.join(BASELINES)}")


def check_adapter_options(opts: NodeOptions) -> None:
    """A ``--lora-*`` flag without ``--adapter lora`` would do nothing: one sentence naming the flag."""
    if opts.adapter == "none":
        for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
            value = getattr(opts, name)
            if value != default_of(NodeOptions, name):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {value} has no effect without --adapter lora; add --adapter lora or drop it")
