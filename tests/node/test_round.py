"""One node's round, in-process: a real Node (tiny model, real tasks, real GRPO) with a fake exchange.

No processes, no sockets: ``Node(..., links=factory)`` gets a :class:`FakeExchange`
that records what the node publishes and returns scripted
:class:`~swarm.exchange.CollectResult` values built from genuine peer groups.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
import torch

from node.core import checkpoint
from node.core.checkpoint import CheckpointConfig
from node.core.config import NodeConfig, NodeParts
from node.core.ingest import IngestConfig
from node.core.links import Links
from node.core.node import Node
from node.core.record import RoundRecord
from node.observe.logs import CONTEXT
from node.observe.metrics import read_events
from node.tasks import reasoning_gym as rg
from node.tasks.heldout import training_item
from node.tasks.registry import UnknownTask, build_task, rollout_group
from node.tasks.verify import RejectReason, TrainGroup, verify_external
from node.training.device import params_digest
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.offpolicy import OffPolicyConfig
from node.training.policy import Completion, GenerationConfig
from protocol import Descriptor, RolloutBatch, RolloutGroup, short_id
from swarm.exchange import BatchRejection, CollectResult, Refusal
from swarm.identity import Identity, IdentityError, load_or_create
from swarm.sync import OuterSyncConfig
from tests.fakes import FakeClock, FakeExchange, FakeSync

T0 = 1_700_000_000.0
TTL = 300.0  # ExchangeConfig().descriptor_ttl_s
MAX = build_task("max")


# ---- fakes ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Harness:
    """The fakes behind one node, and what its links factory was called with."""

    exchange: FakeExchange = dataclasses.field(default_factory=FakeExchange)
    sync: FakeSync | None = None
    fail: Exception | None = None  # raised by the factory: joining the swarm failed
    fail_links: Exception | None = None  # raised by links(): starting the exchange or sync failed
    left: int = 0
    built_for: list[str] = dataclasses.field(default_factory=list)
    linked: int = 0

    def leave(self) -> None:
        self.left += 1

    def multiaddrs(self) -> list[str]:
        return []

    def links(self, model: torch.nn.Module) -> Links:
        self.linked += 1
        if self.fail_links is not None:
            raise self.fail_links
        return Links(exchange=self.exchange, sync=self.sync, leave=self.leave)

    def factory(self, identity: Identity, parts: NodeParts, clock: Callable[[], float]) -> Harness:
        self.built_for.append(identity.peer_id)
        if self.fail is not None:
            raise self.fail
        return self


# ---- helpers -------------------------------------------------------------------------------

NodeMaker = Callable[..., Node]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_node(tmp_path: Path, clock: FakeClock) -> Iterator[NodeMaker]:
    """Build and start a node (tiny-s, task ``max``, small sizes); every node is shut down afterwards."""
    started: list[Node] = []
    threads, context = torch.get_num_threads(), (CONTEXT.peer, CONTEXT.round)

    def make(
        harness: Harness,
        parts: NodeParts | None = None,
        *,
        start: bool = True,
        **overrides: Any,
    ) -> Node:
        kw: dict[str, Any] = {
            "model": "tiny-s",
            "tasks": ("max",),
            "local_groups": 2,
            "num_generations": 4,
            "external_groups": 2,
            "log_dir": str(tmp_path / "runs"),
            "identity": str(tmp_path / "node.key"),
            "device": "cpu",
            "max_threads": 1,
            "overlap_network": False,  # scripted rounds: each round ingests its own collect (overlap: test_network)
            **overrides,
        }
        parts = parts or NodeParts()
        parts = dataclasses.replace(parts, generation=GenerationConfig(max_new_tokens=1))
        node = Node(NodeConfig(**kw), parts, clock=clock, links=harness.factory)
        started.append(node)
        return node.start() if start else node

    yield make
    for node in started:
        node.shutdown()
    torch.set_num_threads(threads)  # process-wide settings a node changes
    CONTEXT.peer, CONTEXT.round = context


def peer_ids(tmp_path: Path, n: int) -> list[str]:
    """``n`` genuine peer ids (fresh Ed25519 identities)."""
    return [load_or_create(tmp_path / "peers" / f"peer{i}.key").peer_id for i in range(n)]


def group(index: int, completions: Sequence[str], claimed: Sequence[float] | None = None) -> RolloutGroup:
    """A peer's group for item ``index`` of family ``max`` (seed 77); rewards claimed honestly unless given."""
    item = training_item(MAX, 77, index)
    comps = [item.answer if c == "ANSWER" else c for c in completions]
    rewards = [MAX.score(item, c) for c in comps] if claimed is None else list(claimed)
    return rollout_group(item, comps, rewards, "tiny-s")


def informative(index: int) -> RolloutGroup:
    """Two right and two wrong completions: rewards (1, 0, 1, 0)."""
    return group(index, ["ANSWER", "x", "ANSWER", "y"])


def zero_adv(index: int) -> RolloutGroup:
    """Four wrong completions: rewards all 0, no GRPO signal."""
    return group(index, ["x", "y", "z", "x"])


