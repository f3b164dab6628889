"""Ingest: per-publisher and per-round bounds, fair turns, per-publisher tallies for the reputation.

A fake clock moves a fixed step on every read, so the deadline is reached after
a known number of groups; dataset builds are counted at reasoning-gym itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pytest
import reasoning_gym

from node.core.ingest import IngestConfig, RoundBudget, SeenPeers, ingest, interleave
from node.core.pool import ExternalPool
from node.core.record import Collected, PublisherTally
from node.tasks import reasoning_gym as rg
from node.tasks.acceptance import Acceptance
from node.tasks.base import TaskFamily
from node.tasks.heldout import training_item
from node.tasks.reasons import RejectReason
from node.tasks.registry import build_task, rollout_group
from node.tasks.verify import TrainGroup
from protocol import Descriptor, RolloutBatch, RolloutGroup
from swarm.exchange import BatchRejection, CollectResult, Refusal
from tests.fakes import FakeClock

MAX = build_task("max")
CHAIN = build_task("rg:chain_sum")
A, B, C = "peer-aaaaaa", "peer-bbbbbb", "peer-cccccc"


def acceptance(*families: TaskFamily) -> Acceptance:
    return Acceptance(
        families={f.name: f for f in families or (MAX,)},
        max_completion_tokens=32,
        max_token_chars=1,
        context_tokens=None,
        completion_tokens=len,
        prompt_tokens=len,
    )


def group(index: int, family: TaskFamily = MAX, seed: int = 1, flat: bool = False) -> RolloutGroup:
    item = training_item(family, seed, index)
    right = item.answer if family is MAX else f"<answer>{item.answer}</answer>"
    comps = ["x", "y"] if flat else [right, "x"]
    return rollout_group(item, comps, [family.score(item, c) for c in comps], "tiny-s")


def batch(peer: str, groups: Sequence[RolloutGroup]) -> tuple[Descriptor, RolloutBatch]:
    return Descriptor(peer, 1, "ab" * 32, 1000, ("max",), 1.0, 2.0), RolloutBatch(peer, 1, 1.0, tuple(groups))


def run(
    *batches: tuple[Descriptor, RolloutBatch],
    accept: Acceptance | None = None,
    cfg: IngestConfig | None = None,
    step: float = 0.0,
    result: CollectResult | None = None,
) -> tuple[Collected, ExternalPool[TrainGroup], set[str]]:
    pool: ExternalPool[TrainGroup] = ExternalPool(256)
    seen: set[str] = set()
    res = result or CollectResult(list(batches), [], len(batches), 0.0)
    out = ingest(res, pool, seen, accept or acceptance(), cfg or IngestConfig(), FakeClock(now=100.0, step=step))
    return out, pool, seen


def test_groups_are_taken_one_publisher_at_a_time_in_turn() -> None:
    a1, a2, b1 = batch(A, [group(1), group(2), group(3)]), batch(A, [group(4)]), batch(B, [group(5)])
    order = [(peer, g.task.index) for peer, g in interleave([a1, b1, a2])]
    assert order == [(A, 1), (B, 5), (A, 2), (A, 3), (A, 4)]
    assert interleave([]) == []


def test_a_publisher_beyond_its_quota_is_refused_and_others_are_not() -> None:
    cfg = IngestConfig(max_groups_per_publisher=5)
    out, pool, seen = run(batch(A, [group(i) for i in range(20)]), batch(B, [group(100), group(101)]), cfg=cfg)
    assert out.reasons == {RejectReason.PUBLISHER_QUOTA.value: 15}
    assert out.accepted == 7 and len(pool) == 7 and seen == {A, B}
    assert out.tallies == {A: PublisherTally(5, 5, 0), B: PublisherTally(2, 2, 0)}
    assert out.refused_from == {"aaaaaa": 15}  # what the dashboard's peers table shows, by short id


def test_task_builds_are_bounded_per_round_and_per_publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 publishers x 4 groups, each of a seed this node has never built: 12 builds without the budget
    sent = {p: [group(0, CHAIN, seed=1000 + 10 * k + i) for i in range(4)] for k, p in enumerate((A, B, C))}
    built: list[int] = []
    real = reasoning_gym.create_dataset

    def counting(name: str, **kw: object) -> object:
        built.append(1)
        return real(name, **kw)

    monkeypatch.setattr(rg, "_DATASETS", rg.DatasetCache(64))  # the receiver has built none of them
    monkeypatch.setattr(reasoning_gym, "create_dataset", counting)
    cfg = IngestConfig(max_task_builds=5, max_task_builds_per_publisher=2)

    out, _, _ = run(*(batch(p, gs) for p, gs in sent.items()), accept=acceptance(CHAIN), cfg=cfg)

    assert len(built) == out.task_builds == 5
    assert out.reasons == {RejectReason.BUILD_BUDGET.value: 7}
    assert [out.tallies[p].accepted for p in (A, B, C)] == [2, 2, 1]  # turns: A B C A B (C's 2nd is past 5)
    assert all(t.refused == 0 for t in out.tallies.values())  # a spent budget is not the peer's fault


def test_the_deadline_refuses_every_group_after_it() -> None:
    cfg = IngestConfig(max_ingest_s=1.0)
    # the clock is read at the start and once per group, 0.3 s apart: groups 1-3 are checked at
    # 0.3, 0.6 and 0.9 s, the 4th at 1.2 s is past the deadline
    out, pool, _ = run(
        batch(A, [group(i) for i in range(5)]), batch(B, [group(10 + i) for i in range(5)]), cfg=cfg, step=0.3
    )
    assert out.accepted == len(pool) == 3
    assert out.reasons == {RejectReason.INGEST_DEADLINE.value: 7}
    assert out.ingest_s == pytest.approx(0.3 * 11)


def test_tallies_count_accepted_informative_and_only_faults_as_refused() -> None:
    tampered = dataclasses.replace(group(3), prompt="max 0000=")
    foreign = group(4, build_task("max", {"digits": 6}))
    rejected = [(C, Refusal(BatchRejection.DIGEST_MISMATCH, "payload digest differs"))]
    result = CollectResult(
        [batch(A, [group(1), group(2, flat=True), tampered, foreign]), batch(B, [group(5)])], rejected, 3, 0.0,
        failed=[("peer-dddddd", "fetch timeout")],
    )  # fmt: skip

    out, pool, seen = run(result=result)

    assert out.tallies == {A: PublisherTally(accepted=2, informative=1, refused=1), B: PublisherTally(1, 1, 0)}
    assert out.reasons == {
        RejectReason.PROMPT_MISMATCH.value: 1,
        RejectReason.CONFIG_NOT_ACCEPTED.value: 1,
        BatchRejection.DIGEST_MISMATCH.value: 1,
    }
    assert (out.accepted, len(pool), out.fetch_failed) == (3, 3, 1)
    assert out.from_peers == {"aaaaaa": 1, "bbbbbb": 1} and seen == {A, B, C, "peer-dddddd"}


def test_a_flood_of_refusals_logs_one_line_per_publisher(caplog: pytest.LogCaptureFixture) -> None:
    foreign = [group(i, build_task("max", {"digits": 6})) for i in range(64)]
    with caplog.at_level(logging.INFO, logger="node.core.ingest"):
        out, _, _ = run(batch(A, foreign), cfg=IngestConfig(max_groups_per_publisher=64))
    assert out.reasons == {RejectReason.CONFIG_NOT_ACCEPTED.value: 64}
    lines = [r.getMessage() for r in caplog.records if r.name == "node.core.ingest"]
    assert lines == ["refused 64 group(s) from aaaaaa: {'task config not trained here': 64}"]


def test_round_budget_decisions() -> None:
    budget = RoundBudget(
        IngestConfig(max_groups_per_publisher=2, max_task_builds=2, max_task_builds_per_publisher=1), 10.0
    )
    assert budget.refusal(A, 9.9) is None and budget.may_build(A)
    budget.spend(A, built=True)
    assert not budget.may_build(A) and budget.may_build(B)
    budget.spend(A, built=False)
    assert budget.refusal(A, 0.0) is RejectReason.PUBLISHER_QUOTA and budget.refusal(B, 0.0) is None
    budget.spend(B, built=True)
    assert not budget.may_build(C)  # the round's 2 builds are spent
    assert budget.refusal(C, 10.0) is RejectReason.INGEST_DEADLINE


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("max_groups_per_publisher", -1, "use 0"),
        ("max_task_builds", -1, "use 0"),
        ("max_ingest_s", 0.0, r"\(0, 600\]"),
        ("completion_slack_tokens", 65, "0-64"),
    ],
)
def test_a_bad_ingest_config_names_the_fix(field: str, value: Any, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        IngestConfig(**{field: value})


def test_seen_peers_forget_the_least_recent_past_capacity() -> None:
    seen = SeenPeers(capacity=3)
    for peer in ("a", "b", "c", "a", "d", "e"):  # "a" seen again before "d" and "e" arrive
        seen.add(peer)
    assert len(seen) == 3 and set(seen) == {"a", "d", "e"} and "b" not in seen
    flood = SeenPeers()
    for i in range(100_000):
        flood.add(f"key-{i}")
    assert len(flood) == flood.capacity == 4096
