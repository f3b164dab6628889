"""The network worker: a round asks for a collect, hands over its batch, and waits for neither past a bound."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from node.core.network import CollectJob, NetworkWorker, wait_budget
from protocol import RolloutBatch
from swarm.exchange import CollectResult
from tests.fakes import HOLD_S, FakeExchange


def batch(round_: int) -> RolloutBatch:
    return RolloutBatch("peer", round_, 1000.0 + round_, ())


@pytest.fixture
def held() -> FakeExchange:
    ex = FakeExchange()
    ex.release_collect.clear()  # collects wait for the test
    return ex


@pytest.fixture
def worker(held: FakeExchange) -> Any:
    w = NetworkWorker(held, max_pending=2)
    yield w
    held.release_collect.set()
    held.release_publish.set()
    assert w.close(HOLD_S)


def inside_collect(ex: FakeExchange) -> None:
    assert ex.in_collect.acquire(timeout=HOLD_S), "the worker never started a collect"


def test_take_waits_at_most_its_bound_for_a_held_collect_and_a_later_take_gets_it(
    held: FakeExchange, worker: NetworkWorker
) -> None:
    held.queued.extend(CollectResult([], [], seen, 0.0) for seen in (1, 2))
    worker.request_collect(CollectJob(0.0, 8))
    inside_collect(held)
    t0 = time.monotonic()
    assert worker.take(0.05) is None  # the collect is held: the round goes on without it
    assert time.monotonic() - t0 < HOLD_S / 2
    worker.request_collect(CollectJob(1.0, 8))  # queued behind the first result
    held.release_collect.set()
    first = worker.take(HOLD_S)
    assert first is not None and first.seen == 1
    second = worker.take(HOLD_S)  # the queued request ran once the first result was taken
    assert second is not None and second.seen == 2
    assert [since for since, _ in held.collect_calls] == [0.0, 1.0]


def test_a_quick_collect_is_taken_by_the_round_that_asked(held: FakeExchange, worker: NetworkWorker) -> None:
    held.release_collect.set()
    held.queued.append(CollectResult([], [], 1, 0.0))
    worker.request_collect(CollectJob(0.0, 8))
    result = worker.take(HOLD_S)
    assert result is not None and result.seen == 1


def test_take_returns_at_once_when_no_collect_is_coming(worker: NetworkWorker) -> None:
    t0 = time.monotonic()
    assert worker.take(HOLD_S) is None
    assert time.monotonic() - t0 < HOLD_S / 2


def test_wait_budget_is_the_bound_unless_recent_collects_say_it_cannot_land() -> None:
    assert wait_budget(now=5.0, started=5.0, recent_s=[], wait_s=0.05) == 0.05  # no history: wait
    assert wait_budget(now=5.02, started=5.0, recent_s=[0.03, 0.04, 0.05], wait_s=0.05) == 0.05
    assert wait_budget(now=5.02, started=5.0, recent_s=[0.3, 0.4, 0.35], wait_s=0.05) == 0.0
    assert wait_budget(now=5.34, started=5.0, recent_s=[0.3, 0.4, 0.35], wait_s=0.05) == 0.05  # nearly done
    assert wait_budget(now=5.0, started=5.0, recent_s=[0.01, 0.01, 9.0], wait_s=0.05) == 0.05  # one outlier


@pytest.mark.parametrize("collect_s", [0.01, 1.0])
def test_a_round_waits_only_for_a_collect_that_can_land_within_its_bound(collect_s: float) -> None:
    ex = FakeExchange(collect_s)
    w = NetworkWorker(ex, clock=ex.clock)
    try:
        ex.release_collect.set()
        for since in range(3):  # a history of collects that each took collect_s
            w.request_collect(CollectJob(float(since), 8))
            assert w.take(HOLD_S) is not None
        ex.release_collect.clear()
        w.request_collect(CollectJob(3.0, 8))
        inside_collect(ex)
        threading.Timer(0.2, ex.release_collect.set).start()  # lands 0.2 s (real) into the round's wait
        t0 = time.monotonic()
        result = w.take(0.5)
        waited = time.monotonic() - t0
        if collect_s < 0.5:  # expected within the bound: the round waits and ingests it
            assert result is not None and waited >= 0.1
        else:  # collects take longer than the bound: waiting would be lost time, a later round takes it
            assert result is None and waited < 0.1
            assert w.take(HOLD_S) is not None
    finally:
        ex.release_collect.set()
        assert w.close(HOLD_S)


def test_a_held_publish_delays_neither_the_round_nor_the_collect(held: FakeExchange, worker: NetworkWorker) -> None:
    held.release_publish.clear()
    held.release_collect.set()
    worker.publish(batch(1))
    worker.request_collect(CollectJob(0.0, 8))
    result = worker.take(HOLD_S)
    assert result is not None and held.published == []  # collected while the publish is still held


def test_a_publisher_far_behind_publishes_the_freshest_batches_and_counts_the_dropped(
    held: FakeExchange, worker: NetworkWorker
) -> None:
    held.release_publish.clear()
    worker.publish(batch(1))
    assert held.in_publish.acquire(timeout=HOLD_S)  # batch 1 is held inside publish
    for r in range(2, 7):
        worker.publish(batch(r))
    held.release_publish.set()
    assert worker.wait_idle(HOLD_S)
    rounds = [b.round for b in held.published]
    assert rounds == [1, 5, 6] and worker.dropped_batches == 3  # of 2-6 the newest two waited


def test_failures_are_logged_and_the_worker_goes_on(
    held: FakeExchange, worker: NetworkWorker, caplog: pytest.LogCaptureFixture
) -> None:
    held.release_collect.set()
    held.fail_publish = held.fail_collect = True
    worker.publish(batch(1))
    worker.request_collect(CollectJob(0.0, 8))
    assert worker.wait_idle(HOLD_S)
    assert worker.take(HOLD_S) is None  # the collect raised: nothing to ingest, and no wait for it
    held.fail_publish = held.fail_collect = False
    worker.publish(batch(2))
    worker.request_collect(CollectJob(1.0, 8))
    assert worker.take(HOLD_S) is not None
    assert worker.wait_idle(HOLD_S) and [b.round for b in held.published] == [2]
    assert "publish of round 1 failed" in caplog.text and "collect failed" in caplog.text


def test_close_does_not_wait_past_its_timeout_for_a_stuck_step(held: FakeExchange) -> None:
    w = NetworkWorker(held)
    w.request_collect(CollectJob(0.0, 8))
    inside_collect(held)
    assert w.close(0.05) is False  # still inside collect: the node leaves anyway (daemon threads)
    held.release_collect.set()
    assert w.close(HOLD_S) is True


def test_inline_publishes_then_collects_in_the_caller(held: FakeExchange) -> None:
    held.release_collect.set()
    w = NetworkWorker(held, inline=True)
    w.request_collect(CollectJob(0.0, 8))
    assert held.collect_calls == []  # inline, the collect runs at take, after the publish
    w.publish(batch(1))
    result = w.take(0.0)
    assert result is not None and [b.round for b in held.published] == [1] and w.close(0.0)


def test_max_pending_must_be_positive(held: FakeExchange) -> None:
    with pytest.raises(ValueError, match="use 1 or more"):
        NetworkWorker(held, max_pending=0)