def accepted(peer: str, groups: Sequence[RolloutGroup], now: float = T0) -> tuple[Descriptor, RolloutBatch]:
    """A (descriptor, batch) pair as the exchange hands over a verified batch."""
    batch = RolloutBatch(peer, 1, now - 1.0, tuple(groups))
    desc = Descriptor(peer, 1, "ab" * 32, 1000, ("max",), now - 1.0, now - 1.0 + TTL)
    return desc, batch


def metric_events(node: Node, event: str) -> list[dict[str, Any]]:
    return list(read_events(node.run_dir / "metrics.jsonl", event))


def digest(node: Node) -> str:
    return params_digest(node.policy.model)


def all_equal(rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) <= 1e-9


# ---- 1. a plain round ----------------------------------------------------------------------


def test_plain_round_publishes_one_batch_and_writes_a_consistent_record(make_node: NodeMaker, clock: FakeClock) -> None:
    h = Harness()
    node = make_node(h)
    before = digest(node)
    clock.now = T0 + 5.0

    record = node.run_round()

    assert record is not None
    assert node.round == 1 and record.round == 1 and h.exchange.round == 1
    assert record.peer == node.peer_id and record.time == T0 + 5.0
    # exactly one batch, with local_groups genuine groups that any peer would accept as honest
    assert len(h.exchange.published) == 1
    batch = h.exchange.published[0]
    assert (batch.publisher, batch.round, batch.created) == (node.peer_id, 1, T0 + 5.0)
    assert len(batch.groups) == 2
    for g in batch.groups:
        assert len(g.completions) == len(g.rewards) == 4 and g.model_id == "tiny-s"
        verdict = verify_external(g, source_peer=node.peer_id)
        assert verdict.ok and verdict.reward_mismatches == 0
        # the behaviour log-probability of each completion travels with it, for peers' off-policy weights
        assert g.logprobs is not None and len(g.logprobs) == 4 and all(-1e6 <= x <= 0 for x in g.logprobs)
        assert verdict.group is not None and verdict.group.behaviour_logprobs == g.logprobs
        assert verdict.group.external and verdict.group.source_model == "tiny-s"
    local_rewards = [r for g in batch.groups for r in g.rewards]
    assert record.reward_mean == pytest.approx(sum(local_rewards) / len(local_rewards))
    # the collect window: descriptors younger than the TTL, at most collect_limit batches
    assert h.exchange.collect_calls == [(T0 + 5.0 - TTL, 8)]
    # the record: nothing external came, every local group is either trained or dropped
    n_flat = sum(all_equal(g.rewards) for g in batch.groups)
    assert (record.local_groups, record.external_groups) == (2, 0)
    assert (record.dropped_zero_adv, record.trained_groups) == (n_flat, 2 - n_flat)
    assert record.external_reward_mean is None
    assert (record.external_rejected, record.rejected_reasons, record.accepted_groups) == (0, {}, 0)
    assert (record.fetch_failed, record.reward_mismatches, record.batches_from) == (0, 0, {})
    assert (record.external_peers, record.pool, record.peers_seen) == ({}, 0, 0)
    assert (record.bytes_in, record.bytes_out) == (1234, 567)
    assert (record.banned_peers, record.task_builds, record.too_long_skipped) == (0, 0, 0)
    assert h.exchange.judged == [] and record.ingest_s >= 0
    assert (record.loss is None) == (record.trained_groups == 0)
    assert (digest(node) != before) == (record.trained_groups > 0)
    assert record.round_s >= record.generate_s + record.share_s + record.train_s  # the phases lie within it
    assert record.rss_mb is not None and record.rss_mb > 50 and record.cpu_s is not None and record.cpu_s > 0
    assert record.sample_tokens_per_s is not None and record.sample_tokens_per_s > 0
    assert (record.train_tokens_per_s is None) == (record.trained_groups == 0)
    # metrics.jsonl: one `round` event with exactly the record's fields
    (event,) = metric_events(node, "round")
    assert set(event) == {*RoundRecord.field_names(), "event"}
    assert list(event) == ["event", *RoundRecord.field_names()]
    assert event["round"] == 1 and event["trained_groups"] == record.trained_groups


# ---- 2. collect accounting -----------------------------------------------------------------


