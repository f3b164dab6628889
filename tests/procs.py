"""The one process harness of the multi-process tests: start, fault, wait for and reap real processes.

Every child runs in its own session (``start_new_session=True``), so its
process group holds it and what it starts without a session of its own
(hivemind's DHT child, p2pd). Signalling the group reaches all of it: SIGKILL
is a machine crash, SIGSTOP a frozen machine. Only groups started through a
:class:`Procs` (or handed to it with :meth:`Procs.adopt`) are ever signalled.

A :class:`Procs` owns the processes of one fixture and reaps them at teardown:
SIGCONT (a stopped group can neither act on SIGTERM nor exit), an optional
wait for children already asked to leave, SIGTERM, a grace period, then
SIGKILL of every group, daemons left behind included. Tests get one through
the ``procs`` fixture (tests/conftest.py). The specific harnesses sit on it:

* tests/faults.py: sync peers (tests/sync_worker.py) and their JSON-lines reports;
* tests/swarm/workers.py: exchange workers driven over stdin/stdout;
* tests/integration/nodes.py: ``python -m node`` processes, started directly or
  forked by the node fork server (node/cli/forkserver.py).

:func:`wait_for` is the one way a test waits: it polls a condition and fails
with a message (and the log of a watched process that died) instead of sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

T = TypeVar("T")


class Reporter:
    """Appends one JSON object per line to a peer's report; each line is flushed, so a test or bench can
    read it while the peer runs (used by tests/sync_worker.py and bench/'s comparison workers)."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    def write(self, **record: Any) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()


def poll_until(cond: Callable[[], T | None], timeout: float, poll: float = 0.05) -> T | None:
    """The first truthy value of ``cond()`` within ``timeout`` s, else None.

    ``poll=0`` spins without sleeping, for catching a short window (a file that
    exists for milliseconds); every other wait should sleep between polls.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        if poll > 0:
            time.sleep(poll)


def wait_for(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    poll: float = 0.25,
    watch: Iterable[Group] = (),
) -> T:
    """Poll ``cond`` until it returns a truthy value and return that value.

    Fails (AssertionError, naming ``what``) after ``timeout`` s, or as soon as a
    process in ``watch`` has exited while the condition still does not hold:
    waiting on a dead process's output would only run into the timeout.
    """
    watched = list(watch)
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        gone = next((g for g in watched if not g.alive()), None)
        if gone is not None:
            value = cond()  # it may have written its last record just before it exited
            if value:
                return value
            raise AssertionError(f"{gone.name} exited ({gone.status()}) before {what}:\n{gone.log_tail()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (exited, not yet collected by its parent)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (or its pid reused by someone else's process)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux), or it has just gone
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class Group:
    """A process group we started: the session of one child, whose pid is the group id."""

    def __init__(self, name: str, pid: int, log: Path | None) -> None:
        self.name, self.pid, self.log = name, pid, log

    def alive(self) -> bool:
        """Whether the group's leader still runs."""
        return pid_alive(self.pid)

    def status(self) -> str:
        return "running" if self.alive() else "gone"

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group; a group that is already gone is fine."""
        with suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group: a crash of the child, its DHT child and p2pd."""
        self.signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP the group: it freezes, connections stay open."""
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT the group."""
        self.signal(signal.SIGCONT)

    def term(self) -> None:
        """SIGTERM the group: asks every process in it to leave."""
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the leader to exit (AssertionError otherwise).

        Its exit status is known only to its parent; None here (see :class:`Proc`).
        """
        wait_for(lambda: not self.alive(), timeout, f"{self.name} (pid {self.pid}) to exit", poll=0.05)
        return None

    def output(self) -> str:
        """Everything in the log so far."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:] if self.log is not None else "(no log)"

    def _reaped(self, timeout: float) -> None:
        """After the final SIGKILL: wait (bounded) until the leader is gone."""
        poll_until(lambda: not self.alive(), timeout)


class Proc(Group):
    """A child we started with :class:`subprocess.Popen`, in its own session."""

    def __init__(self, name: str, popen: subprocess.Popen[str], log: Path | None) -> None:
        super().__init__(name, popen.pid, log)
        self.popen = popen

    def alive(self) -> bool:
        return self.popen.poll() is None

    def status(self) -> str:
        code = self.popen.poll()
        return "running" if code is None else f"exit status {code}"

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def send(self, sig: int) -> None:
        """Send ``sig`` to the child alone, not its group: it stops its own children itself (a node leaving)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The child's exit status; AssertionError with its log if it runs longer than ``timeout`` s."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running {timeout:.0f}s later:\n{self.log_tail()}") from None

    def _reaped(self, timeout: float) -> None:
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)  # collect the exit status: no zombie
        if self.popen.stdin is not None:
            with suppress(OSError):
                self.popen.stdin.close()


def stop_signals_as_from_a_shell() -> None:
    """Let children start with SIGINT and SIGTERM neither ignored nor blocked, as a shell starts them.

    A child inherits this process's ignored set and this thread's blocked mask; a library that
    left SIGINT ignored or blocked here would make a signal sent to a child before its handlers
    are up vanish, and the start-up signal tests fail for a reason that is not the node's.
    """
    with suppress(OSError, ValueError):
        status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
        ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn")).split()[1], 16)
        if ignored & (1 << (signal.SIGINT - 1)) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


class Procs:
    """The process groups of one fixture; :meth:`reap` ends them all (also on leaving a ``with`` block)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.groups: list[Group] = []

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        log: Path | None = None,
        pipe: bool = False,
        cwd: Path = REPO,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Start ``cmd`` in its own session, its output in ``log`` (default ``root/NAME.log``).

        ``pipe=True``: stdin and stdout are text pipes for the caller to talk to
        the child; only stderr goes to the log.
        """
        log = log or self.root / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        stop_signals_as_from_a_shell()
        with open(log, "w") as out:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipe else out,
                stderr=out if pipe else subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.groups.append(proc)
        return proc

    def adopt(self, name: str, pid: int, log: Path | None = None) -> Group:
        """Take charge of a process group started for us elsewhere (by a fork server): its pid is its group id."""
        group = Group(name, pid, log)
        self.groups.append(group)
        return group

    def reap(self, settle: float = 0.0, grace: float = 10.0) -> None:
        """End every group: SIGCONT; wait up to ``settle`` s for children that were asked to
        leave; SIGTERM those still running and wait up to ``grace`` s (``grace=0``: none);
        then SIGKILL every group, daemons left behind included. Safe to call again."""
        groups = list(self.groups)

        def all_gone() -> bool:
            return not any(g.alive() for g in groups)

        for g in groups:
            g.cont()
        if settle > 0:
            poll_until(all_gone, settle)
        if grace > 0:
            for g in groups:
                if g.alive():
                    g.term()
            poll_until(all_gone, grace)
        for g in groups:
            g.kill()
        for g in groups:
            g._reaped(5.0)

    def __enter__(self) -> Procs:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.reap()
