"""The process harness itself (tests/procs.py), on plain shell processes: fast, no network."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.procs import Procs, pid_alive, wait_for

# a leader that starts a grandchild in its group (like a node's DHT child or p2pd) and reports its pid
FAMILY = 'sleep 300 & echo "child $!"; wait'


def _child_pid(proc_output: str) -> int:
    return int(proc_output.split("child ")[1].split()[0])


def test_reap_ends_a_stopped_group_and_its_grandchildren(procs: Procs) -> None:
    family = procs.start("family", ["sh", "-c", FAMILY])

    def reported() -> str | None:
        out = family.output()
        return out if "child " in out else None

    grandchild = _child_pid(wait_for(reported, 10, "the grandchild's pid", poll=0.02))
    family.stop()  # a frozen group can neither act on SIGTERM nor exit: reap must SIGCONT it first
    procs.reap(grace=0.5)
    assert not family.alive() and family.returncode is not None
    wait_for(lambda: not pid_alive(grandchild), 5, "the grandchild to be gone", poll=0.02)


def test_wait_for_fails_at_once_when_a_watched_process_exits(procs: Procs) -> None:
    quitter = procs.start("quitter", ["sh", "-c", "echo bye; exit 3"])
    with pytest.raises(AssertionError, match=r"quitter exited \(exit status 3\) before never:\n.*bye"):
        wait_for(lambda: False, 60, "never", poll=0.02, watch=[quitter])


def test_wait_for_returns_the_value_and_times_out_with_its_name() -> None:
    assert wait_for(lambda: [1], 1, "a list") == [1]
    with pytest.raises(AssertionError, match="timed out after 0s waiting for nothing"):
        wait_for(lambda: None, 0.1, "nothing", poll=0.02)


def test_wait_bounds_a_running_process_and_reports_its_log(procs: Procs) -> None:
    slow = procs.start("slow", ["sh", "-c", "echo working; sleep 300"])
    wait_for(lambda: "working" in slow.output(), 10, "the first line", poll=0.02)
    with pytest.raises(AssertionError, match="slow still running 0s later:\nworking"):
        slow.wait(0.2)
    slow.term()
    assert slow.wait(5) == -signal.SIGTERM


def test_adopted_groups_are_reaped(procs: Procs, tmp_path: Path) -> None:
    """A group started elsewhere (as the zygote fork server does) is signalled by its pid."""
    other = Procs(tmp_path / "other")
    try:
        started = other.start("elsewhere", ["sleep", "300"])
        adopted = procs.adopt("adopted", started.pid)
        procs.reap(grace=0.0)
        assert started.wait(5) == -signal.SIGKILL and not adopted.alive()
    finally:
        other.reap(grace=0.0)