def test_collect_counts_every_rejection_mismatch_and_failure(
    make_node: NodeMaker, clock: FakeClock, tmp_path: Path
) -> None:
    h = Harness()
    # one peer may fill all 3 slots here, and the whole step (the ingest's counts are under test, not the share cap)
    parts = NodeParts(offpolicy=OffPolicyConfig(max_publisher_share=1.0))
    node = make_node(h, parts, external_groups=3, max_source_share=1.0)
    p1, p2, p3, p4 = peer_ids(tmp_path, 4)
    wrong_prompt = dataclasses.replace(informative(3), prompt="max 0000=")
    assert wrong_prompt.prompt != training_item(MAX, 77, 3).prompt
    lying = group(4, ["ANSWER", "x", "y", "z"], claimed=[1.0, 1.0, 1.0, 0.0])  # true (1, 0, 0, 0): 2 lies
    h.exchange.queued.append(
        CollectResult(
            accepted=[
                accepted(p1, [informative(1), informative(2), wrong_prompt, lying]),
                accepted(p2, [informative(5)]),
            ],
            rejected=[(p3, Refusal(BatchRejection.DIGEST_MISMATCH, "payload digest differs"))],
            seen=4,
            elapsed_s=0.1,
            failed=[(p4, "fetch timeout")],
        )
    )

    r1 = node.run_round()

    assert r1 is not None and r1.round == 1
    assert r1.rejected_reasons == {RejectReason.PROMPT_MISMATCH.value: 1, BatchRejection.DIGEST_MISMATCH.value: 1}
    assert r1.external_rejected == 2
    assert r1.accepted_groups == 4  # informative 1, 2, 5 and the lying group (kept, re-scored locally)
    assert r1.reward_mismatches == 2
    assert r1.fetch_failed == 1
    assert r1.batches_from == {short_id(p1): 1, short_id(p2): 1}
    assert r1.peers_seen == 4  # the refused and the unreachable peer were seen too
    assert r1.external_groups == 3 and r1.pool == 1  # 4 verified, 3 taken
    assert sum(r1.external_peers.values()) == 3 and set(r1.external_peers) <= {p1, p2}
    assert r1.dropped_zero_adv + r1.trained_groups == r1.local_groups + r1.external_groups == 5
    # rewards used are the local scores: the lying group counts (1, 0, 0, 0), never its claim
    assert any(r1.external_reward_mean == pytest.approx(v) for v in (5 / 12, 6 / 12))
    assert (r1.bytes_in, r1.bytes_out) == (1234, 567)
    # the reputation hears what re-verification found, per publisher: only the wrong prompt is a fault
    assert sorted(h.exchange.judged) == sorted([(p1, 3, 3, 1), (p2, 1, 1, 0)])

    # next round: nothing new arrives; the last pooled group is used, peers stay seen
    clock.now += 10
    r2 = node.run_round()
    assert r2 is not None and r2.round == 2
    assert (r2.external_groups, r2.pool, r2.accepted_groups) == (1, 0, 0)
    assert (r2.external_rejected, r2.rejected_reasons, r2.fetch_failed, r2.reward_mismatches) == (0, {}, 0, 0)
    assert r2.batches_from == {} and r2.peers_seen == 4
    assert r2.dropped_zero_adv + r2.trained_groups == 3
    assert [c[0] for c in h.exchange.collect_calls] == [T0 - TTL, T0 + 10 - TTL]


# ---- 3. isolated mode ----------------------------------------------------------------------


def test_isolated_node_never_collects(make_node: NodeMaker, tmp_path: Path) -> None:
    h = Harness()
    node = make_node(h, external_groups=0)
    (p1,) = peer_ids(tmp_path, 1)
    h.exchange.queued.append(CollectResult([accepted(p1, [informative(1)])], [], 1, 0.0))

    records = [node.run_round(), node.run_round()]

    assert h.exchange.collect_calls == [] and len(h.exchange.queued) == 1
    assert [b.round for b in h.exchange.published] == [1, 2]  # it still shares
    for i, r in enumerate(records, start=1):
        assert r is not None and r.round == i
        assert (r.external_groups, r.accepted_groups, r.pool, r.peers_seen) == (0, 0, 0, 0)
        assert r.external_peers == {} and r.external_reward_mean is None
        assert r.dropped_zero_adv + r.trained_groups == r.local_groups == 2


# ---- 4. zero-advantage groups --------------------------------------------------------------


def test_zero_advantage_groups_are_dropped(make_node: NodeMaker, tmp_path: Path) -> None:
    h = Harness()
    # GRPO's group baseline for peers' groups too (the receiver baseline gives an all-wrong one a signal)
    # (and no publisher cap: whether the local groups have signal, which bounds a peer's share, is chance)
    parts = NodeParts(offpolicy=OffPolicyConfig(baseline="group", max_publisher_share=1.0))
    node = make_node(h, parts, external_groups=3, max_source_share=1.0)  # one peer may fill all 3 slots here
    p1, p2 = peer_ids(tmp_path, 2)
    h.exchange.queued.append(
        CollectResult([accepted(p1, [zero_adv(1), informative(2)]), accepted(p2, [zero_adv(3)])], [], 2, 0.0)
    )
    before = digest(node)

    r = node.run_round()

    assert r is not None
    (batch,) = h.exchange.published  # the local groups, with their local rewards
    local_flat = sum(all_equal(g.rewards) for g in batch.groups)
    assert (r.accepted_groups, r.external_groups, r.pool) == (3, 3, 0)
    assert r.external_peers == {p1: 2, p2: 1}
    assert r.external_reward_mean == pytest.approx(2 / 12)
    assert r.dropped_zero_adv == local_flat + 2
    assert r.trained_groups == (2 - local_flat) + 1
    assert r.dropped_zero_adv + r.trained_groups == r.local_groups + r.external_groups == 5
    assert r.loss is not None  # the informative external group alone makes a step
    assert digest(node) != before


