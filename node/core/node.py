"""The node: one SAPO round after another (generate, score, share, collect, verify, train).

A round never waits for peers: publishing and collecting run on a thread
beside the rounds (:mod:`node.core.network`), each round ingests the newest
finished collect, and a node with no peers trains on its local groups alone.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import resource
import statistics
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from node.core import checkpoint
from node.core import state as node_state
from node.core.clock import SYSTEM_CLOCK, Clock
from node.core.config import NodeConfig, NodeParts
from node.core.credit import SourceCredit
from node.core.ingest import SeenPeers, ingest
from node.core.links import Exchange, Joining, Links, LinksFactory, Sync, hivemind_links
from node.core.network import CollectJob, NetworkWorker
from node.core.pool import ExternalPool
from node.core.record import Collected, RoundRecord, banned_count, mean, most_refused
from node.observe import resources
from node.observe.alerts import Alert, PeerWatch
from node.observe.logs import CONTEXT, PROGRESS, ROUNDS
from node.observe.metrics import MetricsWriter, read_events
from node.observe.progress import ProgressWindow
from node.observe.report_to import metrics_writer
from node.tasks.acceptance import Acceptance
from node.tasks.registry import BUILTIN_TASKS, TaskItem, TaskMix, build_task
from node.tasks.verify import TrainGroup, local_group
from node.training.adapters import SHARED_BASE_SEED, attach_adapter
from node.training.device import params_digest, resolve_device
from node.training.evaluate import EvalResult, eval_sets, evaluate, short_sets
from node.training.grpo import GRPOTrainer
from node.training.models import check_model_name, load_model
from node.training.policy import Policy, TokenMeter
from node.training.share import ShareControl
from node.training.tokenizer import max_token_chars
from node.training.warmstart import warm_start
from protocol import RolloutBatch, RolloutGroup, short_id
from swarm.identity import IdentityLock, load_or_create
from swarm.sync import SyncOutcome, SyncReport

logger = logging.getLogger(__name__)
progress = logging.getLogger(PROGRESS)
per_round = logging.getLogger(ROUNDS)

NETWORK_CLOSE_S = 5.0
"""How long leaving waits for a publish or collect under way (it is bounded anyway; SIGTERM must exit in 30 s)."""
SYNC_LEAVE_WAIT_S = 15.0
"""Longest leaving waits for a sync running beside training (so its commit is kept); after it the node
leaves without it, within the leave bound (the other members see a lost voter and abort that round)."""


def token_rates(
    before: TokenMeter, generated: TokenMeter, trained: int, train_s: float
) -> tuple[float | None, float | None]:
    """A round's tokens per second of sampling (inside the sampler's calls) and of training (tokens through
    the step's passes over its seconds); None where the round did none."""
    sampled, sample_s = generated.sampled - before.sampled, generated.sample_s - before.sample_s
    sampling = round(sampled / sample_s, 1) if sampled and sample_s > 0 else None
    return sampling, round(trained / train_s, 1) if trained and train_s > 0 else None


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process (its threads included, its p2pd child not)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Node:
    """A training node. ``start()``, then ``run()`` (or ``run_round()``), always ``shutdown()``.

    ``links`` joins the swarm once the identity is loaded and builds the network
    collaborators once the model is (default: the hivemind swarm); ``clock`` gives the wall time of
    records and collect windows, the monotonic time of phases and deadlines, and the pacing wait.
    Both are replaced in tests.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        parts: NodeParts | None = None,
        clock: Clock = SYSTEM_CLOCK,
        links: LinksFactory = hivemind_links,
    ) -> None:
        self.cfg = cfg
        self.parts = parts or NodeParts()
        self.clock = clock
        self._links_factory = links
        self.round = 0
        self.stop_event = threading.Event()
        self._joining: Joining | None = None  # in the swarm, before its links exist
        self.links: Links | None = None
        self.exchange: Exchange | None = None
        self.network: NetworkWorker | None = None
        self.pool: ExternalPool[TrainGroup] = ExternalPool(cfg.pool_capacity)
        self.sampler_rng = random.Random(cfg.seed)
        self.credit = SourceCredit()
        off = self.parts.offpolicy
        self.share = ShareControl(cfg.external_groups, off.share_threshold)  # fixed at J unless adaptive_share
        self._share_slots = cfg.external_groups  # peers' slots of the round under way
        self._rates: tuple[float | None, float | None] = (None, None)  # sampling and training tokens per second
        self._tag = "------"
        self.metrics: MetricsWriter | None = None
        self.sync: Sync | None = None
        self.in_sync = False  # an outer sync round is running (it is finished, not cut, on leave)
        self._outer_moved = False  # the last round applied a sync that moved the outer state: checkpoint it
        self.peers_seen = SeenPeers()
        self._checkpointed = -1  # round of the last checkpoint written or loaded
        self._eval_owed = False  # resumed at a round whose due evaluation was cut short (or never written)
        self._digest_start = ""  # weights' digest at start (set once the model is loaded)
        self._identity_lock: IdentityLock | None = None
        self._progress = ProgressWindow()
        self.watch: PeerWatch | None = None  # whether peers are heard and syncs meet one (from the first round)
        self._sync_outcome = ""  # how the sync that ended this round ended, for the progress summary

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> Node:
        """Load identity, join the swarm (bounded in time), load model and tasks, start sharing, resume if asked.

        The node listens before it loads its model: the model's imports and weights take seconds, the
        swarm is reachable meanwhile, and a bootstrap that fails does so before them. It publishes and
        serves nothing until the model is loaded (see :class:`~node.core.links.Joining`).
        """
        if self.cfg.max_threads:
            torch.set_num_threads(self.cfg.max_threads)
        identity = load_or_create(self.cfg.identity)
        # one running node per key: a second p2pd with the same peer id would break both nodes' connections
        self._identity_lock = IdentityLock(identity).acquire()
        self.peer_id = identity.peer_id
        self._tag = CONTEXT.peer = short_id(self.peer_id)
        device = resolve_device(self.cfg.device)
        # a mistyped model or task fails before the network starts
        check_model_name(self.cfg.model)
        names = self.cfg.tasks or tuple(BUILTIN_TASKS)
        self.families = {n: build_task(n) for n in names}
        logger.info("start-up: joining the swarm")
        self._joining = self._links_factory(identity, self.parts, self.clock)
        logger.info("start-up: joined the swarm, listening on %s", " ".join(self._joining.multiaddrs()))
        logger.info("start-up: loading model %s", self.cfg.model)
        adapter = self.parts.adapter
        # a frozen base is shared: a built-in model's is the same init on every peer (see SHARED_BASE_SEED);
        # so are the trained weights under the outer sync, whose revision 0 must be one state swarm-wide
        # and so is a warm start's prior, which all nodes of one model compute from the same weights
        synced = self.parts.sync is not None
        shared = synced or self.cfg.warm_start_steps > 0
        base_seed = SHARED_BASE_SEED if adapter.enabled or shared else self.cfg.seed
        model, tokenizer, model_id = load_model(self.cfg.model, seed=base_seed, device=device)
        if adapter.enabled:
            model = attach_adapter(model, adapter, seed=SHARED_BASE_SEED if shared else self.cfg.seed)
        self.policy = Policy(model, tokenizer, model_id, device)
        self.policy.stop = self.stop_event.is_set
        measure = self.cfg.diagnose_groups or self.cfg.sampling == "credit"  # credit is learned from the diagnostics
        self.trainer = GRPOTrainer(self.policy, self.parts.grpo, self.parts.offpolicy, measure)
        self.task_mix = TaskMix(list(self.families.values()), seed=self.cfg.seed)
        warm_start(self.policy, self.families, self.cfg.warm_start_steps)
        self.eval_sets = (
            eval_sets(self.families, self.parts.evaluation.eval_items) if self.parts.evaluation.eval_every else {}
        )
        if short := short_sets(self.eval_sets, self.parts.evaluation.eval_items):
            logger.warning("%s", short)
        self.acceptance = self._acceptance()
        self._digest_start = params_digest(model)
        self.metrics = metrics_writer(
            self.run_dir / "metrics.jsonl", self.cfg.report_to, self._tag, self.parts.membership.swarm_id
        )
        self.links = self._joining.links(model)
        logger.info("start-up: sharing with the swarm")
        self.exchange, self.sync = self.links.exchange, self.links.sync
        if self.sync is not None:
            threading.Thread(target=self._withdraw_sync_on_stop, name="swarm-node-leave", daemon=True).start()
        if self.exchange is not None:
            self.network = NetworkWorker(self.exchange, inline=not self.cfg.overlap_network, clock=self.clock.monotonic)
        resumed = self._resume() if self.parts.checkpoint.resume else None
        self.metrics.write(
            "start",
            time=self.clock(),
            peer=self.peer_id,
            model=model_id,
            tasks=list(names),
            multiaddrs=self.links.multiaddrs(),
            params=sum(p.numel() for p in model.parameters()),
            trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        )
        if resumed is not None:
            self._eval_owed = self._evaluation_missing()
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
        t0 = self.clock.monotonic()
        path = checkpoint.save(self.run_dir, self.checkpoint_state())
        self._checkpointed = self.round
        logger.info("checkpoint of round %d written in %.2fs", self.round, self.clock.monotonic() - t0)
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

    def _evaluation_missing(self) -> bool:
        """Whether the restored round was due a held-out evaluation that left no complete score.

        A stop during an evaluation ends it partial, and the round's checkpoint follows; a resumed run
        would otherwise lack that round's score (a sweep's table reads every node's).
        """
        if not self.parts.evaluation.due(self.round, self.cfg.rounds):
            return False
        events = read_events(self.run_dir / "metrics.jsonl", "eval")
        return not any(int(e.get("round", -1)) == self.round and e.get("complete") for e in events)

    # ---- leaving ---------------------------------------------------------------------------

    def _withdraw_sync_on_stop(self) -> None:
        """Tell the outer sync at once when leaving is asked for, not at the next round boundary.

        Ctrl-C and most service managers signal the whole process group: p2pd stops at once, and a
        sync that went on to vote could commit on stale local reads while its partners abort.
        """
        self.stop_event.wait()
        sync = self.sync
        if sync is not None:
            sync.cancel()

    def shutdown(self) -> None:
        """Withdraw from sync, write the final checkpoint and summary, leave the swarm; safe to call twice."""
        if self.sync is not None:
            report = self.sync.finish(SYNC_LEAVE_WAIT_S)  # a sync under way: its commit is kept and checkpointed
            if report is not None:
                self._write_sync(report)
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
                cpu_s=round(_cpu_seconds(), 3),
            )
        if self.network is not None:  # before the exchange it uses; a step under way is bounded by its own timeouts
            self.network.close(timeout_s=NETWORK_CLOSE_S)
        if self.exchange is not None:
            self.exchange.close()
        if self.links is not None:
            self.links.leave()
        elif self._joining is not None:  # a start that failed between joining and the links
            self._joining.leave()
        if self.metrics is not None:
            self.metrics.close()
        if self._identity_lock is not None:  # last: the DHT and p2pd using this identity have stopped
            self._identity_lock.release()
        self.sync, self.exchange, self.links, self.metrics, self.network = None, None, None, None, None
        self._joining = None

    def _final_checkpoint(self) -> None:
        if not self.parts.checkpoint.checkpoint_every or self.round == self._checkpointed or self.round == 0:
            return
        try:
            self.save_checkpoint()
        except Exception as e:  # leaving anyway: the previous checkpoint is still intact
            logger.error("final checkpoint failed: %s", e)

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> None:
        """Run rounds until ``cfg.rounds`` are done or ``stop_event`` is set.

        A node at round 0 first scores its starting point, which every later held-out score is compared
        with. That is here, not in :meth:`start`: on a CPU it takes minutes for a real model, and a node
        is up (listening, announced to ``local``) before it.
        """
        if self.round == 0 or self._eval_owed:
            self._eval_owed = False
            self._maybe_evaluate()
        self.start_watch()
        last = None
        while not self.stop_event.is_set() and (self.cfg.rounds == 0 or self.round < self.cfg.rounds):
            record = self.run_round()
            if record is not None:
                last = record
                if on_round is not None:
                    on_round(record)
        if (line := self._progress.flush(last, self.clock.monotonic())) is not None:
            progress.info("%s", line)  # the last rounds' numbers, and the final held-out score

    def start_watch(self) -> None:
        """Start timing whether peers are heard: from the first round (waiting to be released is not training)."""
        net = self.parts.membership
        now = self.clock.monotonic()
        hears = not self.cfg.isolated and self.cfg.collect_limit > 0
        peers = len(net.initial_peers)
        self.watch = PeerWatch(net.swarm_id, self.policy.model_id, now, peers, net.alone_after_s, hears)

    # ---- one round -------------------------------------------------------------------------

    def _abort_round(self, phase: str) -> None:
        """Leaving mid-round before training: the round did not happen."""
        logger.info("round %d abandoned after %s: leaving", self.round, phase)
        self.round -= 1
        CONTEXT.round = self.round

    def run_round(self) -> RoundRecord | None:
        """Generate, score and share local groups; take verified external ones; train once.

        ``stop_event`` is checked between phases: before training the round is
        abandoned (None is returned, the round counter is unchanged); after
        training it completes, skipping the outer sync.
        """
        self.round += 1
        CONTEXT.round = self.round
        t0 = self.clock.monotonic()
        adaptive = self.parts.offpolicy.adaptive_share
        taken = self._share_slots = self.share.taken if adaptive else self.cfg.external_groups
        # a slot peers' groups give back is one more group of this node's own: equal groups trained per round
        items = self.task_mix.sample(self.round, self.cfg.local_groups + self.cfg.external_groups - taken)
        self._request_collect()
        before = dataclasses.replace(self.policy.meter)
        local = self._generate_local(items)
        generated = dataclasses.replace(self.policy.meter)
        # pacing (min_generate_s): a tiny model in a local swarm stands in for a bigger one, so the swarm keeps
        # a real round's length and DHT load per second; the wait ends at once on stop
        self.clock.wait(self.stop_event, max(0.0, t0 + self.cfg.min_generate_s - self.clock.monotonic()))
        t_gen = self.clock.monotonic()
        if self.stop_event.is_set():
            self._abort_round("generation")
            return None
        collected = self._share_and_collect(local, wait_s=min(self.cfg.network_wait_s, t_gen - t0))
        t_collect = self.clock.monotonic()
        if self.stop_event.is_set():
            self._abort_round("collecting")
            return None
        useful = self.trainer.has_signal  # what "advantage" sampling prefers: groups that would move this policy
        order = self._credit_order if self.cfg.sampling == "credit" else None
        quota = int(self.cfg.max_source_share * self.cfg.local_groups * self.cfg.num_generations)
        external = self.pool.take(taken, self.cfg.sampling, self.sampler_rng, useful, order, quota)
        probe = self.pool.take(self.share.probe(), self.cfg.sampling, self.sampler_rng, useful, order, quota)
        scored = self.policy.meter.scored
        stats = self.trainer.step(local + external, done=self.round - 1, probe=probe)
        trained = self.policy.meter.scored - scored
        if self.parts.offpolicy.adaptive_share:
            self.share.observe(stats.get("share"))
        if stats.get("alignment"):
            self.credit.observe(stats["alignment"], {g.source_peer: g.source_model for g in external})
        n_dropped = int(stats.get("n_dropped", 0))
        phases = (t_gen - t0, t_collect - t_gen, self.clock.monotonic() - t_collect)
        self._rates = token_rates(before, generated, trained, phases[2])
        sync = self._maybe_sync()
        # before the round's record: a run that ends when every node recorded its last round ends after its
        # last evaluation; the evaluation's time is not the round's
        evaluated = self._maybe_evaluate()
        record = self._record(local, external, collected, n_dropped, stats, t0, phases, evaluated)
        self._log_progress(record, sync)
        self._watch_peers(record.round_s)
        every = self.parts.checkpoint.checkpoint_every
        # a checkpoint right after the outer state moved: a crash that restored an older revision would
        # make this node extend that one again, forking the group's history
        if every and (self.round % every == 0 or self._outer_moved):
            self.save_checkpoint()
        return record

    def _maybe_evaluate(self) -> EvalResult | None:
        """Score the policy on the held-out questions when due (``eval`` event and a progress line)."""
        if not self.parts.evaluation.due(self.round, self.cfg.rounds) or self.stop_event.is_set():
            return None
        result = evaluate(
            self.policy, self.families, self.eval_sets, self.parts.generation, self.parts.evaluation,
            self.clock.monotonic,
        )  # fmt: skip
        assert self.metrics is not None
        self.metrics.write("eval", time=self.clock(), peer=self.peer_id, round=self.round, **result.to_event())
        sampled = "-" if result.sample_reward is None else f"{result.sample_reward:.3f}"
        self._progress.evaluated(result.accuracy, self.round, result.complete)
        per_round.info(
            "held-out accuracy %.3f (sampled reward %s) on %d questions%s | %.2fs",
            result.accuracy, sampled, result.items, "" if result.complete else " (time bound: partial)",
            result.eval_s,
        )  # fmt: skip
        return result

    def _record(
        self,
        local: list[TrainGroup],
        external: list[TrainGroup],
        collected: Collected,
        dropped: int,
        stats: dict[str, Any],
        t0: float,
        phases: tuple[float, float, float],
        evaluated: EvalResult | None = None,
    ) -> RoundRecord:
        """This round's record, also written as the ``round`` metrics event.

        ``stats`` is the trainer's (:meth:`GRPOTrainer.step`); ``phases`` the seconds spent
        generating, sharing and collecting, and training.
        """
        rewards = [r for g in local for r in g.rewards]
        traffic = self.exchange.stats() if self.exchange is not None else {}
        reputation = self.exchange.reputation_summary() if self.exchange is not None else {}
        trained = int(stats.get("n_groups", 0))
        # what the step trained on from each peer, after its defences (the plausibility gate, the share cap)
        influence = (
            {k: int(v) for k, v in stats.get("publisher_rows", {}).items()},
            {k: round(float(v), 4) for k, v in stats.get("publisher_adv", {}).items()},
        )
        # the completions those defences cut count as refusals by their reason, beside the ingest's
        reasons = collected.reasons + Counter(stats.get("cut", {}))
        record = RoundRecord(
            time=self.clock(),
            peer=self.peer_id,
            round=self.round,
            reward_mean=sum(rewards) / len(rewards),
            external_reward_mean=mean([r for g in external for r in g.rewards]),
            local_groups=len(local),
            external_groups=len(external),
            external_rejected=sum(reasons.values()),
            rejected_reasons=dict(reasons),
            accepted_groups=collected.accepted,
            fetch_failed=collected.fetch_failed,
            reward_mismatches=collected.mismatches,
            external_peers=dict(Counter(g.source_peer for g in external)),
            source_rows=influence[0],
            source_adv=influence[1],
            trimmed_completions=collected.trimmed,
            batches_from=collected.from_peers,
            refused_from=most_refused(collected.refused_from),
            dropped_zero_adv=dropped,
            too_long_skipped=int(stats.get("n_too_long", 0)),
            trained_groups=trained,
            pool=len(self.pool),
            peers_seen=len(self.peers_seen),
            banned_peers=banned_count(reputation),
            task_builds=collected.task_builds,
            bytes_in=traffic.get("bytes_in", 0),
            bytes_out=traffic.get("bytes_out", 0),
            fetched_via_relay=traffic.get("fetch_relayed", 0),
            loss=stats.get("loss") if trained else None,
            lr=float(stats["lr"]),  # the trainer reports the rate it stepped at
            ingest_s=collected.ingest_s,
            generate_s=phases[0],
            share_s=phases[1],
            train_s=phases[2],
            collect_s=collected.collect_s,
            round_s=self.clock.monotonic() - t0 - (evaluated.eval_s if evaluated is not None else 0.0),
            descriptors_seen=collected.descriptors_seen,
            external_age_s=collected.external_age_s,
            store_s=traffic["store_ms"] / 1000 if traffic.get("store_ms") else None,
            stores=traffic.get("published", 0),
            stores_failed=traffic.get("publish_failed", 0),
            trained_sources=stats.get("sources", {}),
            grad_local=stats.get("grad_local"),
            grad_external=stats.get("grad_external"),
            grad_cos=stats.get("grad_cos"),
            share_taken=self._share_slots if self.parts.offpolicy.adaptive_share else None,
            share_value=self.share.value() if self.parts.offpolicy.adaptive_share else None,
            source_credit=self.credit.per_model() if self.cfg.sampling == "credit" else {},
            sample_tokens_per_s=self._rates[0],
            train_tokens_per_s=self._rates[1],
            **dataclasses.asdict(resources.sample()),
        )
        assert self.metrics is not None
        self.metrics.write(RoundRecord.EVENT, **record.to_event())
        return record

    def _credit_order(self, groups: list[TrainGroup]) -> list[int]:
        """The ``credit`` policy's ranking of groups with signal (see :mod:`node.core.credit`)."""
        return self.credit.rank([self.credit.score(g.source_peer, g.source_model) for g in groups], self.sampler_rng)

    def _log_progress(self, r: RoundRecord, sync: str) -> None:
        """The progress summary every few seconds (by default), and the line per round (``-v``)."""
        line = self._progress.add(r, self.clock.monotonic(), self._sync_outcome)
        if line is not None:
            progress.info("%s", line)
        ext = r.external_reward_mean
        per_round.info(
            "reward %.3f (external %s) | groups %d local + %d external, %d rejected, %d no signal | "
            "pool %d | peers %d%s | %.2fs",
            r.reward_mean, "-" if ext is None else f"{ext:.3f}", r.local_groups, r.external_groups,
            r.external_rejected, r.dropped_zero_adv, r.pool, r.peers_seen, sync, r.round_s,
        )  # fmt: skip

    def _watch_peers(self, round_s: float) -> None:
        """Say once when this node stops hearing peers of its swarm, and once when it hears them again."""
        if self.watch is None:
            return
        now = self.clock.monotonic()
        connected = None
        membership = self.links.membership if self.links is not None else None
        if membership is not None and self.watch.due_alone(now, round_s):  # only then is the count worth a call
            connected = membership.connected_peers()
        self._alert(self.watch.check(now, round_s, connected))

    def _alert(self, alert: Alert | None) -> None:
        if alert is not None:
            progress.log(alert.level, "%s", alert.text)

    def _maybe_sync(self) -> str:
        """DiLoCo outer sync on its schedule (see :class:`swarm.sync.runner.SyncRunner`); skipped when leaving.

        By default a due sync starts beside training and this returns at once; a
        finished one is applied here, at the round boundary. Returns a few words
        for the progress line ("" if no sync ended).
        """
        self._outer_moved = False
        self._sync_outcome = ""
        if self.sync is None or self.stop_event.is_set():
            return ""
        self.in_sync = True
        try:
            report = self.sync.maybe_sync(self.round)
        finally:
            self.in_sync = False
        if report is None:
            return ""
        self._write_sync(report)
        self._sync_outcome = report.outcome.value
        if self.watch is not None:
            partner = report.outcome is not SyncOutcome.NO_PARTNER
            self._alert(self.watch.synced(partner, self.clock.monotonic()))
            self._alert(self.watch.yielded(report.outcome is SyncOutcome.YIELDED, self.clock.monotonic()))
        state = report.outcome.value if report.cause is None else f"{report.outcome.value}: {report.cause.value}"
        logger.info(
            "outer sync %s: revision %d, group of %d (%.2fs)", state, report.revision, report.group_size, report.sync_s
        )
        self._outer_moved = report.committed or report.caught_up
        return f" | sync rev {report.revision} {state}"

    def _write_sync(self, report: SyncReport) -> None:
        if self.metrics is None:
            return
        fields = report.to_metrics()
        fields.pop("event", None)
        self.metrics.write("sync", **fields)

    def _generate_local(self, items: list[TaskItem]) -> list[TrainGroup]:
        sampled = self.policy.sample(
            [it.prompt for it in items],
            self.cfg.num_generations,
            self.parts.generation,
            seed=self.cfg.seed * 1_000_003 + self.round,
            claims=self.cfg.share_logprobs and self.cfg.share and self.network is not None,
        )
        groups = [
            local_group(self.families[item.ref.family], item, [c.text for c in row], self.peer_id)
            for item, row in zip(items, sampled, strict=True)
        ]
        if not (self.cfg.share_logprobs and self.cfg.share and self.network is not None):
            return groups
        # the behaviour probability peers need for off-policy weights: the sampler's where it knows it
        # (node.training.sampler), one no-grad scoring pass for the rest
        claims = [c.logprob for row in sampled for c in row]
        missing = [k for k, x in enumerate(claims) if x is None]
        texts = [c.text for row in sampled for c in row]
        prompts = [g.prompt for g in groups for _ in g.completions]
        scored = self.policy.sequence_logprobs(
            [prompts[k] for k in missing], [texts[k] for k in missing], batch_rows=self.parts.grpo.micro_batch_size
        ) if missing else []  # fmt: skip
        for k, x in zip(missing, scored, strict=True):
            claims[k] = x
        n = self.cfg.num_generations
        return [
            dataclasses.replace(g, behaviour_logprobs=tuple(min(0.0, x or 0.0) for x in claims[k * n : (k + 1) * n]))
            for k, g in enumerate(groups)
        ]

    def _request_collect(self) -> None:
        """Ask the network worker for peers' batches; the collect runs while this round generates."""
        if self.network is None or self.cfg.isolated or self.cfg.collect_limit == 0:
            return
        since = self.clock() - self.parts.exchange.descriptor_ttl_s
        self.network.request_collect(CollectJob(since=since, limit=self.cfg.collect_limit))

    def _share_and_collect(self, local: list[TrainGroup], wait_s: float) -> Collected:
        """Hand this round's batch to the publisher; ingest the newest finished collect.

        Waits for the collect under way at most ``wait_s``: ``network_wait_s``, and never longer than
        this round's own generation took, so the network can at most double a round's own work, and
        not at all for a collect that recent ones say cannot land in that time (see :mod:`node.core.network`).
        """
        if self.network is None:
            return Collected()
        assert self.exchange is not None
        self.exchange.round = self.round
        if self.cfg.share:
            self.network.publish(self._batch(local))
        result = self.network.take(wait_s)
        if result is None:
            return Collected()
        if self.watch is not None:  # a batch fetched from its publisher: that peer is alive and in this swarm
            now = self.clock.monotonic()
            for desc, batch in result.accepted:
                self.watch.hear(desc.publisher, batch.groups[0].model_id if batch.groups else "", now)
        collected = ingest(result, self.pool, self.peers_seen, self.acceptance, self.parts.ingest, self.clock.monotonic)
        collected.collect_s = result.elapsed_s
        collected.descriptors_seen = result.seen
        if result.accepted:  # how stale peers' batches are when this node can train on them
            collected.external_age_s = statistics.median(self.clock() - d.created for d, _ in result.accepted)
        for peer, tally in collected.tallies.items():  # what re-verification found feeds the peer's reputation
            self.exchange.judge(peer, accepted=tally.accepted, informative=tally.informative, refused=tally.refused)
        return collected

    def _batch(self, local: list[TrainGroup]) -> RolloutBatch:
        groups = tuple(
            RolloutGroup(g.task_ref, g.prompt, g.completions, g.rewards, self.policy.model_id, g.behaviour_logprobs)
            for g in local
        )
        return RolloutBatch(self.peer_id, self.round, self.clock(), groups)

    def _acceptance(self) -> Acceptance:
        """What this node takes from peers: its own families and configs, budget and context."""
        ingest_cfg = self.parts.ingest
        budget = (ingest_cfg.accept_tokens or self.parts.generation.max_new_tokens) + ingest_cfg.completion_slack_tokens
        learned = {n: build_task(n) for n in self.cfg.accept_tasks if n not in self.families}
        return Acceptance(
            families={**learned, **self.families},
            max_completion_tokens=budget,
            max_token_chars=max_token_chars(self.policy.tokenizer),
            context_tokens=self.policy.max_length,
            completion_tokens=self.policy.count_completion_tokens,
            prompt_tokens=self.policy.count_prompt_tokens,
            max_completions=self.cfg.num_generations,
        )
