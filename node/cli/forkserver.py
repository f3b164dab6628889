"""A fork server for node processes: import torch, transformers and hivemind once, then fork per node.

A fresh ``python -m node`` spends seconds of CPU importing (about 5 s of a tiny
node's start on a 2-core machine) and keeps its own copy of every imported
module's memory. ``swarm-node local`` (and the test suite) start a server
process that imports everything once, single-threaded, and asks it for one
forked child per node: the imports are paid once, and the children share the
server's pages copy-on-write, so each node's proportional memory (PSS) falls.

Each child is a real, separate process in its own session running
``node.cli.main.main(argv)``: a SIGKILL of its process group is a machine crash
(its DHT child and p2pd die with it), as for a node started by hand.

Protocol, one JSON object per line: the client writes ``{"argv": [...], "log":
path}``; the server answers ``{"pid": N}`` (or ``{"error": "..."}``) for each,
and ``{"exit": N, "code": C}`` whenever a child exits (``C`` as
``subprocess.Popen.returncode``: negative for a signal). On end of input the
server exits; its children live on in their own sessions (the client stops
them).
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from node.cli.errors import CliError

READY_TIMEOUT_S = 90.0
REPLY_TIMEOUT_S = 30.0
MAX_REQUEST = 1 << 20  # one start request: a command line and a path


def _fresh_hivemind_locks() -> None:
    """hivemind creates process-shared locks at import; a child killed while holding one would block
    every later fork of this server, so each child gets its own (a fresh process would too)."""
    import multiprocessing as mp

    from hivemind.utils.mpfuture import MPFuture, SharedBytes

    MPFuture._initialization_lock = mp.Lock()
    MPFuture._update_lock = mp.Lock()
    SharedBytes._lock = mp.Lock()


def _child(argv: list[str], log: str, inherited: Sequence[int]) -> None:
    """Runs in the forked child: become a session of its own, write to ``log``, run the node, exit."""
    import faulthandler

    code = 99
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in inherited:  # the server's pipes and selector are not the node's
            os.close(fd)
        _fresh_hivemind_locks()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` shows where a node is stuck
        from node.cli.main import main

        code = main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _start(line: bytes, inherited: Sequence[int]) -> None:
    try:
        req = json.loads(line)
        argv, log = req["argv"], req["log"]
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(log, str)):
            raise ValueError("argv must be a list of strings and log a path")
    except (ValueError, KeyError, TypeError) as e:
        _reply({"error": f"bad start request: {e}"})
        return
    try:
        pid = os.fork()
    except OSError as e:  # out of processes or memory: this node does not start, the server goes on
        _reply({"error": f"fork failed: {e.strerror}"})
        return
    if pid == 0:
        _child(argv, log, inherited)
    _reply({"pid": pid})


def serve() -> None:
    """Import everything, say ready, then fork a node per start request until end of input."""
    import node.cli.main
    import node.cli.serve  # noqa: F401 - the heavy imports (torch, hivemind) happen here, once
    from node.training.models import import_model_code

    import_model_code()  # transformers: a node imports it once it listens; here it is paid once, shared

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # a child's exit wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    inherited = (wake_r, wake_w, sel.fileno())
    # the imported modules' objects stay shared with every child: a collection in a child would otherwise
    # write to each of them (its GC header) and copy the page
    gc.freeze()
    _reply({"ready": os.getpid(), "threads": threading.active_count()})
    buf = b""
    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:  # drained
                    pass
                _reap()
                continue
            data = os.read(0, 65536)
            if not data:
                _reap()
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                _start(line, inherited)
            if len(buf) > MAX_REQUEST:
                _reply({"error": "start request too long"})
                buf = b""


class StartupStopped(Exception):
    """A stop signal came while nodes were being started."""


class ForkedNode:
    """A node forked by the server, with the part of ``subprocess.Popen``'s interface ``local`` uses."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self._server = server

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"node pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # known exited: its pid may belong to someone else by now
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class ForkServer:
    """Client side: starts ``python -m node.cli.forkserver`` and asks it for node processes."""

    def __init__(
        self,
        log: Path,
        python: str = sys.executable,
        ready_timeout: float = READY_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> None:
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            [python, "-m", "node.cli.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        self._cond = threading.Condition()
        self._replies: list[dict[str, Any]] = []
        self._exits: dict[int, int] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()
        self._stop = stop
        ready = self._next_reply(ready_timeout)
        if "ready" not in ready:
            self.close()
            if self._stop is not None and self._stop.is_set():
                raise StartupStopped("stopped while the node fork server was starting")
            raise CliError(f"the node fork server did not start ({ready}); see {log} for why")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                if "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["code"])
                else:
                    self._replies.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._replies:
                left = deadline - time.monotonic()
                if self._stop is not None and self._stop.is_set():
                    return {"error": "asked to stop"}
                if self._closed or left <= 0:
                    return {"error": "server exited" if self._closed else f"no answer in {timeout:.0f}s"}
                self._cond.wait(min(left, 0.2))  # 0.2 s: a stop request is seen at once
            return self._replies.pop(0)

    def spawn(self, argv: list[str], log: Path) -> ForkedNode:
        """A node running ``swarm-node ARGV`` with its output appended to ``log``."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps({"argv": argv, "log": str(log)}) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise CliError(f"the node fork server has exited; see {self._log.name} for why") from None
        reply = self._next_reply(REPLY_TIMEOUT_S)
        if "pid" not in reply and self._stop is not None and self._stop.is_set():
            raise StartupStopped("stopped while nodes were starting")
        if "pid" not in reply:
            raise CliError(f"the node fork server could not start a node ({reply.get('error')})")
        return ForkedNode(int(reply["pid"]), self)

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            code = self._exits.get(pid)
            if code is None and self._closed:  # no one left to tell: ask the kernel whether it is gone
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return -signal.SIGKILL
            return code

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.exit_code(pid)
            left = None if deadline is None else deadline - time.monotonic()
            if code is not None or (left is not None and left <= 0):
                return code
            with self._cond:
                self._cond.wait(0.1 if left is None else min(0.1, left))

    def close(self) -> None:
        """End the server (its children are stopped by the caller; they live in their own sessions)."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        self._reader.join(5)
        self._log.close()


if __name__ == "__main__":
    serve()
