"""Assembling a node's configs from its options: the node's own, and each component's.

Kept apart from :mod:`node.core.options` because it imports the components
(torch, transformers, hivemind), which the command line must not wait for.
"""

from __future__ import annotations

from node.core.checkpoint import CheckpointConfig
from node.core.config import NodeConfig, NodeParts
from node.core.ingest import IngestConfig
from node.core.options import NodeOptions, default_of
from node.training.adapters import AdapterConfig, parse_targets
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.models import recommended_defaults
from node.training.offpolicy import BASELINES, OffPolicyConfig
from node.training.policy import GenerationConfig
from swarm.exchange import ExchangeConfig
from swarm.membership import MembershipConfig
from swarm.sync import OuterSyncConfig


def node_configs(opts: NodeOptions, host: str, port: int, peers: tuple[str, ...] = ()) -> tuple[NodeConfig, NodeParts]:
    """The node's and its components' configs from the options; a bad value raises ValueError naming the fix.

    Per-model defaults (:func:`~node.training.models.recommended_defaults`) fill
    ``max_new_tokens`` (when 0), the learning rate (when None) and the tasks (when none is given).
    """
    if not 0 <= opts.min_generate <= 3600:
        raise ValueError(f"--min-generate {opts.min_generate:g}: use seconds in [0, 3600] (0: off), e.g. 20")
    if not 0 < opts.max_source_share <= 16:
        raise ValueError(
            f"--max-source-share {opts.max_source_share:g}: use a share of the node's own rows in (0, 16], e.g. 0.5"
        )
    if opts.max_source_share * opts.local_groups < 1:
        raise ValueError(
            f"--max-source-share {opts.max_source_share:g} with --local {opts.local_groups} lets a peer supply less "
            f"than one group, so no peer's group would be trained on; use at least {1 / opts.local_groups:g}"
        )
    if not 0 <= opts.warm_start <= 100_000:
        raise ValueError(f"--warm-start {opts.warm_start}: use 0 (off) or a number of steps up to 100000, e.g. 40")
    rec = recommended_defaults(opts.model)
    cfg = NodeConfig(
        model=opts.model, tasks=tuple(opts.task) or rec.tasks, accept_tasks=tuple(opts.accept_task), seed=opts.seed,
        rounds=opts.rounds, warm_start_steps=opts.warm_start,
        local_groups=opts.local_groups, external_groups=opts.external_groups, num_generations=opts.generations,
        sampling=opts.sampling, log_dir=opts.log_dir, device=opts.device, max_threads=opts.max_threads,
        identity=opts.identity, overlap_network=not opts.wait_network, network_wait_s=opts.network_wait,
        diagnose_groups=opts.diagnose_groups, min_generate_s=opts.min_generate,
        max_source_share=opts.max_source_share,
    )  # fmt: skip
    if opts.micro_batch < 0:
        raise ValueError(f"--micro-batch {opts.micro_batch}: use 0 (the model's default) or a positive count, e.g. 2")
    if opts.sync_every < 0:
        raise ValueError(f"--sync-every {opts.sync_every}: use 0 (off) or a positive number of rounds")
    if not (opts.sync_period == 0 or opts.sync_period >= 1):
        raise ValueError(f"--sync-period {opts.sync_period:g}: use 0 (count --sync-every rounds) or at least 1 second")
    if not opts.sync_window > 0:
        raise ValueError(f"--sync-window {opts.sync_window:g}: use a positive number of seconds (default 5)")
    if not opts.sync_timeout >= OuterSyncConfig.dht_timeout_s:
        raise ValueError(
            f"--sync-timeout {opts.sync_timeout:g}: use at least {OuterSyncConfig.dht_timeout_s:g} seconds (one DHT "
            "call's bound; default 60)"
        )
    sync = None
    if opts.sync_every > 0 or opts.sync_period != 0:
        defaults = OuterSyncConfig()
        sync = OuterSyncConfig(
            sync_every=opts.sync_every or defaults.sync_every, sync_period_s=opts.sync_period,
            eager=not opts.sync_blocking, matchmaking_timeout_s=opts.sync_window,
            allreduce_timeout_s=opts.sync_timeout, compression=opts.sync_compression, outer_lr=opts.outer_lr,
            outer_momentum=opts.outer_momentum, aggregator=opts.sync_aggregator,
            direct_payloads=not opts.sync_stream_only,
        )  # fmt: skip
    membership = MembershipConfig(
        swarm_id=opts.swarm_id, host=host, port=port, announce=tuple(opts.announce), initial_peers=peers,
        client_mode=opts.client_mode, use_relay=not opts.no_relay, use_auto_relay=opts.auto_relay,
        bootstrap_attempts=opts.bootstrap_attempts,
    )  # fmt: skip
    generation = GenerationConfig(
        temperature=opts.temperature, max_new_tokens=opts.max_new_tokens or rec.max_new_tokens
    )
    learning_rate = rec.lr(opts.adapter) if opts.lr is None else opts.lr
    parts = NodeParts(
        membership=membership,
        exchange=ExchangeConfig(),
        generation=generation,
        grpo=GRPOConfig(
            learning_rate=learning_rate,
            micro_batch_size=opts.micro_batch or rec.micro_batch_size,
            gradient_checkpointing=opts.gradient_checkpointing,
        ),
        sync=sync,
        checkpoint=CheckpointConfig(every=opts.checkpoint_every, resume=opts.resume),
        ingest=IngestConfig(accept_tokens=opts.accept_tokens),
        offpolicy=offpolicy_config(opts),
        adapter=adapter_config(opts),
        evaluation=eval_config(opts),
    )
    return cfg, parts


