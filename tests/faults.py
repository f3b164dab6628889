"""Fault injection on sync peers: ``tests/sync_worker.py`` processes on 127.0.0.1 that tests really kill and stall.

A thin layer over tests/procs.py, which starts each peer in its own session
(worker + hivemind DHT child + p2pd), so :meth:`Peer.kill` SIGKILLs exactly that
peer, :meth:`Peer.stop` / :meth:`Peer.cont` freeze and resume the whole peer,
and teardown reaches the daemons too. Peers write JSON lines to a report file
that tests poll. Tests use the ``fault_swarm`` fixture (tests/swarm/conftest.py).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from swarm.identity import load_or_create
from tests.procs import PYTHON, Proc, Procs, wait_for

WORKER = Path(__file__).resolve().parent / "sync_worker.py"

Record = dict[str, Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """One sync worker process and its JSON-lines report."""

    def __init__(self, name: str, proc: Proc, report: Path) -> None:
        self.name, self.proc, self.report = name, proc, report

    def records(self, event: str | None = None) -> list[Record]:
        if not self.report.exists():
            return []
        lines = self.report.read_text().splitlines()
        out: list[Record] = [json.loads(line) for line in lines if line.strip().endswith("}")]
        return [r for r in out if event is None or r.get("event") == event]

    def syncs(self) -> list[Record]:
        return self.records("sync")

    def wait_for(self, pred: Callable[[Record], bool], timeout: float, what: str = "a matching record") -> Record:
        """The first record satisfying ``pred``; fails after ``timeout`` s or when the peer exits first."""
        return wait_for(
            lambda: next((r for r in self.records() if pred(r)), None),
            timeout,
            f"{what} from peer {self.name}",
            poll=0.05,
            watch=[self.proc],
        )

    def wait_ready(self, timeout: float = 60.0) -> Record:
        """The peer's ``ready`` record (peer id, multiaddrs, fingerprint, bound_s, ...)."""
        return self.wait_for(lambda r: r.get("event") == "ready", timeout, "ready")

    @property
    def info(self) -> Record:
        return self.wait_ready()

    def kill(self) -> None:
        """SIGKILL the whole peer (worker, DHT child, p2pd)."""
        self.proc.kill()

    def stop(self) -> None:
        """SIGSTOP the whole peer."""
        self.proc.stop()

    def cont(self) -> None:
        """SIGCONT the whole peer."""
        self.proc.cont()


class FaultSwarm:
    """Starts sync peers joined through the first one; releases them together with :meth:`go`."""

    def __init__(self, procs: Procs) -> None:
        self.procs, self.root = procs, procs.root
        self.go_file, self.stop_file = self.root / "go", self.root / "stop"
        self.peers: dict[str, Peer] = {}
        self._bootstrap = ""

    def start(self, name: str, *args: str, via: Sequence[str] | None = None) -> Peer:
        """Start peer ``name`` (extra worker ``args``, e.g. ``"--fault", "reduced:1:stop"``).

        The first peer listens on a port picked here with an identity made
        here, so later peers can be started at once (they retry the bootstrap).
        ``via``: the multiaddrs to join through instead of the first peer's
        (:meth:`founder` gives a second swarm's).
        """
        if not self.peers:
            self._bootstrap = self.address(name)
        return self._launch(name, name, self.root / f"{name}.jsonl", args, via)

    def address(self, name: str) -> str:
        """A multiaddr on a free port for peer ``name``'s identity (made here if new)."""
        identity = load_or_create(self.root / f"{name}.key")
        return f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{identity.peer_id}"

    def founder(self, name: str, *args: str) -> tuple[Peer, str]:
        """Start peer ``name`` as the first of a swarm of its own (no ``--peer``): it and its multiaddr."""
        maddr = self.address(name)
        port = maddr.split("/")[4]
        return self._launch(name, name, self.root / f"{name}.jsonl", ("--port", port, *args), ()), maddr

    def restart(self, name: str, *args: str) -> Peer:
        """A new process of peer ``name``: its identity (and, for the first peer, its port), a new report.

        The worker keeps no checkpoint, so it restarts at revision 0: what a node restarted from an old
        checkpoint knows of the commits after it, which is nothing but what the swarm and its own files tell it.
        """
        runs = sum(1 for _ in self.root.glob(f"{name}.*jsonl")) + 1
        return self._launch(name, f"{name}.{runs}", self.root / f"{name}.{runs}.jsonl", args)

    def _launch(
        self, name: str, label: str, report: Path, args: Sequence[str], via: Sequence[str] | None = None
    ) -> Peer:
        """Run the worker as peer ``name`` (its identity), reported as ``label``; the bootstrap peer on its port.

        ``via``: the peers to join through (none: a founder, whose ``args`` name its port).
        """
        identity = self.root / f"{name}.key"
        cmd = [PYTHON, str(WORKER), "--identity", str(identity), "--report", str(report)]
        cmd += ["--go-file", str(self.go_file), "--stop-file", str(self.stop_file)]
        if via is not None:
            cmd += [arg for maddr in via for arg in ("--initial-peer", maddr)]
        elif self._bootstrap.endswith("/p2p/" + load_or_create(identity).peer_id):
            cmd += ["--port", self._bootstrap.split("/")[4]]
        else:
            cmd += ["--initial-peer", self._bootstrap]
        peer = Peer(label, self.procs.start(label, [*cmd, *args]), report)
        self.peers[label] = peer
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
        """Ask every peer to leave (the stop file ends its linger), then reap them all."""
        self.stop_file.touch()
        self.procs.reap(settle=10.0, grace=2.0)


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
