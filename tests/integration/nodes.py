"""Spawning real ``swarm-node`` processes on 127.0.0.1 for integration tests.

Each node runs in its own session (process group) so that a SIGKILL takes its
DHT child and p2pd with it, like a machine crash; cleanup kills only the
groups we started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.observe.metrics import read_events
from protocol import short_id
from swarm.identity import load_or_create


@dataclass
class NodeProc:
    name: str
    peer_id: str
    proc: subprocess.Popen[bytes]
    log_dir: Path
    log_path: Path
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return short_id(self.peer_id)

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        return list(read_events(self.log_dir / self.short / "metrics.jsonl", event))

    def rounds(self) -> list[dict[str, Any]]:
        return self.events("round")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        # the whole session: its DHT child and p2pd may outlive the node's own process
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


class Swarm:
    """Starts nodes with ``swarm-node start/join`` and always cleans them up."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nodes: list[NodeProc] = []
        self.go_file = tmp / "go"

    def go(self) -> None:
        """Release every spawned node into its rounds at once (they wait at most 120 s for this)."""
        self.go_file.touch()

    def spawn(self, name: str, *extra: str, join: bool = True, wait: bool = True) -> NodeProc:
        key = self.tmp / "keys" / f"{name}.key"
        peer_id = load_or_create(key).peer_id
        ready = self.tmp / f"{name}.ready"
        cmd = [sys.executable, "-m", "node", "join" if join and self.nodes else "start"]
        if join and self.nodes:
            cmd += ["--peer", self.nodes[0].ready["multiaddrs"][0]]
        cmd += ["--identity", str(key), "--log-dir", str(self.tmp / "runs"), "--host-port", "127.0.0.1:0"]
        cmd += ["--max-threads", "1", "--ready-file", str(ready), "--go-file", str(self.go_file), *extra]
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node = NodeProc(name, peer_id, proc, self.tmp / "runs", log_path)
        self.nodes.append(node)
        if wait:
            wait_for(lambda: ready.exists() or proc.poll() is not None, 90, f"{name} to start")
            assert proc.poll() is None, f"{name} exited early:\n{node.log()}"
            node.ready = json.loads(ready.read_text())
        return node

    def stop_all(self, grace: float = 20.0) -> None:
        for n in self.nodes:
            n.kill(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for n in self.nodes:
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            n.kill(signal.SIGKILL)  # leftovers of the group, if any
            n.proc.wait(5)


def wait_for(cond: Callable[[], bool], timeout: float, what: str, poll: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def swarm_fixture(tmp_path: Path) -> Iterator[Swarm]:
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.stop_all()
