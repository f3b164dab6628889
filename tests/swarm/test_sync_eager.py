"""The outer sync beside training (issue 16), over real hivemind processes on 127.0.0.1.

Workers are tests/sync_worker.py with ``--eager`` (:class:`swarm.sync.runner.SyncRunner`:
the sync runs on a thread while the worker keeps stepping) and, for uneven
speeds, ``--period`` (every peer starts a sync at each multiple of the period).
"""

from __future__ import annotations

import time

import pytest
import torch

from swarm.sync.robust import clamp_weights
from tests.faults import FaultSwarm, Peer, Record, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]


def _one_hash_per_revision(peers: list[Peer]) -> None:
    for revision, hashes in hashes_by_revision(peers).items():
        assert len(hashes) == 1, f"revision {revision} has {len(hashes)} different states"


def test_eager_sync_trains_on_while_the_group_commits(fault_swarm: FaultSwarm) -> None:
    """3 eager workers, a sync every 10 steps of 0.25 s: training waits a small fraction of what syncing took."""
    args = ("--eager", "--steps", "40", "--sync-every", "10", "--step-sleep", "0.25")
    peers = fault_swarm.start_many({n: (*args, "--update-seed", str(i + 1)) for i, n in enumerate("abc")})
    fault_swarm.go()
    finals = [final_state(p, 60.0) for p in peers]
    _one_hash_per_revision(peers)
    syncs = [r for p in peers for r in p.syncs()]
    committed = [r for r in syncs if r["committed"]]
    print(
        "eager:",
        [
            (p.name, [(r["started_step"], r["step"], r["group_size"], round(r["sync_s"], 2)) for r in p.syncs()])
            for p in peers
        ],
    )
    for p, done in zip(peers, finals, strict=True):
        sync_s = sum(r["sync_s"] for r in p.syncs())
        steps, train_s = done["steps"], done["train_s"]
        print(f"{p.name}: waited {done['waited_s']:.3f} s of {sync_s:.2f} s syncing; {steps} steps in {train_s:.2f} s")
    assert len(committed) >= 6 and all(r["group_size"] == 3 for r in committed), syncs
    assert all(r["step"] >= r["started_step"] for r in syncs)
    assert any(r["step"] > r["started_step"] for r in syncs), "no step was trained while a sync ran"
    for p, done in zip(peers, finals, strict=True):
        assert done["waited_s"] < 0.25 * sum(r["sync_s"] for r in p.syncs()), (p.name, done)


PERIOD = 2.0
"""Seconds per wall-time epoch: above one sync here (~1.2 s: a 1 s gather window, all-reduce, vote)."""
STAGGER_EPOCHS = 5
"""Epochs the peers already running train through before the next one joins (5 x 2 s: the issue's 10 s)."""
SYNCS_OF_C = 22
"""The slow peer's syncs before training halts: ~20 epochs after its join are counted (~70 s in all)."""
MIN_FULL_SHARE = 0.9
"""Share of epochs after the slow peer joins that commit with all 3 (issue 16)."""


