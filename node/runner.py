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

from node import checkpoint, node_state
from node.checkpoint import CheckpointConfig
from node.config import NodeConfig
from node.dashboard_data import reason_category
from node.grpo import GRPOConfig, GRPOTrainer, drop_zero_advantage
from node.logs import CONTEXT, PROGRESS
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
progress = logging.getLogger(PROGRESS)


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
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


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
        self.in_sync = False  # an outer sync round is running (it is finished, not cut, on leave)
        self.peers_seen: set[str] = set()
        self._checkpointed = -1  # round of the last checkpoint written or loaded

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> Node:
        """Load identity, model and tasks, join the swarm (bounded in time), resume if asked."""
        if self.cfg.max_threads:
            torch.set_num_threads(self.cfg.max_threads)
        identity = load_or_create(self.cfg.identity)
        self.peer_id = identity.peer_id
        self._tag = CONTEXT.peer = short_id(self.peer_id)
        device = resolve_device(self.cfg.device)
        model, tokenizer, model_id = load_model(self.cfg.model, seed=self.cfg.seed, device=device)
        self.policy = Policy(model, tokenizer, model_id, device)
        self.policy.stop = self.stop_event.is_set
        self.trainer = GRPOTrainer(self.policy, self.parts.grpo)
        names = self.cfg.tasks or tuple(BUILTIN_TASKS)
        self.families = {n: build_task(n) for n in names}
        self.task_mix = TaskMix(list(self.families.values()), seed=self.cfg.seed)
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")
        self.membership = Membership(identity, self.parts.membership, [swarm_validator()]).start()
        self.exchange = RolloutExchange(self.membership, self.parts.exchange, clock=self.clock)
        self.exchange.start()
        if self.parts.sync is not None:
            self.sync = OuterSync(self.membership, model, self.parts.sync, clock=self.clock)
        resumed = self._resume() if self.parts.checkpoint.resume else None
        self._digest_start = params_digest(model)
        self.metrics.write(
            "start",
            time=self.clock(),
            peer=self.peer_id,
            model=model_id,
            tasks=list(names),
            multiaddrs=self.membership.visible_multiaddrs(),
            params=sum(p.numel() for p in model.parameters()),
        )
        if resumed is not None:
            self.metrics.write("resume", time=self.clock(), peer=self.peer_id, round=self.round, path=str(resumed))
        logger.info("started %s on %s with tasks %s", model_id, device, ",".join(names))
        return self

    @property
    def run_dir(self) -> Path:
        """``<log-dir>/<peer-short-id>``: metrics and checkpoints of this node."""
        return Path(self.cfg.log_dir) / self._tag

    # ---- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue: weights, optimizer, outer-sync state, round, sampler RNG."""
        return node_state.capture(self)

    def save_checkpoint(self) -> Path:
        """Write a checkpoint atomically (the previous one is kept)."""
        t0 = time.monotonic()
        path = checkpoint.save(self.run_dir, self.checkpoint_state())
        self._checkpointed = self.round
        logger.info("checkpoint of round %d written in %.2fs", self.round, time.monotonic() - t0)
        return path

    def _resume(self) -> Path | None:
        """Load the newest intact checkpoint, if any; a mismatched model is a ValueError."""
        found = checkpoint.load_latest(self.run_dir)
        if found is None:
            logger.info("no checkpoint in %s; starting fresh", self.run_dir)
            return None
        state, path = found
        node_state.restore(self, state)
        self._checkpointed = self.round
        logger.warning("resumed from %s at round %d", path, self.round)
        return path

    # ---- leaving ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Withdraw from sync, write the final checkpoint and summary, leave the swarm; safe to call twice."""
        if self.sync is not None:
            self.sync.close()
        if self.metrics is not None and hasattr(self, "policy"):
            self._final_checkpoint()
            self.metrics.write(
                "summary",
                time=self.clock(),
                peer=self.peer_id,
                rounds=self.round,
                param_digest_start=self._digest_start,
                param_digest_end=params_digest(self.policy.model),
            )
        if self.exchange is not None:
            self.exchange.close()
        if self.membership is not None:
            self.membership.shutdown()
        if self.metrics is not None:
            self.metrics.close()
        self.sync, self.exchange, self.membership, self.metrics = None, None, None, None

    def _final_checkpoint(self) -> None:
        if not self.parts.checkpoint.every or self.round == self._checkpointed or self.round == 0:
            return
        try:
            self.save_checkpoint()
        except Exception as e:  # leaving anyway: the previous checkpoint is still intact
            logger.error("final checkpoint failed: %s", e)

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Run rounds until ``cfg.rounds`` are done or ``stop_event`` is set."""
        while not self.stop_event.is_set() and (self.cfg.rounds == 0 or self.round < self.cfg.rounds):
            record = self.run_round()
            if record is not None and on_round is not None:
                on_round(record)

    # ---- one round -------------------------------------------------------------------------

    def _abort_round(self, phase: str) -> None:
        """Leaving mid-round before training: the round did not happen."""
        logger.info("round %d abandoned after %s: leaving", self.round, phase)
        self.round -= 1
        CONTEXT.round = self.round

    def run_round(self) -> dict[str, Any] | None:
        """Generate, score and share local groups; take verified external ones; train once.

        ``stop_event`` is checked between phases: before training the round is
        abandoned (None is returned, the round counter is unchanged); after
        training it completes, skipping the outer sync.
        """
        self.round += 1
        CONTEXT.round = self.round
        t0 = time.monotonic()
        items = self.task_mix.sample(self.round, self.cfg.local_groups)
        local = self._generate_local(items)
        if self.stop_event.is_set():
            self._abort_round("generation")
            return None
        if self.cfg.share:
            self._publish(local)
        collected = self._collect()
        if self.stop_event.is_set():
            self._abort_round("collecting")
            return None
        external = self.pool.take(self.cfg.external_groups, self.cfg.sampling, self._rng)
        kept, n_dropped = drop_zero_advantage(local + external)
        stats = self.trainer.step(kept) if kept else {}
        sync = self._maybe_sync()
        record = self._record(local, external, collected, len(kept), n_dropped, stats.get("loss"), t0)
        self._log_progress(record, sync)
        every = self.parts.checkpoint.every
        if every and self.round % every == 0:
            self.save_checkpoint()
        return record

    def _record(
        self,
        local: list[TrainGroup],
        external: list[TrainGroup],
        collected: Collected,
        trained: int,
        dropped: int,
        loss: float | None,
        t0: float,
    ) -> dict[str, Any]:
        """Write this round's metrics event."""
        rewards = [r for g in local for r in g.rewards]
        ext_rewards = [r for g in external for r in g.rewards]
        traffic = self.exchange.stats() if self.exchange is not None else {}
        assert self.metrics is not None
        return self.metrics.write(
            "round",
            time=self.clock(),
            peer=self.peer_id,
            round=self.round,
            reward_mean=sum(rewards) / len(rewards),
            external_reward_mean=_mean(ext_rewards),
            local_groups=len(local),
            external_groups=len(external),
            external_rejected=sum(collected.reasons.values()),
            rejected_reasons=dict(collected.reasons),
            accepted_groups=collected.accepted,
            fetch_failed=collected.fetch_failed,
            reward_mismatches=collected.mismatches,
            external_peers=dict(Counter(g.source_peer for g in external)),
            batches_from=collected.from_peers,
            dropped_zero_adv=dropped,
            trained_groups=trained,
            pool=len(self.pool),
            peers_seen=len(self.peers_seen),
            bytes_in=traffic.get("bytes_in", 0),
            bytes_out=traffic.get("bytes_out", 0),
            loss=loss,
            round_s=time.monotonic() - t0,
        )

    def _log_progress(self, record: dict[str, Any], sync: str) -> None:
        """The one line per round shown by default."""
        ext = record["external_reward_mean"]
        progress.info(
            "reward %.3f (external %s) | groups %d local + %d external, %d rejected, %d no signal | "
            "pool %d | peers %d%s | %.2fs",
            record["reward_mean"], "-" if ext is None else f"{ext:.3f}", record["local_groups"],
            record["external_groups"], record["external_rejected"], record["dropped_zero_adv"],
            record["pool"], record["peers_seen"], sync, record["round_s"],
        )  # fmt: skip

    def _maybe_sync(self) -> str:
        """DiLoCo outer sync every ``sync_every`` rounds (one round = one inner step); skipped when leaving.

        Returns a few words for the progress line ("" if no sync ran).
        """
        if self.sync is None or self.stop_event.is_set():
            return ""
        self.in_sync = True
        try:
            report = self.sync.maybe_sync(self.round)
        finally:
            self.in_sync = False
        if report is None:
            return ""
        assert self.metrics is not None
        fields = report.to_metrics()
        fields.pop("event", None)
        self.metrics.write("sync", **fields)
        state = "committed" if report.committed else f"skipped ({report.reason})"
        logger.info(
            "outer sync %s: revision %d, group of %d (%.2fs)", state, report.revision, report.group_size, report.sync_s
        )
        return f" | sync r{report.revision} {state}"

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

    def _collect(self) -> Collected:
        """Fetch new peer batches, re-verify every group locally, add the good ones to the pool."""
        out = Collected()
        if self.cfg.isolated or self.cfg.collect_limit == 0:
            return out
        assert self.exchange is not None
        self.exchange.round = self.round
        since = self.clock() - self.parts.exchange.descriptor_ttl_s
        result = self.exchange.collect(since=since, limit=self.cfg.collect_limit)
        out.fetch_failed = len(result.failed)
        self.peers_seen.update(p for p, _ in result.failed)
        for peer, reason in result.rejected:
            self.peers_seen.add(peer)
            out.reasons[reason_category(reason)] += 1
            logger.info("rejected batch from %s: %s", short_id(peer), reason)
        for desc, batch in result.accepted:
            self.peers_seen.add(desc.publisher)
            out.from_peers[short_id(desc.publisher)] = out.from_peers.get(short_id(desc.publisher), 0) + 1
            good = []
            for group in batch.groups:
                verdict = verify_external(group, None, source_peer=desc.publisher)
                out.mismatches += verdict.reward_mismatches
                if verdict.group is None:
                    out.reasons[reason_category(verdict.reason)] += 1
                    logger.info("rejected group from %s: %s", short_id(desc.publisher), verdict.reason)
                else:
                    good.append(verdict.group)
            out.accepted += len(good)
            self.pool.add(good)
        return out


@dataclass
class Collected:
    """What one round's collect step brought: rejections by reason, mismatches, failures, batches per peer."""

    reasons: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    mismatches: int = 0
    fetch_failed: int = 0
    from_peers: dict[str, int] = field(default_factory=dict)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
