"""Churn and start-up with real node processes: rejoining through the address book, giving up with one
sentence, one node per identity, and signals at every stage of start-up."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from swarm.addressbook import book_path
from swarm.identity import load_or_create
from tests.integration.nodes import Swarm, wait_for
from tests.procs import PYTHON, Proc, Procs

pytestmark = [pytest.mark.network]

SHORT = ("--local", "2", "--generations", "4", "--max-threads", "1")
SIGNAL_BOUND_S = 30.0
DEAD_PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"  # port 9: closed


def _book_peers(key: Path) -> set[str]:
    try:
        return {e["peer"] for e in json.loads(book_path(key).read_text())}
    except (FileNotFoundError, ValueError):
        return set()


def _node(procs: Procs, name: str, key: Path, *extra: str, command: str = "start") -> Proc:
    cmd = [PYTHON, "-m", "node", command, "--identity", str(key), "--log-dir", str(procs.root / "runs")]
    return procs.start(name, [*cmd, "--host-port", "127.0.0.1:0", *SHORT, *extra])


def _signal_masks(pid: int) -> str:
    """The child's blocked and ignored signal masks (/proc), as inherited from this process."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "gone"
    return " ".join(line.replace("\t", "") for line in lines if line.startswith(("SigBlk", "SigIgn")))


def _group_gone(pid: int) -> bool:
    """No process of the node's session is left (p2pd and the DHT child included)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_joiner_rejoins_through_its_address_book(swarm: Swarm) -> None:
    a = swarm.spawn("a", "--rounds", "0")
    b = swarm.spawn("b", "--rounds", "0")
    c = swarm.spawn("c", "--rounds", "0")
    key_c = swarm.tmp / "keys" / "c.key"
    wait_for(lambda: b.peer_id in _book_peers(key_c), 30, "c's address book to hold b", watch=[c.proc])
    a.kill()  # the bootstrap peer crashes: c's only --peer is gone
    c.kill()
    wait_for(lambda: not a.proc.alive() and not c.proc.alive(), 10, "a and c to die")
    (swarm.tmp / "c.ready").unlink()
    t0 = time.monotonic()
    again = swarm.spawn("c", "--rounds", "0", "--bootstrap-attempts", "3")  # --peer is a's dead address
    print(f"rejoined through the address book in {time.monotonic() - t0:.1f}s")
    assert again.ready["peer"] == c.peer_id


def test_unreachable_peer_gives_up_with_one_sentence(procs: Procs) -> None:
    key = procs.root / "j.key"
    j = _node(procs, "j", key, "--peer", DEAD_PEER, "--bootstrap-attempts", "2", command="join")
    assert j.wait(60) == 2, j.log_tail()
    out = j.output()
    errors = [line for line in out.splitlines() if line.startswith("swarm-node: error:")]
    assert len(errors) == 1 and "--peer" in errors[0], out
    assert "Traceback" not in out, out


def test_second_node_on_one_identity_is_refused(procs: Procs) -> None:
    key = procs.root / "shared.key"
    first = _node(procs, "first", key, "--rounds", "0")
    wait_for(lambda: "is up" in first.output(), 60, "the first node to start", watch=[first])
    second = _node(procs, "second", key, "--rounds", "0")
    assert second.wait(60) == 2, second.log_tail()
    out = second.output()
    assert f"identity {key} is in use by another running node; pass --identity PATH" in out, out
    assert "Traceback" not in out and "initial peers" not in out, out
    assert first.alive(), first.log_tail()


STAGES = ("spawned", "start-up: joining the swarm", "start-up: joined the swarm", "start-up: loading model", "is up")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_at_each_startup_stage_exits_within_the_bound(procs: Procs, stage: str, sig: int) -> None:
    key = procs.root / "n.key"
    load_or_create(key)
    node = _node(procs, "n", key, "--rounds", "0", "-v")
    masks = _signal_masks(node.pid)  # what the child inherited, for the failure message
    if stage != "spawned":
        wait_for(lambda: stage in node.output(), 60, f"stage {stage!r}", poll=0.01, watch=[node])
    t0 = time.monotonic()
    node.signal(sig)  # the whole group, as Ctrl-C in a terminal: hivemind's children get it too
    try:
        code = node.wait(SIGNAL_BOUND_S)
    except AssertionError as e:
        raise AssertionError(f"signal masks of the child at spawn: {masks}; {e}") from None
    wait_for(lambda: _group_gone(node.pid), 5, "the node's children to exit")
    took = time.monotonic() - t0
    print(f"{signal.Signals(sig).name} at {stage!r}: exit {code} after {took:.2f}s")
    # the last stage before "is up" can be printed moments before it: a signal sent then can land after
    # start-up finished (seen once under the suite's load), and then a clean leave is right
    if stage == "is up" or (stage != "spawned" and "is up" in node.output()):
        assert code == 0, node.log_tail()  # a clean leave
    elif stage != "spawned":
        assert code == 128 + sig, node.log_tail()
    assert "Traceback" not in node.output() or stage == "spawned", node.log_tail()
