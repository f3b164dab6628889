"""Exchange nodes in their own processes on 127.0.0.1, driven over stdin/stdout.

Each worker runs in its own session (process group) together with its DHT
child and p2pd daemon, so ``kill()`` can SIGKILL exactly that peer and
cleanup reaches the daemons too. Only processes started here are signalled.
Also used by bench/bench_gossip.py.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parent / "exchange_worker.py"


class WorkerProc:
    """One exchange node in a subprocess, driven by JSON lines."""

    def __init__(self, identity: Path, initial_peer: str | None = None, *extra: str) -> None:
        cmd = [sys.executable, str(WORKER), "--identity", str(identity), *extra]
        if initial_peer:
            cmd += ["--initial-peer", initial_peer]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group: worker + DHT child + p2pd
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.info: dict[str, Any] = {}

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                self._lines.put(line[3:])

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        self.info = self.reply(timeout)
        return self.info

    @property
    def peer_id(self) -> str:
        return str(self.info["peer_id"])

    @property
    def maddr(self) -> str:
        return str(self.info["maddrs"][0])

    def reply(self, timeout: float = 20.0) -> dict[str, Any]:
        try:
            return dict(json.loads(self._lines.get(timeout=timeout)))
        except queue.Empty:
            raise TimeoutError(f"worker {self.proc.pid} did not answer within {timeout} s") from None

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def request(self, timeout: float = 20.0, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.reply(timeout)

    def kill(self) -> None:
        """SIGKILL this peer's whole process group (worker, DHT child, p2pd)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)

    def stop(self, timeout: float = 8.0) -> None:
        """Ask to quit; SIGKILL the group if it does not exit in time (and always reap daemons)."""
        if self.proc.poll() is None:
            try:
                self.send(cmd="quit")
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def start_workers(
    tmp: Path, n: int, first: WorkerProc | None = None, tag: str = "w", ready_timeout: float = 30.0
) -> list[WorkerProc]:
    """Start ``n`` workers (joining ``first`` if given, else the first of them); wait until all are ready."""
    started: list[WorkerProc] = []
    try:
        if first is None:
            first = WorkerProc(tmp / f"{tag}0.key")
            started.append(first)
            first.wait_ready(ready_timeout)
        started += [WorkerProc(tmp / f"{tag}{i}.key", first.maddr) for i in range(len(started), n)]
        for w in started:
            if not w.info:
                w.wait_ready(ready_timeout)
        return started
    except BaseException:
        for w in started:
            w.stop(timeout=1.0)
        raise
