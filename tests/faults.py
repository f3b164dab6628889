"""Shared fault-injection harness: peer processes on 127.0.0.1 that tests really kill and stall.

Each peer runs ``tests/sync_worker.py`` in its own session (process group:
worker + hivemind DHT child + p2pd), so :meth:`Peer.kill` SIGKILLs exactly
that peer, :meth:`Peer.stop` / :meth:`Peer.cont` freeze and resume the whole
peer, and cleanup reaches the daemons too. Only processes started here are
ever signalled. Peers write JSON lines to a report file that tests poll.

Use the ``fault_swarm`` fixture (import it into a test module)::

    from faults import FaultSwarm, fault_swarm_fixture  # noqa: F401  (provides `fault_swarm`)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).resolve().parent / "sync_worker.py"
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from swarm.identity import load_or_create  # noqa: E402

Record = dict[str, Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """One sync worker process and its JSON-lines report."""

    def __init__(self, name: str, cmd: list[str], report: Path, log: Path) -> None:
        self.name, self.report = name, report
        self._log = open(log, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def records(self, event: str | None = None) -> list[Record]:
        if not self.report.exists():
            return []
        lines = self.report.read_text().splitlines()
        out = [json.loads(line) for line in lines if line.strip().endswith("}")]
        return [r for r in out if event is None or r.get("event") == event]

    def syncs(self) -> list[Record]:
        return self.records("sync")

    def wait_for(self, pred: Callable[[Record], bool], timeout: float, what: str = "") -> Record:
        """The first record satisfying ``pred``; TimeoutError after ``timeout`` s."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for r in self.records():
                if pred(r):
                    return r
            if self.proc.poll() is not None and not any(pred(r) for r in self.records()):
                raise RuntimeError(f"peer {self.name} exited ({self.proc.returncode}) before {what}")
            time.sleep(0.05)
        raise TimeoutError(f"peer {self.name}: no {what or 'matching record'} within {timeout} s")

    def wait_ready(self, timeout: float = 60.0) -> Record:
        """The peer's ``ready`` record (peer id, multiaddrs, fingerprint, bound_s, ...)."""
        return self.wait_for(lambda r: r.get("event") == "ready", timeout, "ready")

    @property
    def info(self) -> Record:
        return self.wait_ready()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole peer (worker, DHT child, p2pd)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP the whole peer."""
        self._signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT the whole peer."""
        self._signal(signal.SIGCONT)

    def close(self, timeout: float = 10.0) -> None:
        self.cont()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(5.0)
        self.kill()  # daemons left in the group, if any
        self._log.close()


class FaultSwarm:
    """Starts sync peers joined through the first one; releases them together with :meth:`go`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.go_file, self.stop_file = root / "go", root / "stop"
        self.peers: dict[str, Peer] = {}
        self._bootstrap = ""

    def start(self, name: str, *args: str) -> Peer:
        """Start peer ``name`` (extra worker ``args``, e.g. ``"--fault", "reduced:1:stop"``).

        The first peer listens on a port picked here with an identity made
        here, so later peers can be started at once (they retry the bootstrap).
        """
        identity = self.root / f"{name}.key"
        cmd = [sys.executable, str(WORKER), "--identity", str(identity), "--report", str(self.root / f"{name}.jsonl")]
        cmd += ["--go-file", str(self.go_file), "--stop-file", str(self.stop_file)]
        if not self.peers:
            self._bootstrap = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{load_or_create(identity).peer_id}"
            cmd += ["--port", self._bootstrap.split("/")[4]]
        else:
            cmd += ["--initial-peer", self._bootstrap]
        peer = Peer(name, [*cmd, *args], self.root / f"{name}.jsonl", self.root / f"{name}.log")
        self.peers[name] = peer
        return peer

    def start_many(self, specs: Mapping[str, Sequence[str]]) -> list[Peer]:
        """Start every peer at once and wait until all are up."""
        peers = [self.start(n, *args) for n, args in specs.items()]
        for p in peers:
            p.wait_ready()
        return peers

    def go(self) -> None:
        self.go_file.touch()

    def close(self) -> None:
        self.stop_file.touch()
        for p in self.peers.values():
            p.close()


@pytest.fixture(name="fault_swarm")
def fault_swarm_fixture(tmp_path: Path) -> Iterator[FaultSwarm]:
    """A :class:`FaultSwarm` in ``tmp_path``; every peer is stopped (or killed) afterwards."""
    swarm = FaultSwarm(tmp_path)
    try:
        yield swarm
    finally:
        swarm.close()


def hashes_by_revision(peers: list[Peer]) -> dict[int, set[str]]:
    """Every state hash reported at each revision by committed syncs of ``peers``."""
    out: dict[int, set[str]] = {}
    for p in peers:
        for r in p.syncs():
            if r["committed"]:
                out.setdefault(r["revision"], set()).add(r["state_hash"])
    return out


def final_state(peer: Peer, timeout: float) -> Record:
    """The peer's ``done`` record (its final revision and state hash)."""
    return peer.wait_for(lambda r: r.get("event") == "done", timeout, "done")
