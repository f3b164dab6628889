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
from node.core.options import NodeOptions, check_options, option_fields
from node.training.adapters import AdapterConfig
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.models import recommended_defaults
from node.training.offpolicy import OffPolicyConfig
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
    """The options whose unset value (0, None, no tasks) means a default found elsewhere, with that default.

    Mostly the model's own; a schedule's ``lr_decay_rounds`` is the run's ``--rounds``.

    See :func:`~node.training.models.recommended_defaults`: a real LM needs other lengths, learning
    rates, batch sizes and tasks than the built-in tiny models.
    """
    rec = recommended_defaults(opts.model)
    return {
        "tasks": opts.tasks or rec.tasks,
        "max_new_tokens": opts.max_new_tokens or rec.max_new_tokens,
        "learning_rate": rec.lr(opts.adapter) if opts.learning_rate is None else opts.learning_rate,
        "micro_batch_size": opts.micro_batch_size or rec.micro_batch_size,
        "eval_every": rec.eval_every if opts.eval_every is None else opts.eval_every,
        # a schedule decays over the run unless told otherwise (a constant rate has no length)
        "lr_decay_rounds": opts.lr_decay_rounds or (opts.rounds if opts.lr_scheduler_type != "constant" else 0),
    }


def from_options(cls: type[C], values: dict[str, Any], **given: Any) -> C:
    """``cls`` with each field that an option of the same name feeds, plus ``given`` (fields no option sets)."""
    taken = {f.name: values[f.name] for f in fields(cls) if f.name in values}  # type: ignore[arg-type]
    return cls(**(taken | given))


def node_configs(opts: NodeOptions, host: str, port: int, peers: tuple[str, ...] = ()) -> tuple[NodeConfig, NodeParts]:
    """The node's and its components' configs from the options; a bad value raises ValueError naming the flag.

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
