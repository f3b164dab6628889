"""``swarm-node local`` end to end: nodes forked from one process that imported everything (the default) or
started as fresh python processes, every round run, nothing left behind."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest

from node.cli.forkserver import ForkServer
from tests.procs import PYTHON, Procs, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _node_pids(log_dir: Path, n: int) -> list[int]:
    return [int(json.loads((log_dir / f"node{i}.ready").read_text())["pid"]) for i in range(n)]


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_local_runs_every_round_and_leaves_no_process(procs: Procs, fresh: bool) -> None:
    log_dir = procs.root / "runs"
    cmd = [PYTHON, "-m", "node", "local", "--nodes", "3", "--rounds", "3", "--models", "tiny-s", "--no-dashboard"]
    cmd += ["--generations", "4", "--seed", "1", "--log-dir", str(log_dir), *(["--fresh-processes"] if fresh else [])]
    local = procs.start("local", cmd)
    wait_for(lambda: "nodes up" in local.output(), 180, "the local swarm", poll=0.25, watch=[local])
    pids = _node_pids(log_dir, 3)
    parents = {psutil.Process(p).ppid() for p in pids}
    assert len(parents) == 1, parents  # one launcher: local itself, or its fork server
    launcher = psutil.Process(parents.pop())
    if fresh:
        assert launcher.pid == local.popen.pid
    else:
        assert "node.cli.forkserver" in launcher.cmdline(), launcher.cmdline()
    assert local.wait(180) == 0, local.log_tail()
    rows = [
        line for line in (log_dir / "summary.md").read_text().splitlines() if line.startswith("| ") and "tiny-s" in line
    ]
    assert [row.split(" | ")[4] for row in rows] == ["3", "3", "3"], rows
    wait_for(lambda: all(_gone(p) for p in [*pids, launcher.pid]), 30, "every node and the launcher gone")


def test_the_fork_server_reports_exits_and_refuses_bad_requests(procs: Procs) -> None:
    server = ForkServer(procs.root / "forkserver.log")
    try:
        key, log = procs.root / "a.key", procs.root / "id.log"
        quick = server.spawn(["id", "--identity", str(key)], log)
        procs.adopt("id", quick.pid, log)
        assert quick.wait(60) == 0
        assert "12D3Koo" in log.read_text()  # the node's own output went to its log
        bad = server.spawn(["local", "--nodes", "0"], procs.root / "bad.log")
        procs.adopt("bad", bad.pid)
        assert bad.wait(60) == 2  # a usage error: one sentence, status 2, as from a shell
        assert "--nodes must be >= 1 and <= 64, got 0" in (procs.root / "bad.log").read_text()

        ready = procs.root / "n.ready"
        argv = ["start", "--identity", str(procs.root / "n.key"), "--host-port", "127.0.0.1:0"]
        argv += ["--log-dir", str(procs.root / "n"), "--ready-file", str(ready), "--go-file", str(procs.root / "go")]
        node = server.spawn(argv, procs.root / "n.log")
        group = procs.adopt("node", node.pid, procs.root / "n.log")
        wait_for(ready.exists, 120, "the forked node up", watch=[group])
        assert node.poll() is None
        group.kill()  # its own session: the whole machine, DHT child and p2pd included
        assert node.wait(30) == -signal.SIGKILL
        node.send_signal(signal.SIGTERM)  # known gone: its pid is not signalled again

        assert server._proc.stdin is not None
        server._proc.stdin.write(b"not json\n")
        server._proc.stdin.flush()
        assert "error" in server._next_reply(30)
        again = server.spawn(["id", "--identity", str(key)], procs.root / "again.log")
        procs.adopt("again", again.pid)
        assert again.wait(60) == 0  # still serving
    finally:
        server.close()
    assert server._proc.returncode == 0


@pytest.mark.parametrize("when", ["starting", "running"])
def test_ctrl_c_stops_local_and_every_node_within_the_bound(procs: Procs, when: str) -> None:
    log_dir = procs.root / "runs"
    cmd = [PYTHON, "-m", "node", "local", "--nodes", "3", "--rounds", "100000", "--models", "tiny-s"]
    cmd += ["--no-dashboard", "--generations", "4", "--log-dir", str(log_dir)]
    local = procs.start("local", cmd)
    if when == "starting":  # the fork server is importing, or node 0 is joining: no node is up yet
        wait_for(lambda: (log_dir / "forkserver.log").exists(), 60, "the fork server started", watch=[local])
    else:
        wait_for(lambda: "nodes up" in local.output(), 180, "the local swarm", poll=0.25, watch=[local])
        wait_for(lambda: "rounds" in local.output().split("nodes up")[-1], 60, "a round", watch=[local])
    tree = psutil.Process(local.popen.pid).children(recursive=True)
    local.send(signal.SIGINT)
    assert local.wait(30) in (0, 130), local.log_tail()
    wait_for(lambda: all(_gone(p.pid) for p in tree), 15, "every process local started gone")
    if when == "running":
        assert len(tree) >= 1 + 3 * 3  # the fork server, and 3 nodes with their DHT process and p2pd each