def test_only_zero_advantage_groups_train_nothing(
    make_node: NodeMaker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Local completions all wrong and external groups flat: no step, weights unchanged, loss null."""
    h = Harness()
    node = make_node(h, max_source_share=1.0)  # both of p1's groups in one step
    (p1,) = peer_ids(tmp_path, 1)
    monkeypatch.setattr(node.policy, "generate", lambda prompts, n, cfg, seed=None: [["#"] * n for _ in prompts])
    h.exchange.queued.append(CollectResult([accepted(p1, [zero_adv(1), zero_adv(2)])], [], 1, 0.0))
    before = digest(node)

    r = node.run_round()

    assert r is not None
    assert (r.dropped_zero_adv, r.trained_groups, r.loss, r.reward_mean) == (4, 0, None, 0.0)
    assert digest(node) == before
    (event,) = metric_events(node, "round")
    assert event["loss"] is None and event["trained_groups"] == 0


def test_one_peer_supplies_at_most_its_share_of_a_step_however_much_it_sends(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    """An amplifier sends groups of 64 identical right answers (the protocol allows 64, the node generates 4):
    each is cut to the node's G, its advantages to a mean |a| of 1, and it supplies at most
    max_source_share x I x G rows (and so that much advantage mass) to a step; an honest peer still gets in."""
    h = Harness()
    parts = NodeParts(offpolicy=OffPolicyConfig(max_publisher_share=1.0))  # the row quota alone is under test
    node = make_node(h, parts, external_groups=4, max_source_share=0.5)  # quota 0.5 x 2 x 4 = 4 rows
    amp, honest = peer_ids(tmp_path, 2)
    loud = [group(i, ["ANSWER"] * 64) for i in range(4)]
    h.exchange.queued.append(CollectResult([accepted(amp, loud), accepted(honest, [informative(9)])], [], 2, 0.0))
    node.run_round()  # the first round sets the receiver baseline from the node's own groups
    h.exchange.queued.append(
        CollectResult([accepted(amp, [group(i, ["ANSWER"] * 64) for i in range(4, 8)])], [], 1, 0.0)
    )

    records = [node.run_round() for _ in range(3)]

    first = metric_events(node, "round")[0]
    assert first["trimmed_completions"] == 4 * 60
    for r in records:
        assert r is not None
        assert r.source_rows.get(amp, 0) <= 4 and r.source_adv.get(amp, 0.0) <= 4.0 + 1e-6, r
    assert sum(r is not None and r.source_rows.get(amp, 0) > 0 for r in records) >= 2  # it did get its share
    assert first["external_peers"].get(honest) == 1


# ---- 4b. containment: hostile batches -----------------------------------------------------


def hostile_groups(family_name: str, n: int, first_seed: int) -> list[RolloutGroup]:
    """``n`` groups of ``family_name``, each of its own seed (an attacker's: made without the node's cache)."""
    family = build_task(family_name)
    groups = []
    for k in range(n):
        item = training_item(family, first_seed + k, 0)
        comps = [item.answer, "x"]  # short enough for a tiny node's budget: exact_match reads the last line
        groups.append(rollout_group(item, comps, [family.score(item, c) for c in comps], "tiny-s"))
    return groups


def long_groups() -> list[RolloutGroup]:
    """Groups of our own family, each with one right answer and three 1,000-character wrong ones (signal)."""
    groups = []
    for i in range(4):
        item = training_item(MAX, 4242, i)
        comps = [item.answer, "9" * 1000, "8" * 1000, "7" * 1000]
        groups.append(rollout_group(item, comps, [MAX.score(item, c) for c in comps], "tiny-s"))
    return groups


def test_hostile_batches_neither_crash_nor_stall_a_round(
    make_node: NodeMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11's measured attacks against a tiny-gpt2 node (256 positions; it crashed on main).

    One collect brings 1,000-character completions of the node's own family, 64
    groups of a family it does not train (distinct seeds), 64 distinct seeds of
    a reasoning-gym family it does train, and an honest batch.
    """
    long_p, foreign_p, seeds_p, honest_p = peer_ids(tmp_path, 4)
    foreign = hostile_groups("rg:basic_arithmetic", 64, first_seed=10_000)
    seeds = hostile_groups("rg:chain_sum", 64, first_seed=20_000)
    monkeypatch.setattr(rg, "_DATASETS", rg.DatasetCache(64))  # the node has built none of the attacker's seeds
    h = Harness()
    # counts decide here, not this machine's speed; the ingest's refusals are under test, not the share cap
    parts = NodeParts(ingest=IngestConfig(max_ingest_s=600.0), offpolicy=OffPolicyConfig(max_publisher_share=1.0))
    node = make_node(h, parts, model="tiny-gpt2", tasks=("max", "rg:chain_sum"), external_groups=256, pool_capacity=256)
    builds: list[str] = []
    real_create = reasoning_gym.create_dataset

    def counting(name: str, **kw: Any) -> Any:
        builds.append(name)
        return real_create(name, **kw)

    monkeypatch.setattr(reasoning_gym, "create_dataset", counting)
    batches = [(long_p, long_groups()), (foreign_p, foreign), (seeds_p, seeds), (honest_p, [informative(1)])]
    h.exchange.queued.append(CollectResult([accepted(p, gs) for p, gs in batches], [], 4, 0.0))

    r = node.run_round()

    assert r is not None and r.round == 1  # no IndexError past the position table
    quota = IngestConfig().max_groups_per_publisher  # 16 groups per publisher looked at, the rest refused unread
    per_peer_builds = IngestConfig().max_task_builds_per_publisher  # 2
    assert r.rejected_reasons == {
        RejectReason.COMPLETION_TOO_LONG.value: 4,
        RejectReason.FAMILY_NOT_ACCEPTED.value: quota,
        RejectReason.BUILD_BUDGET.value: quota - per_peer_builds,
        RejectReason.PUBLISHER_QUOTA.value: 2 * (64 - quota),
    }
    assert r.external_rejected == 4 + quota + (quota - per_peer_builds) + 2 * (64 - quota)
    assert len(builds) == r.task_builds == per_peer_builds  # not 64 + 64 dataset builds
    assert r.accepted_groups == per_peer_builds + 1 and r.external_groups == 3
    assert r.too_long_skipped == 0 and r.trained_groups >= 3
    assert sorted(h.exchange.judged) == sorted(
        [(long_p, 0, 0, 0), (foreign_p, 0, 0, 0), (seeds_p, per_peer_builds, per_peer_builds, 0), (honest_p, 1, 1, 0)]
    )
    (event,) = metric_events(node, "round")
    assert event["rejected_reasons"] == r.rejected_reasons and event["task_builds"] == per_peer_builds


def test_the_trainer_skips_a_group_past_the_context_whatever_let_it_through(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    """Defence in depth: a pooled group with a 1,000-token completion (e.g. a bug upstream) is skipped, counted."""
    h = Harness()
    h.exchange.banned = 3
    node = make_node(h, model="tiny-gpt2", external_groups=1)
    item = training_item(MAX, 5, 5)
    comps = (item.answer, "9" * 1000)
    node.pool.add([TrainGroup(item.prompt, comps, (1.0, 0.0), "peer", "max", item.ref)])

    r = node.run_round()

    assert r is not None and r.external_groups == 1 and r.too_long_skipped == 1
    assert r.dropped_zero_adv + r.trained_groups + r.too_long_skipped == r.local_groups + 1
    assert r.banned_peers == 3


def test_rounds_go_on_while_the_network_is_held_and_ingest_its_result_later(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    """With the network beside the rounds, a collect that takes seconds (a flooded DHT) costs a round its bound."""
    h = Harness()
    node = make_node(h, overlap_network=True, network_wait_s=0.05)
    (p1,) = peer_ids(tmp_path, 1)
    release, inside = threading.Event(), threading.Event()

    def held() -> None:
        inside.set()
        release.wait(HELD_COLLECT_S)

    h.exchange.on_collect = held
    h.exchange.queued.append(CollectResult([accepted(p1, [informative(1)])], [], 1, 0.0))
    first = node.run_round()
    assert inside.wait(HELD_COLLECT_S)
    second = node.run_round()  # the collect is still held
    assert first is not None and second is not None
    # inline (--wait-network) each of these rounds would take HELD_COLLECT_S
    assert max(first.share_s, second.share_s) < HELD_COLLECT_S / 2
    assert (first.accepted_groups, second.accepted_groups) == (0, 0)
    release.set()
    assert node.network is not None and node.network.wait_idle(HELD_COLLECT_S)
    third = node.run_round()
    assert third is not None and third.accepted_groups == 1 and third.batches_from == {short_id(p1): 1}
    assert node.network.wait_idle(HELD_COLLECT_S) and [b.round for b in h.exchange.published] == [1, 2, 3]


HELD_COLLECT_S = 5.0


def test_a_paced_round_generates_for_the_minimum_and_ingests_a_slow_collect(
    make_node: NodeMaker, clock: FakeClock, tmp_path: Path
) -> None:
    """--min-generate: a tiny model stands in for a bigger one; its collect has the generation time to land."""
    h = Harness()
    node = make_node(h, overlap_network=True, network_wait_s=0.05, min_generate_s=1.0)
    (p1,) = peer_ids(tmp_path, 1)
    h.exchange.queued.append(CollectResult([accepted(p1, [informative(1)])], [], 1, 0.0))
    h.exchange.release_collect.clear()  # longer than network_wait_s: it lands only while the pacing wait passes

    def collect_lands() -> None:
        h.exchange.release_collect.set()
        assert node.network is not None and node.network.wait_idle(HELD_COLLECT_S)

    clock.on_wait = collect_lands

    record = node.run_round()

    assert clock.waits == [1.0]  # generation took no fake time: the wait is the whole minimum
    assert record is not None and record.generate_s == 1.0 and record.round_s >= record.generate_s
    assert record.accepted_groups == 1  # unpaced, this round would have gone on without it (test above)


def test_stop_during_the_pacing_wait_abandons_the_round_at_once(make_node: NodeMaker, clock: FakeClock) -> None:
    h = Harness()
    node = make_node(h, overlap_network=True, min_generate_s=600.0)
    clock.on_wait = node.stop_event.set  # leaving is asked for while the pacing wait passes
    t0 = clock.monotonic()

    assert node.run_round() is None

    assert clock.waits == [600.0] and clock.monotonic() == t0  # it ended at once, not after the 600 s of pacing
    assert node.round == 0 and h.exchange.published == []
    assert metric_events(node, "round") == []


# ---- 5. abort paths ------------------------------------------------------------------------


def test_stop_while_collecting_abandons_the_round(make_node: NodeMaker, tmp_path: Path) -> None:
    h = Harness()
    node = make_node(h)
    (p1,) = peer_ids(tmp_path, 1)
    h.exchange.queued.append(CollectResult([accepted(p1, [informative(1)])], [], 1, 0.0))
    h.exchange.on_collect = node.stop_event.set
    before = digest(node)

    assert node.run_round() is None

    assert node.round == 0 and CONTEXT.round == 0
    assert len(h.exchange.collect_calls) == 1
    assert len(h.exchange.published) == 1  # shared before collecting; that is fine
    assert digest(node) == before  # nothing trained
    assert metric_events(node, "round") == []
    assert len(node.pool) == 1  # verified meanwhile, kept for a later round


def test_stop_while_generating_abandons_the_round(make_node: NodeMaker, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness()
    node = make_node(h)
    real_sample = node.policy.sample
    calls: list[int] = []

    def sample_then_leave(
        prompts: list[str],
        n: int,
        cfg: GenerationConfig,
        seed: int | torch.Generator | None = None,
        claims: bool = False,
    ) -> list[list[Completion]]:
        calls.append(len(prompts))
        node.stop_event.set()  # the signal lands mid-generation: sampling stops at the next token
        return real_sample(prompts, n, cfg, seed, claims)

    monkeypatch.setattr(node.policy, "sample", sample_then_leave)
    before = digest(node)

    assert node.run_round() is None

    assert calls == [2]
    assert node.round == 0 and CONTEXT.round == 0
    assert h.exchange.published == [] and h.exchange.collect_calls == []
    assert digest(node) == before
    assert metric_events(node, "round") == []


def test_stop_after_collecting_completes_the_round_but_skips_sync(
    make_node: NodeMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving during a round, past the last abort point: the round counts, the outer sync is skipped."""
    h = Harness(sync=FakeSync())
    node = make_node(h)
    r1 = node.run_round()
    assert r1 is not None and h.sync is not None and h.sync.calls == [1]

    real_take = node.pool.take

    def take_then_leave(*args: Any) -> Any:
        node.stop_event.set()
        return real_take(*args)

    monkeypatch.setattr(node.pool, "take", take_then_leave)
    r2 = node.run_round()

    assert r2 is not None and r2.round == 2 and node.round == 2
    assert h.sync.calls == [1]  # no outer sync while leaving
    assert [e["round"] for e in metric_events(node, "round")] == [1, 2]


# ---- 6. checkpoint cadence and resume ------------------------------------------------------


def test_checkpoint_every_two_rounds_final_on_shutdown_and_resume(make_node: NodeMaker, clock: FakeClock) -> None:
    parts = NodeParts(checkpoint=CheckpointConfig(checkpoint_every=2))
    node = make_node(Harness(), parts)
    found: list[int | None] = []
    for _ in range(3):
        assert node.run_round() is not None
        latest = checkpoint.load_latest(node.run_dir)
        found.append(None if latest is None else int(latest[0]["round"]))
        clock.now += 1
    assert found == [None, 2, 2]
    weights, rng_state = digest(node), node.sampler_rng.getstate()
    steps = [int(s["step"]) for s in node.trainer.optimizer.state_dict()["state"].values()]
    run_dir, peer = node.run_dir, node.peer_id

    node.shutdown()

    latest = checkpoint.load_latest(run_dir)
    assert latest is not None and latest[0]["round"] == 3 and latest[0]["peer"] == peer
    assert checkpoint.decode((run_dir / checkpoint.PREVIOUS).read_bytes())["round"] == 2
    (summary,) = list(read_events(run_dir / "metrics.jsonl", "summary"))
    assert summary["rounds"] == 3 and summary["param_digest_end"] == weights

    resumed = make_node(Harness(), NodeParts(checkpoint=CheckpointConfig(checkpoint_every=2, resume=True)))
    assert resumed.peer_id == peer and resumed.run_dir == run_dir
    assert resumed.round == 3
    assert digest(resumed) == weights
    assert resumed.sampler_rng.getstate() == rng_state
    assert [int(s["step"]) for s in resumed.trainer.optimizer.state_dict()["state"].values()] == steps
    (event,) = metric_events(resumed, "resume")
    assert event["round"] == 3 and event["path"] == str(run_dir / checkpoint.CURRENT)

    r4 = resumed.run_round()
    assert r4 is not None and r4.round == 4 and resumed.round == 4
    assert [e["round"] for e in metric_events(resumed, "round")] == [1, 2, 3, 4]


def test_a_resumed_node_goes_on_with_its_learning_rate_schedule(make_node: NodeMaker, clock: FakeClock) -> None:
    """The rate is the schedule's at the node's round, which a checkpoint restores (the round records say it)."""
    grpo = GRPOConfig(learning_rate=1e-3, lr_scheduler_type="linear", lr_decay_rounds=4, min_lr_rate=0.5)
    node = make_node(Harness(), NodeParts(grpo=grpo, checkpoint=CheckpointConfig(checkpoint_every=1)))
    for _ in range(2):
        assert node.run_round() is not None
        clock.now += 1
    node.shutdown()
    resumed = make_node(Harness(), NodeParts(grpo=grpo, checkpoint=CheckpointConfig(checkpoint_every=1, resume=True)))
    for _ in range(4):
        assert resumed.run_round() is not None
        clock.now += 1
    lrs = [e["lr"] for e in metric_events(resumed, "round")]
    assert lrs == pytest.approx([1e-3, 8.75e-4, 7.5e-4, 6.25e-4, 5e-4, 5e-4])
    assert [g["lr"] for g in resumed.trainer.optimizer.param_groups] == pytest.approx([5e-4])


def test_a_resumed_node_scores_the_evaluation_a_stop_cut_from_its_last_round(
    make_node: NodeMaker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop during round 2's training skips its due evaluation; the checkpoint is of round 2. Resumed, the
    node scores round 2 first, so a sweep that resumes still has every node's score at every due round."""
    evaluation = EvalConfig(eval_every=2, eval_items=4, eval_samples=0)
    node = make_node(Harness(), NodeParts(evaluation=evaluation, checkpoint=CheckpointConfig(checkpoint_every=2)))
    assert node.run_round() is not None
    step = node.trainer.step

    def step_then_stop(*args: Any, **kwargs: Any) -> dict[str, Any]:
        stats = step(*args, **kwargs)
        node.stop_event.set()  # the signal lands while the round trains
        return stats

    monkeypatch.setattr(node.trainer, "step", step_then_stop)
    assert node.run_round() is not None
    assert metric_events(node, "eval") == []
    node.shutdown()

    parts = NodeParts(evaluation=evaluation, checkpoint=CheckpointConfig(checkpoint_every=2, resume=True))
    resumed = make_node(Harness(), parts, rounds=4)
    assert resumed.round == 2
    resumed.run()
    assert [e["round"] for e in metric_events(resumed, "eval")] == [2, 4]
    resumed.shutdown()
    again = make_node(Harness(), parts, rounds=4)  # round 4 was scored: nothing is owed
    again.run()
    assert [e["round"] for e in metric_events(again, "eval")] == [2, 4]


def test_resume_without_a_checkpoint_starts_fresh(make_node: NodeMaker) -> None:
    node = make_node(Harness(), NodeParts(checkpoint=CheckpointConfig(checkpoint_every=2, resume=True)))
    assert node.round == 0 and metric_events(node, "resume") == []
    r = node.run_round()
    assert r is not None and r.round == 1


# ---- 7. leaving: shutdown ------------------------------------------------------------------


def test_shutdown_closes_everything_once_and_writes_a_summary(make_node: NodeMaker) -> None:
    h = Harness(sync=FakeSync())
    node = make_node(h)
    start_digest = digest(node)
    assert node.run_round() is not None
    end_digest = digest(node)
    run_dir = node.run_dir

    node.shutdown()
    node.shutdown()

    assert h.exchange.closed == 1 and h.left == 1
    assert h.sync is not None and h.sync.closed == 1
    assert (node.exchange, node.links, node.sync, node.metrics) == (None, None, None, None)
    (summary,) = list(read_events(run_dir / "metrics.jsonl", "summary"))
    assert summary["rounds"] == 1 and summary["peer"] == node.peer_id
    assert (summary["param_digest_start"], summary["param_digest_end"]) == (start_digest, end_digest)
    latest = checkpoint.load_latest(run_dir)  # default cadence (50): the leave writes round 1
    assert latest is not None and latest[0]["round"] == 1


def test_shutdown_after_a_failed_join_does_not_raise(make_node: NodeMaker, tmp_path: Path) -> None:
    """The links factory raises (bootstrap failed) before the model is loaded: nothing to write, nothing to leave."""
    h = Harness(fail=RuntimeError("bootstrap failed: no peer reachable"))
    node = make_node(h, start=False)
    with pytest.raises(RuntimeError, match="bootstrap failed"):
        node.start()

    node.shutdown()
    node.shutdown()

    assert len(h.built_for) == 1 and h.linked == 0 and h.exchange.closed == 0 and h.left == 0
    assert not hasattr(node, "policy") and node.metrics is None and not (tmp_path / "runs").exists()


def test_shutdown_after_failed_links_leaves_the_swarm_once(make_node: NodeMaker) -> None:
    """The swarm is joined and the model and metrics exist when starting the exchange fails."""
    h = Harness(fail_links=RuntimeError("exchange handler not registered"))
    node = make_node(h, start=False)
    with pytest.raises(RuntimeError, match="exchange handler"):
        node.start()

    node.shutdown()
    node.shutdown()

    assert h.linked == 1 and h.exchange.closed == 0 and h.left == 1
    (summary,) = list(read_events(node.run_dir / "metrics.jsonl", "summary"))
    assert summary["rounds"] == 0 and summary["param_digest_start"] == summary["param_digest_end"] != ""
    assert checkpoint.load_latest(node.run_dir) is None  # round 0: nothing worth a checkpoint


@pytest.mark.parametrize(
    ("stage", "error", "match"),
    [("identity", IdentityError, "not an Ed25519 identity"), ("task", UnknownTask, "unknown task family")],
)
def test_shutdown_after_an_early_failed_start_does_not_raise(
    make_node: NodeMaker, tmp_path: Path, stage: str, error: type[Exception], match: str
) -> None:
    """start() fails before the weights' digest, metrics or links exist (``_digest_start`` is never read)."""
    h = Harness()
    if stage == "identity":
        (tmp_path / "node.key").write_bytes(b"not a key")
        node = make_node(h, start=False)
    else:
        node = make_node(h, start=False, tasks=("no-such-task",))
    with pytest.raises(error, match=match):
        node.start()

    node.shutdown()
    node.shutdown()

    assert h.built_for == [] and h.exchange.closed == 0 and h.left == 0
    assert node.metrics is None and not (tmp_path / "runs").exists()


def test_shutdown_of_a_node_never_started_does_not_raise(make_node: NodeMaker) -> None:
    h = Harness()
    node = make_node(h, start=False)
    node.shutdown()
    assert h.built_for == [] and h.exchange.closed == 0 and h.left == 0


def test_a_leave_request_reaches_the_outer_sync_at_once(make_node: NodeMaker) -> None:
    """The sync hears of the leave when it is asked for, not at the next round boundary: the signal that
    asked stops this process's p2pd too, and a sync that went on to vote could commit alone."""
    h = Harness(sync=FakeSync())
    node = make_node(h)
    assert h.sync is not None and not h.sync.cancelled
    node.stop_event.set()  # what the signal watcher does; no round runs after it here
    assert h.sync.cancel_called.wait(HELD_COLLECT_S)


def test_with_the_outer_sync_on_every_seed_starts_from_one_revision_0_state(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    """Peers that start apart must not start apart histories: their revision-0 weights are one state."""

    def first_weights(seed: int, parts: NodeParts) -> str:
        harness = Harness(sync=FakeSync() if parts.sync is not None else None)
        node = make_node(harness, parts, seed=seed, identity=str(tmp_path / f"{seed}-{parts.sync is None}.key"))
        return params_digest(node.policy.model)

    synced = NodeParts(sync=OuterSyncConfig(sync_every=4))
    assert first_weights(1, synced) == first_weights(2, synced)
    assert first_weights(1, NodeParts()) != first_weights(2, NodeParts())  # alone, --seed sets the init


def test_held_out_evaluations_come_before_training_every_k_rounds_and_after_the_last(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    """The eval events a run's tables are built from: round 0 (the start), each multiple of K, the last round."""
    parts = NodeParts(evaluation=EvalConfig(eval_every=2, eval_items=8, eval_samples=2))
    node = make_node(Harness(), parts, rounds=5)
    assert metric_events(node, "eval") == []  # a node is up before it scores its start: minutes for a real LM
    node.run()
    events = metric_events(node, "eval")
    assert [e["round"] for e in events] == [0, 2, 4, 5]
    for e in events:
        assert 0.0 <= e["accuracy"] <= 1.0 and e["items"] == 8 and e["complete"]
        assert set(e["per_family"]) == {"max"}
    rounds = metric_events(node, "round")
    assert all(r["round_s"] < 60 for r in rounds) and len(rounds) == 5


def test_a_warm_start_gives_every_seed_one_prior_and_a_better_start(make_node: NodeMaker, tmp_path: Path) -> None:
    """SAPO's regime: nodes of one model start from one pretrained state whatever their --seed."""

    def start(seed: int, steps: int) -> tuple[str, float]:
        parts = NodeParts(evaluation=EvalConfig(eval_every=10, eval_items=32, eval_samples=0))
        key = str(tmp_path / f"{seed}-{steps}.key")
        node = make_node(Harness(), parts, seed=seed, warm_start_steps=steps, identity=key, rounds=1)
        digest = params_digest(node.policy.model)
        node.run()  # round 0's evaluation is the warm start's
        return digest, metric_events(node, "eval")[0]["accuracy"]

    (a, acc_a), (b, _), (cold, acc_cold) = start(1, 60), start(2, 60), start(1, 0)
    assert a == b != cold
    assert acc_a > acc_cold


def test_a_slot_given_back_by_the_adaptive_share_is_one_more_own_group_and_a_round_without_peers_probes(
    make_node: NodeMaker, tmp_path: Path
) -> None:
    h = Harness()
    parts = NodeParts(offpolicy=OffPolicyConfig(baseline="group", adaptive_share=True))
    # a warm start gives the own groups signal whatever the sampler draws: the measure needs some
    node = make_node(h, parts, local_groups=2, external_groups=3, max_source_share=1.0, warm_start_steps=60)
    (p1,) = peer_ids(tmp_path, 1)
    h.exchange.queued.append(CollectResult([accepted(p1, [informative(i) for i in range(1, 7)])], [], 1, 0.0))
    node.share.taken = 1

    r = node.run_round()

    assert r is not None and (r.local_groups, r.external_groups, r.share_taken) == (4, 1, 1)  # I + J = 5 per round
    assert r.pool == 5
    node.share.taken = 0
    r = node.run_round()
    assert r is not None and (r.local_groups, r.external_groups, r.share_taken) == (5, 0, 0)
    assert r.pool == 3 and not r.source_rows  # two peers' groups scored for the measure, none trained on
    assert node.share.steps >= 1  # a step with no signal of its own measures nothing; the first had the peer's
