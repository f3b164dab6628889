"""Exchange nodes in their own processes on 127.0.0.1, driven over stdin/stdout JSON lines.

A thin layer over tests/procs.py, which starts each worker in its own session
(worker + DHT child + p2pd), so ``kill()`` SIGKILLs exactly that peer and the
reaping at teardown reaches the daemons too. Each worker's stderr goes to
``NAME.log`` beside its identity. Also used by bench/bench_gossip.py.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

from tests.procs import PYTHON, Proc, Procs

WORKER = Path(__file__).resolve().parent / "exchange_worker.py"


class LineWorker:
    """A worker process driven by JSON lines: commands on stdin, replies on stdout lines starting "@@ "."""

    def __init__(self, procs: Procs, name: str, cmd: list[str]) -> None:
        self.proc: Proc = procs.start(name, cmd, pipe=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.info: dict[str, Any] = {}

    def _pump(self) -> None:
        assert self.proc.popen.stdout is not None
        for line in self.proc.popen.stdout:
            if line.startswith("@@ "):
                self._lines.put(line[3:])

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        self.info = self.reply(timeout)
        return self.info

    def reply(self, timeout: float = 20.0) -> dict[str, Any]:
        try:
            return dict(json.loads(self._lines.get(timeout=timeout)))
        except queue.Empty:
            raise AssertionError(
                f"worker {self.proc.name} ({self.proc.status()}) did not answer within {timeout} s:\n"
                f"{self.proc.log_tail()}"
            ) from None

    def send(self, **cmd: Any) -> None:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()

    def request(self, timeout: float = 20.0, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.reply(timeout)

    def kill(self) -> None:
        """SIGKILL this peer's whole process group (worker, DHT child, p2pd) and wait until it is gone."""
        self.proc.kill()
        self.proc.wait(5.0)

    def quit(self) -> None:
        """Ask the worker to leave (it closes its exchange and DHT); the reaping after it ends what is left."""
        if self.proc.alive():
            try:
                self.send(cmd="quit")
            except OSError:  # it died meanwhile: nothing to ask
                pass


class WorkerProc(LineWorker):
    """One exchange node in a subprocess (tests/swarm/exchange_worker.py)."""

    def __init__(self, procs: Procs, name: str, initial_peer: str | None = None, *extra: str) -> None:
        cmd = [PYTHON, str(WORKER), "--identity", str(procs.root / f"{name}.key"), *extra]
        if initial_peer:
            cmd += ["--initial-peer", initial_peer]
        super().__init__(procs, name, cmd)

    @property
    def peer_id(self) -> str:
        return str(self.info["peer_id"])

    @property
    def maddr(self) -> str:
        return str(self.info["maddrs"][0])


def start_workers(
    procs: Procs, n: int, first: WorkerProc | None = None, tag: str = "w", ready_timeout: float = 30.0
) -> list[WorkerProc]:
    """Start ``n`` workers (joining ``first`` if given, else the first of them); wait until all are ready.

    Their identities and logs are ``TAG<i>.key`` / ``TAG<i>.log`` in ``procs.root``;
    ``procs`` reaps them (also when one fails to start).
    """
    started: list[WorkerProc] = []
    if first is None:
        first = WorkerProc(procs, f"{tag}0")
        started.append(first)
        first.wait_ready(ready_timeout)
    started += [WorkerProc(procs, f"{tag}{i}", first.maddr) for i in range(len(started), n)]
    for w in started:
        if not w.info:
            w.wait_ready(ready_timeout)
    return started