def eval_config(opts: NodeOptions) -> EvalConfig:
    """The evaluation options as the evaluator's config; a bad value is one sentence naming the flag."""
    if opts.eval_every < 0:
        raise ValueError(f"--eval-every {opts.eval_every}: use 0 (off) or a positive number of rounds, e.g. 10")
    if not 1 <= opts.eval_items <= 4096:
        raise ValueError(f"--eval-items {opts.eval_items}: use 1-4096 questions per family, e.g. 64")
    if not 0 <= opts.eval_samples <= 64:
        raise ValueError(f"--eval-samples {opts.eval_samples}: use 0 (greedy only) to 64, e.g. 8")
    if not opts.eval_timeout > 0:
        raise ValueError(f"--eval-timeout {opts.eval_timeout:g}: use a positive number of seconds, e.g. 60")
    return EvalConfig(
        every=opts.eval_every, items=opts.eval_items, samples=opts.eval_samples, timeout_s=opts.eval_timeout
    )


def offpolicy_config(opts: NodeOptions) -> OffPolicyConfig:
    """The off-policy options as the trainer's config; a bad value is one sentence naming the flag."""
    if opts.external_min_logp is not None and not opts.external_min_logp < 0:
        raise ValueError(f"--external-min-logp {opts.external_min_logp:g}: use a negative log-probability (e.g. -5)")
    if not 0 <= opts.external_is_cap <= 100:
        raise ValueError(f"--external-is-cap {opts.external_is_cap:g}: use 0 (off) or a cap in (0, 100], e.g. 1")
    if opts.external_baseline not in BASELINES:
        raise ValueError(f"--external-baseline {opts.external_baseline}: use one of {', '.join(BASELINES)}")
    return OffPolicyConfig(
        min_token_logp=opts.external_min_logp, is_cap=opts.external_is_cap, baseline=opts.external_baseline
    )


def adapter_config(opts: NodeOptions) -> AdapterConfig:
    """The adapter options as the adapter's config; a bad value, or a ``--lora-*`` flag without
    ``--adapter lora`` (it would do nothing), is one sentence naming the flag."""
    if opts.adapter == "none":
        for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
            value = getattr(opts, name)
            if value != default_of(NodeOptions, name):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {value} has no effect without --adapter lora; add --adapter lora or drop it")
    return AdapterConfig(
        kind=opts.adapter, rank=opts.lora_rank, alpha=opts.lora_alpha, dropout=opts.lora_dropout,
        targets=parse_targets(opts.lora_targets),
    )  # fmt: skip