def _epoch(r: Record) -> int:
    return int(r["started_time"] // PERIOD)


def _epochs_with_everyone(peers: list[Peer], joined: int, halted: float) -> tuple[int, int]:
    """(epochs after ``joined`` that committed with all of ``peers``, epochs after it all of them synced in).

    Epochs from the one training was halted in are left out: leaving ends a sync still gathering.
    """
    last = min(int(halted // PERIOD) - 1, *(max(_epoch(r) for r in p.syncs()) for p in peers))
    full = 0
    for epoch in range(joined + 1, last + 1):
        mine = [[r for r in p.syncs() if _epoch(r) == epoch] for p in peers]
        full += all(any(r["committed"] and r["group_size"] == len(peers) for r in rs) for rs in mine)
    return full, last - joined


def _missed_epochs(peers: list[Peer], joined: int, halted: float) -> list[str]:
    """One line per epoch after ``joined`` that did not commit with everyone: each peer's syncs started in it.

    A sync is shown as (offset of its start into the epoch s, committed, group size, cause, duration s); a
    peer with none skipped the epoch (its last sync still ran: ``skipped_busy``).
    """
    last = int(halted // PERIOD) - 1
    lines = []
    for epoch in range(joined + 1, last + 1):
        mine = {p.name: [r for r in p.syncs() if _epoch(r) == epoch] for p in peers}
        if all(any(r["committed"] and r["group_size"] == len(peers) for r in rs) for rs in mine.values()):
            continue
        shown = {
            name: [
                (
                    round(r["started_time"] - epoch * PERIOD, 2),
                    r["committed"],
                    r["group_size"],
                    r["cause"],
                    round(r["sync_s"], 2),
                )
                for r in rs
            ]
            for name, rs in mine.items()
        }
        lines.append(f"epoch {epoch - joined}: {shown}")
    return lines


def _vec(r: Record, key: str) -> torch.Tensor:
    return torch.tensor(r[key], dtype=torch.float64)


def _averages_match_members(peers: list[Peer]) -> list[float]:
    """Per committed revision: ||applied average - step-weighted mean of the members' own pseudo-gradients|| / ||mean||.

    A member that sent weight 0 (or whose part was dropped) makes this ~1/n or more. ``applied`` is
    read from a member that did not catch up in that round (its momentum before is its own). Rounds in
    which a reducer clipped a part are left out: with two members the bound is the reducer's own part
    (x 4), and a first commit after one peer trained alone for a while can pass it (seen under load:
    norm 2.82 > bound 2.81, deviation 2.5e-3), which is the defence, not a lost contribution.
    """
    by_revision: dict[int, list[Record]] = {}
    for p in peers:
        for r in p.syncs():
            if r["committed"]:
                by_revision.setdefault(r["revision"], []).append(r)
    out = []
    for revision, rs in sorted(by_revision.items()):
        assert len(rs) == rs[0]["group_size"], (revision, rs)  # every member is one of ours and dumped
        if any("clipped part" in r["suspect_peers"].values() for r in rs):
            continue
        parts = [r for r in rs if r["weight"]]  # weight 0: no part sent (nothing trained)
        weights = torch.tensor(clamp_weights([r["weight"] for r in parts], 4.0), dtype=torch.float64)
        mean = (torch.stack([_vec(r, "pseudo") for r in parts]) * weights[:, None]).sum(0) / weights.sum()
        witness = next(r for r in rs if not r["caught_up"])
        out.append(float((_vec(witness, "applied") - mean).norm() / mean.norm()))
    return out


def _progress_lost(p: Peer) -> float:
    """||own progress - (what went into committed averages + what is pending)|| / ||own progress||.

    Every inner update must be in exactly one committed contribution or still pending in the weights.
    """
    done = final_state(p, 5.0)
    contributed = sum((-_vec(r, "pseudo") for r in p.syncs() if r["committed"]), torch.zeros(len(done["pending"])))
    own = _vec(done, "own_total")
    return float((own - contributed.double() - _vec(done, "pending")).norm() / own.norm())


@pytest.mark.timeout(150)
def test_uneven_peers_on_a_shared_clock_commit_together_and_lose_no_work(fault_swarm: FaultSwarm) -> None:
    """a, then b about 10 s later, then c (2x slower) about 10 s after b: c catches up and contributes.

    The issue's 10-30 s between joins: each newcomer starts once the peers before it have run
    ``STAGGER_EPOCHS`` epochs of 2 s (a condition, not a sleep), so c joins about 20 s after a.
    """
    root = fault_swarm.root
    halt = root / "halt"
    common = ["--eager", "--period", str(PERIOD), "--dump", "--steps", "100000", "--halt-file", str(halt)]
    common += ["--timeouts", "1.0,4,2,4,6"]
    a, b, c = fault_swarm.start_many(
        {
            "a": (*common, "--update-seed", "1", "--step-sleep", "0.1"),
            "b": (*common, "--update-seed", "2", "--step-sleep", "0.1", "--go-file", str(root / "go-b")),
            "c": (*common, "--update-seed", "3", "--step-sleep", "0.2", "--go-file", str(root / "go-c")),
        }
    )
    peers = [a, b, c]
    fault_swarm.go()
    went = time.time()
    a.wait_for(lambda r: len(a.syncs()) >= STAGGER_EPOCHS, 30.0, "a's first epochs (alone)")
    go_b = time.time()
    (root / "go-b").touch()
    for p in (a, b):
        p.wait_for(lambda r: r.get("committed") is True, 20.0, "a commit of a and b")
    b.wait_for(lambda r: len(b.syncs()) >= STAGGER_EPOCHS, 30.0, "b's first epochs")
    go_c = time.time()
    (root / "go-c").touch()
    # ~20 epochs counted after c's join: a rate over 10 epochs moves 10 points per miss (c's first sync
    # can find no partner while it catches up)
    c.wait_for(lambda r: len(c.syncs()) >= SYNCS_OF_C, 80.0, f"{SYNCS_OF_C} syncs of c")
    halt.touch()
    halted = time.time()
    for p in peers:
        final_state(p, 20.0)
    _one_hash_per_revision(peers)
    joined = _epoch(c.syncs()[0])
    full, epochs = _epochs_with_everyone(peers, joined, halted)
    deviations = _averages_match_members(peers)
    lost = {p.name: _progress_lost(p) for p in peers}
    first = {
        k: v
        for k, v in c.syncs()[0].items()
        if k in ("caught_up", "committed", "group_size", "started_step", "step", "cause", "reason")
    }
    print(f"joins: b {go_b - went:.1f} s after a started, c {go_c - go_b:.1f} s after b")
    print(f"epochs after c joined: {full}/{epochs} committed with all 3; c's first sync: {first}")
    print(f"average vs members' mean: max {max(deviations):.2e}; progress lost {lost}")
    print("skipped busy", [final_state(p, 1.0)["skipped_busy"] for p in peers])
    print("epochs without everyone:", *_missed_epochs(peers, joined, halted), sep="\n  ")
    assert c.syncs()[0]["caught_up"], first  # c started behind: it downloaded the group's anchor
    # ... and its progress went into committed averages (that round's, or the next one's if that round
    # aborted): nonzero parts, and none of its progress lost (checked below)
    assert any(r["committed"] and _vec(r, "pseudo").norm() > 0 for r in c.syncs()), first
    # Issue 16: >= 90% of epochs with every member. Before peers at this state or the one just left were
    # expected (SyncRecords._nearby): 8/10 and 15/20 within the full suite (causes not recorded), 19/20 alone
    # and beside a CPU burner (c sealed out of its first epoch after its catch-up, or a group-view mismatch
    # there); since: 20/20 in two runs alone and two beside a burner.
    assert epochs >= SYNCS_OF_C - 4 and full >= MIN_FULL_SHARE * epochs, (full, epochs)
    assert len(deviations) >= 8 and max(deviations) < 1e-4, deviations
    assert max(lost.values()) < 1e-4, lost
