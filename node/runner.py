"""The node: one SAPO round after another (generate, score, share, collect, verify, train).

A round never waits for peers: ``collect`` returns whatever arrived by its
deadline, and a node with no peers trains on its local groups alone.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from node.config import NodeConfig
from node.grpo import GRPOConfig, GRPOTrainer, drop_zero_advantage
from node.metrics import MetricsWriter
from node.models import load_model
from node.policy import GenerationConfig, Policy
from node.sampling import ExternalPool
from node.tasks import BUILTIN_TASKS, TaskItem, TaskMix, build_task
from node.verify import TrainGroup, local_group, verify_external
from protocol import RolloutBatch, RolloutGroup, short_id
from swarm.exchange import ExchangeConfig, RolloutExchange
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync import RECORD_KINDS, OuterSync, OuterSyncConfig
from swarm.validation import SignedRecordValidator, rollout_validator

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    """``auto`` picks cuda, then mps, then cpu; an explicit device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps was asked for but MPS is not available; use --device cpu")
    return name


def params_digest(module: torch.nn.Module) -> str:
    """sha256 (16 hex) of all parameter bytes: tells whether training changed the weights."""
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class NodeParts:
    """Component configs of a node, each owned by its component."""

    membership: MembershipConfig = field(default_factory=MembershipConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sync: OuterSyncConfig | None = None  # None: no outer sync (SAPO sharing only)


def swarm_validator() -> SignedRecordValidator:
    """One DHT validator for every signed record kind a node stores (all nodes must agree)."""
    return SignedRecordValidator({**rollout_validator().kinds, **RECORD_KINDS})


class Node:
    """A training node. ``start()``, then ``run()`` (or ``run_round()``), always ``shutdown()``."""

    def __init__(self, cfg: NodeConfig, parts: NodeParts | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.parts = parts or NodeParts()
        self.clock = clock
        self.round = 0
        self.stop_event = threading.Event()
        self.membership: Membership | None = None
        self.exchange: RolloutExchange | None = None
        self.pool: ExternalPool[TrainGroup] = ExternalPool(cfg.pool_capacity)
        self._rng = random.Random(cfg.seed)
        self._tag = "------"
        self.metrics: MetricsWriter | None = None
        self.sync: OuterSync | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> Node:
        """Load identity, model and tasks, then join the swarm (bounded in time)."""
        if self.cfg.max_threads:
            torch.set_num_threads(self.cfg.max_threads)
        identity = load_or_create(self.cfg.identity)
        self.peer_id = identity.peer_id
        self._tag = short_id(self.peer_id)
        device = resolve_device(self.cfg.device)
        model, tokenizer, model_id = load_model(self.cfg.model, seed=self.cfg.seed, device=device)
        self.policy = Policy(model, tokenizer, model_id, device)
        self.trainer = GRPOTrainer(self.policy, self.parts.grpo)
        names = self.cfg.tasks or tuple(BUILTIN_TASKS)
        self.families = {n: build_task(n) for n in names}
        self.task_mix = TaskMix(list(self.families.values()), seed=self.cfg.seed)
        self.metrics = MetricsWriter(Path(self.cfg.log_dir) / self._tag / "metrics.jsonl")
        self._digest_start = params_digest(model)
        self.membership = Membership(identity, self.parts.membership, [swarm_validator()]).start()
        self.exchange = RolloutExchange(self.membership, self.parts.exchange, clock=self.clock)
        self.exchange.start()
        if self.parts.sync is not None:
            self.sync = OuterSync(self.membership, model, self.parts.sync, clock=self.clock)
        self.metrics.write(
            "start",
            time=self.clock(),
            peer=self.peer_id,
            model=model_id,
            tasks=list(names),
            multiaddrs=self.membership.visible_multiaddrs(),
            params=sum(p.numel() for p in model.parameters()),
        )
        logger.info("[%s r=0] started %s on %s with tasks %s", self._tag, model_id, device, ",".join(names))
        return self

    def shutdown(self) -> None:
        """Leave the swarm and close files; safe to call twice."""
        if self.metrics is not None and hasattr(self, "policy"):
            self.metrics.write(
                "summary",
                time=self.clock(),
                peer=self.peer_id,
                rounds=self.round,
                param_digest_start=self._digest_start,
                param_digest_end=params_digest(self.policy.model),
            )
        if self.sync is not None:
            self.sync.close()
        if self.exchange is not None:
            self.exchange.close()
        if self.membership is not None:
            self.membership.shutdown()
        if self.metrics is not None:
            self.metrics.close()
        self.sync, self.exchange, self.membership, self.metrics = None, None, None, None

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Run rounds until ``cfg.rounds`` are done or ``stop_event`` is set."""
        while not self.stop_event.is_set() and (self.cfg.rounds == 0 or self.round < self.cfg.rounds):
            record = self.run_round()
            if on_round is not None:
                on_round(record)

    # ---- one round -------------------------------------------------------------------------

    def run_round(self) -> dict[str, Any]:
        """Generate, score and share local groups; take verified external ones; train once."""
        self.round += 1
        t0 = time.monotonic()
        items = self.task_mix.sample(self.round, self.cfg.local_groups)
        local = self._generate_local(items)
        if self.cfg.share:
            self._publish(local)
        rejected, mismatches, fetch_failed, from_peers = self._collect()
        external = self.pool.take(self.cfg.external_groups, self.cfg.sampling, self._rng)
        kept, n_dropped = drop_zero_advantage(local + external)
        stats = self.trainer.step(kept) if kept else {}
        self._maybe_sync()
        rewards = [r for g in local for r in g.rewards]
        ext_rewards = [r for g in external for r in g.rewards]
        assert self.metrics is not None
        record = self.metrics.write(
            "round",
            time=self.clock(),
            peer=self.peer_id,
            round=self.round,
            reward_mean=sum(rewards) / len(rewards),
            external_reward_mean=_mean(ext_rewards),
            local_groups=len(local),
            external_groups=len(external),
            external_rejected=rejected,
            fetch_failed=fetch_failed,
            reward_mismatches=mismatches,
            external_peers=dict(Counter(g.source_peer for g in external)),
            batches_from=from_peers,
            dropped_zero_adv=n_dropped,
            trained_groups=len(kept),
            pool=len(self.pool),
            loss=stats.get("loss"),
            round_s=time.monotonic() - t0,
        )
        logger.info(
            "[%s r=%d] reward %.3f | external %d used, %d rejected | %.2fs",
            self._tag,
            self.round,
            record["reward_mean"],
            len(external),
            rejected,
            record["round_s"],
        )
        return record

    def _maybe_sync(self) -> None:
        """DiLoCo outer sync every ``sync_every`` rounds (one round = one inner step)."""
        if self.sync is None:
            return
        report = self.sync.maybe_sync(self.round)
        if report is not None:
            assert self.metrics is not None
            fields = report.to_metrics()
            fields.pop("event", None)
            self.metrics.write("sync", **fields)
            logger.info(
                "[%s r=%d] outer sync %s: revision %d, group of %d, %s (%.2fs)",
                self._tag, self.round, "committed" if report.committed else "skipped",
                report.revision, report.group_size, report.reason, report.sync_s,
            )  # fmt: skip

    def _generate_local(self, items: list[TaskItem]) -> list[TrainGroup]:
        completions = self.policy.generate(
            [it.prompt for it in items],
            self.cfg.num_generations,
            self.parts.generation,
            seed=self.cfg.seed * 1_000_003 + self.round,
        )
        return [
            local_group(self.families[item.ref.family], item, comps, self.peer_id)
            for item, comps in zip(items, completions, strict=True)
        ]

    def _publish(self, local: list[TrainGroup]) -> None:
        assert self.exchange is not None
        groups = tuple(
            RolloutGroup(g.task_ref, g.prompt, g.completions, g.rewards, self.policy.model_id) for g in local
        )
        batch = RolloutBatch(self.peer_id, self.round, self.clock(), groups)
        try:
            self.exchange.publish(batch)
        except Exception as e:  # network trouble skips sharing this round; training goes on
            logger.warning("[%s r=%d] publish failed: %s", self._tag, self.round, e)

    def _collect(self) -> tuple[int, int, int, dict[str, int]]:
        """Fetch new peer batches, re-verify every group locally, add the good ones to the pool.

        Returns (trust rejections, claimed-reward mismatches, fetch failures, batches per peer).
        """
        if self.cfg.isolated or self.cfg.collect_limit == 0:
            return 0, 0, 0, {}
        assert self.exchange is not None
        self.exchange.round = self.round
        since = self.clock() - self.parts.exchange.descriptor_ttl_s
        result = self.exchange.collect(since=since, limit=self.cfg.collect_limit)
        rejected, mismatches, from_peers = len(result.rejected), 0, Counter[str]()
        for peer, reason in result.rejected:
            logger.warning("[%s r=%d] rejected batch from %s: %s", self._tag, self.round, short_id(peer), reason)
        for desc, batch in result.accepted:
            from_peers[short_id(desc.publisher)] += 1
            good = []
            for group in batch.groups:
                verdict = verify_external(group, None, source_peer=desc.publisher)
                mismatches += verdict.reward_mismatches
                if verdict.group is None:
                    rejected += 1
                    logger.warning(
                        "[%s r=%d] rejected group from %s: %s",
                        self._tag, self.round, short_id(desc.publisher), verdict.reason,
                    )  # fmt: skip
                else:
                    good.append(verdict.group)
            self.pool.add(good)
        return rejected, mismatches, len(result.failed), dict(from_peers)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
