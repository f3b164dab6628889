"""The sync schedule (steps or wall-time epochs), the outcome's weights, and the runner that syncs beside training."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from swarm.sync.allreduce import Snapshot
from swarm.sync.config import OuterSyncConfig, SyncOutcome, SyncReport
from swarm.sync.job import RoundOutcome, SyncJob, apply_outcome, weights_after
from swarm.sync.runner import SyncRunner
from swarm.sync.schedule import Schedule
from swarm.sync.tensors import flatten

HOLD_S = 10.0  # a held sync is released by the test; this bound only keeps a broken test from hanging


def snap(revision: int, anchor: list[float]) -> Snapshot:
    a = torch.tensor(anchor)
    return Snapshot(revision, f"h{revision}", a, torch.zeros_like(a))


def report(committed: bool, revision: int = 1) -> SyncReport:
    outcome = SyncOutcome.COMMITTED if committed else SyncOutcome.ABORTED
    return SyncReport(0.0, "me", revision, f"h{revision}", committed, 2, outcome, 0.1, 0)


# ---- schedule -------------------------------------------------------------------------------------


def test_peers_started_at_different_times_meet_on_the_same_epoch_boundaries() -> None:
    fast, slow = Schedule(1, 10.0, now=1003.0), Schedule(1, 10.0, now=1008.5)
    # the fast peer's rounds end every 0.5 s, the slow one's every 1.5 s: both first sync just past 1010
    fast_at = next(t / 2 for t in range(2007, 2100) if fast.due(0, t / 2))
    slow_at = next(1008.5 + 1.5 * k for k in range(1, 60) if slow.due(0, 1008.5 + 1.5 * k))
    assert 1010 <= fast_at < 1010.5 and 1010 <= slow_at < 1011.5


def test_an_epoch_is_synced_once_and_epochs_missed_while_busy_are_skipped() -> None:
    s = Schedule(1, 10.0, now=0.0)
    assert s.due(1, 10.2)
    s.begun(10.2)
    assert not s.due(2, 19.9)
    assert s.due(3, 45.0)  # a sync that ran 25 s: one sync at the next boundary, not three
    s.begun(45.0)
    assert not s.due(4, 49.0) and s.due(5, 50.0)


def test_schedule_by_steps_and_its_validation() -> None:
    s = Schedule(4, 0.0, now=123.0)
    assert [k for k in range(0, 13) if s.due(k, 0.0)] == [4, 8, 12]
    with pytest.raises(ValueError, match="every >= 1"):
        Schedule(0, 0.0, now=0.0)
    with pytest.raises(ValueError, match=r"sync_period_s=0.5; use 0 or a value >= 1$"):
        OuterSyncConfig(sync_period_s=0.5)


# ---- the weights after an outcome -----------------------------------------------------------------


def test_a_commit_with_nothing_trained_meanwhile_leaves_exactly_the_groups_anchor() -> None:
    weights = torch.tensor([0.3, 1.7])
    job = SyncJob.taken(snap(0, [1.0, 2.0]), weights.clone())
    new = snap(1, [0.123456789, 1.987654321])
    out = weights_after(RoundOutcome(report(True), job, new), weights.clone())
    assert torch.equal(out, new.anchor)


def test_a_commit_keeps_the_steps_trained_while_it_ran() -> None:
    job = SyncJob.taken(snap(0, [1.0, 2.0]), torch.tensor([0.5, 1.5]))
    new = snap(1, [0.75, 1.75])
    out = weights_after(RoundOutcome(report(True), job, new), torch.tensor([0.25, 1.5]))  # trained on: -0.25, 0
    assert torch.allclose(out, torch.tensor([0.5, 1.75]))


def test_a_catch_up_keeps_all_progress_since_the_old_anchor() -> None:
    # the old behaviour reset the weights to the downloaded anchor, discarding every inner step since the last sync
    job = SyncJob.taken(snap(3, [1.0, 1.0]), torch.tensor([0.5, 1.25]))
    downloaded = snap(9, [4.0, 4.0])
    out = weights_after(RoundOutcome(report(False, 9), job, downloaded), torch.tensor([0.5, 1.5]))
    assert torch.allclose(out, torch.tensor([3.5, 4.5]))


@pytest.mark.parametrize("committed", [True, False])
def test_an_outcome_goes_into_each_parameter_in_its_own_memory(committed: bool) -> None:
    """No full-size copy of the weights at the round's end; a half-precision parameter goes through a copy."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16))
    base = Snapshot(0, "h0", flatten(module) + 0.25, torch.zeros(23))
    job = SyncJob.taken(base, flatten(module))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.125)  # trained on while the round ran
    now, new = flatten(module), Snapshot(1, "h1", base.anchor - 0.5, torch.zeros(23))
    outcome = RoundOutcome(report(committed), job, new)
    pointers = [p.data_ptr() for p in module.parameters()]
    apply_outcome(outcome, module)
    assert [p.data_ptr() for p in module.parameters()] == pointers
    expected = weights_after(outcome, now.clone())
    assert torch.equal(flatten(module)[:15], expected[:15])  # float32: the same roundings
    assert torch.allclose(flatten(module)[15:], expected[15:], atol=1e-2)  # bfloat16: rounded once more
    kept = 0.125 if committed else 0.125 - 0.25  # a commit: trained since the job; a catch-up: since the anchor
    assert torch.allclose(flatten(module)[:15] - new.anchor[:15], torch.full((15,), kept))


