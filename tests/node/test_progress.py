"""The progress summary: a line at the first round, then one per interval summing the rounds between."""

from __future__ import annotations

from dataclasses import dataclass

from node.observe.progress import PROGRESS_EVERY_S, ProgressWindow


@dataclass(frozen=True)
class Numbers:
    round: int
    reward_mean: float = 0.5
    external_reward_mean: float | None = None
    local_groups: int = 4
    external_groups: int = 2
    external_rejected: int = 1
    dropped_zero_adv: int = 1
    trained_groups: int = 5
    pool: int = 7
    peers_seen: int = 3


def test_first_round_at_once_then_one_line_per_interval() -> None:
    window = ProgressWindow()
    lines = [window.add(Numbers(r + 1), now=r / 10) for r in range(301)]  # 10 rounds a second for 30 s
    shown = [line for line in lines if line is not None]
    assert shown[0] is not None and shown[0].startswith("round 1 |")
    assert len(shown) == 1 + int(30 / PROGRESS_EVERY_S), shown


def test_a_line_sums_its_interval() -> None:
    window = ProgressWindow(every_s=10.0)
    window.add(Numbers(1), now=0.0)
    for r in range(2, 11):
        ext = 0.25 if r % 2 else None
        assert window.add(Numbers(r, reward_mean=r / 10, external_reward_mean=ext), now=r - 1.0) is None
    line = window.add(Numbers(11, reward_mean=1.1, pool=9, peers_seen=2), now=10.0, sync="committed")
    assert line is not None
    assert line.startswith("rounds 2-11 in 10.0s |")
    assert "reward 0.650 (external 0.250)" in line  # mean of 0.2 .. 1.1
    assert "groups 40 local + 20 external, 10 rejected, 10 no signal, 50 trained" in line
    assert "pool 9 | peers 2" in line, "the last round's pool and peers"
    assert line.endswith("| syncs 1: 1 committed")


def test_a_round_longer_than_the_interval_gets_its_own_line() -> None:
    window = ProgressWindow(every_s=10.0)
    lines = [window.add(Numbers(r), now=30.0 * r) for r in range(1, 5)]
    assert all(line is not None for line in lines)
    assert lines[2] is not None and lines[2].startswith("round 3 in 30.0s")


def test_held_out_scores_ride_on_the_next_line_and_the_end_flushes_what_is_left() -> None:
    window = ProgressWindow(every_s=10.0)
    window.evaluated(0.125, 0)
    first = window.add(Numbers(1), now=0.0)
    assert first is not None and first.endswith("| held-out 0.125 at round 0")
    window.evaluated(0.25, 2, complete=False)
    window.evaluated(0.5, 3)
    assert window.add(Numbers(2), now=1.0) is None and window.add(Numbers(3), now=2.0) is None
    last = window.flush(Numbers(3), now=2.5)
    assert last is not None and last.startswith("rounds 2-3 in 2.5s") and last.endswith("held-out 0.500 at round 3")
    assert window.flush(Numbers(3), now=3.0) is None, "nothing left to say"
    window.evaluated(0.75, 3, complete=False)
    assert window.flush(None, now=4.0) == "held-out 0.750 at round 3 (partial)"
