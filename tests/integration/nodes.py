"""Real ``swarm-node`` processes on 127.0.0.1 for integration tests.

A thin layer over tests/procs.py: each node runs in its own session (process
group), so a SIGKILL takes its DHT child and p2pd with it, like a machine
crash, and teardown reaps only the groups we started. Nodes are started
either as ``python -m node`` (:class:`Swarm`) or forked from a server that
imported everything once (:class:`Zygote`, server in node/cli/forkserver.py).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from node.observe.metrics import read_events
from protocol import short_id
from swarm.identity import load_or_create
from tests.procs import PYTHON, Group, Proc, Procs, wait_for

__all__ = ["NodeProc", "Swarm", "Zygote", "wait_for"]

Event = dict[str, Any]


class NodeProc:
    """One node process: its metrics events and its log."""

    def __init__(self, name: str, peer_id: str, proc: Proc, log_dir: Path) -> None:
        self.name, self.peer_id, self.proc, self.log_dir = name, peer_id, proc, log_dir
        self.ready: dict[str, Any] = {}

    @property
    def short(self) -> str:
        return short_id(self.peer_id)

    def events(self, event: str | None = None) -> list[Event]:
        return list(read_events(self.log_dir / self.short / "metrics.jsonl", event))

    def rounds(self) -> list[Event]:
        return self.events("round")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole session: its DHT child and p2pd may outlive the node's own process."""
        self.proc.signal(sig)

    def log(self) -> str:
        return self.proc.log_tail()


class Swarm:
    """Starts nodes with ``swarm-node start/join`` through ``procs``; :meth:`stop_all` makes them leave."""

    def __init__(self, procs: Procs) -> None:
        self.procs, self.tmp = procs, procs.root
        self.nodes: list[NodeProc] = []
        self.go_file = self.tmp / "go"

    def go(self) -> None:
        """Release every spawned node into its rounds at once (they wait at most 120 s for this)."""
        self.go_file.touch()

    def spawn(self, name: str, *extra: str, join: bool = True, wait: bool = True) -> NodeProc:
        key = self.tmp / "keys" / f"{name}.key"
        peer_id = load_or_create(key).peer_id
        ready = self.tmp / f"{name}.ready"
        cmd = [PYTHON, "-m", "node", "join" if join and self.nodes else "start"]
        if join and self.nodes:
            cmd += ["--peer", self.nodes[0].ready["multiaddrs"][0]]
        cmd += ["--identity", str(key), "--log-dir", str(self.tmp / "runs"), "--host-port", "127.0.0.1:0"]
        cmd += ["--max-threads", "1", "--ready-file", str(ready), "--go-file", str(self.go_file), *extra]
        node = NodeProc(name, peer_id, self.procs.start(name, cmd), self.tmp / "runs")
        self.nodes.append(node)
        if wait:
            wait_for(ready.exists, 90, f"{name} to start", poll=0.25, watch=[node.proc])
            node.ready = json.loads(ready.read_text())
        return node

    def stop_all(self, grace: float = 20.0) -> None:
        """SIGTERM every node's group (they leave cleanly), SIGKILL what is left after ``grace`` s."""
        self.procs.reap(grace=grace)


class Zygote:
    """Client of the node fork server (node/cli/forkserver.py, as ``swarm-node local`` uses it): node
    processes without paying the imports each time.

    Each child is a real process in its own session, adopted by ``procs``, so
    it is signalled and reaped like any other group (the server reports exits;
    ``procs`` watches the pid itself).
    """

    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        self.server = procs.start("zygote", [PYTHON, "-m", "node.cli.forkserver"], pipe=True)
        self.started = 0
        # the heavy imports take a while on a loaded machine; a dead server fails at once
        assert "ready" in self._reply(), self.server.log_tail()

    def _reply(self) -> dict[str, Any]:
        """The next answer to a request (exit reports of earlier children are skipped)."""
        assert self.server.popen.stdout is not None
        while True:
            line = self.server.popen.stdout.readline()
            assert line, f"the fork server exited:\n{self.server.log_tail()}"
            msg = dict(json.loads(line))
            if "exit" not in msg:
                return msg

    def start(self, argv: list[str], log: Path) -> Group:
        """A node running ``swarm-node ARGV``, its output appended to ``log``."""
        stdin = self.server.popen.stdin
        assert stdin is not None
        stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
        stdin.flush()
        reply = self._reply()
        assert "pid" in reply, f"the fork server answered {reply!r}:\n{self.server.log_tail()}"
        self.started += 1
        return self.procs.adopt(f"node-{self.started}", int(reply["pid"]), log)