# ---- the runner ------------------------------------------------------------------------------------


class HeldRounds:
    """An outer sync whose rounds block until the test releases them; records where apply ran."""

    def __init__(self, eager: bool = True, every: int = 2) -> None:
        self.cfg = OuterSyncConfig(sync_every=every, eager=eager)
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.revision = 0
        self.jobs: list[SyncJob] = []
        self.applied: list[tuple[int, int | None]] = []  # (revision, thread ident)
        self.fail = False
        self.cancelled = False

    def prepare(self, inner_step: int | None = None) -> SyncJob:
        return SyncJob.taken(snap(self.revision, [0.0]), torch.tensor([float(len(self.jobs))]))

    def run(self, job: SyncJob) -> RoundOutcome:
        self.jobs.append(job)
        self.started.release()
        self.release.wait(HOLD_S)
        if self.fail:
            raise RuntimeError("a bug")
        return RoundOutcome(report(True, job.base.revision + 1), job, snap(job.base.revision + 1, [1.0]))

    def cancel(self) -> None:
        self.cancelled = True

    def apply(self, outcome: RoundOutcome) -> None:
        assert outcome.installed is not None
        self.revision = outcome.installed.revision
        self.applied.append((self.revision, threading.get_ident()))

    def state_dict(self) -> dict[str, Any]:
        return {"revision": self.revision}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.revision = state["revision"]

    def close(self) -> None:
        pass


def test_a_due_sync_runs_beside_training_and_is_applied_at_a_later_boundary_on_the_training_thread() -> None:
    rounds = HeldRounds()
    runner = SyncRunner(rounds, clock=lambda: 0.0)
    assert runner.maybe_sync(1) is None and not runner.busy
    assert runner.maybe_sync(2) is None  # due: started, and the round goes on at once
    assert rounds.started.acquire(timeout=HOLD_S) and runner.busy
    assert runner.maybe_sync(3) is None and runner.maybe_sync(4) is None  # still running: step 4's sync skipped
    assert runner.skipped_busy == 1
    with pytest.raises(RuntimeError, match="while a sync runs"):
        runner.load_state_dict({"revision": 7})
    rounds.release.set()
    assert runner.finish(HOLD_S) is not None  # leaving: the ended sync is applied
    assert rounds.applied == [(1, threading.get_ident())] and not runner.busy


def test_an_ended_sync_is_reported_once_at_the_next_boundary() -> None:
    rounds = HeldRounds()
    rounds.release.set()
    runner = SyncRunner(rounds, clock=lambda: 0.0)
    runner.maybe_sync(2)
    assert rounds.started.acquire(timeout=HOLD_S)
    assert runner.ended(HOLD_S)
    got = runner.maybe_sync(3)  # the first boundary after the sync ended applies and reports it
    assert got is not None and got.committed and got.revision == 1
    assert runner.maybe_sync(3) is None and rounds.applied == [(1, threading.get_ident())]


def test_leaving_does_not_wait_past_its_bound_for_a_stuck_sync() -> None:
    rounds = HeldRounds()
    runner = SyncRunner(rounds, clock=lambda: 0.0)
    runner.maybe_sync(2)
    assert rounds.started.acquire(timeout=HOLD_S)
    assert runner.finish(0.05) is None and rounds.applied == []  # left without it: nothing half-applied
    assert rounds.cancelled  # a round not yet in a group was told to end
    rounds.release.set()


def test_a_sync_that_raises_is_logged_and_the_next_one_starts(caplog: pytest.LogCaptureFixture) -> None:
    rounds = HeldRounds()
    rounds.fail = True
    rounds.release.set()
    runner = SyncRunner(rounds, clock=lambda: 0.0)
    runner.maybe_sync(2)
    assert runner.finish(HOLD_S) is None and not runner.busy and rounds.applied == []
    assert "outer sync after step 2 failed" in caplog.text
    rounds.fail = False
    runner.maybe_sync(4)
    assert runner.finish(HOLD_S) is not None and rounds.applied[-1][0] == 1


def test_with_eager_off_the_sync_runs_in_the_round() -> None:
    rounds = HeldRounds(eager=False)
    rounds.release.set()
    runner = SyncRunner(rounds, clock=lambda: 0.0)
    got = runner.maybe_sync(2)
    assert got is not None and got.committed and rounds.applied == [(1, threading.get_ident())]
