"""Stopping a node process: the first signal asks politely, a second Ctrl-C exits at once.

Signals are acted on by a watcher thread, not by a Python signal handler: a
handler runs only when the main thread gets back to the interpreter, and
during start-up the main thread can sit for good in native code (torch's
shared-memory manager, started by hivemind, spins when the signal that
reached the whole process group killed that manager first). Python's C-level
handler still writes each signal's number to a wakeup socket
(:func:`signal.set_wakeup_fd`) whatever the main thread does; the watcher
reads it. Before start-up is over nothing is worth saving (no round has run,
a checkpoint on disk is untouched), so a signal then exits at once.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any

EXIT_PASSES = 4
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOPPING = "\nswarm-node: leaving after the current step (Ctrl-C again to exit now)"


def exit_now(code: int) -> None:
    """Exit at once, taking this process's own children (DHT process, p2pd) along.

    ``os._exit`` skips every cleanup, so without this the hivemind child and
    its p2pd daemon would be left running as orphans. A child forked while we
    enumerate would be missed, so we look again until a pass finds none (and
    forked children die with us anyway: :func:`_die_with_parent`).
    """
    # the main thread runs on while we kill its helpers: if it fails and the interpreter ends (status 1)
    # before this thread reaches os._exit, the exit still carries ``code``
    atexit.register(os._exit, code)
    try:
        # the main thread's failure (a traceback when the DHT process goes) is teardown noise after our
        # one line, so what it writes now is dropped
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        import psutil

        for _ in range(EXIT_PASSES):
            children = [c for c in psutil.Process().children(recursive=True) if _ours_to_kill(c)]
            if not children:
                break
            for child in children:
                try:
                    child.kill()
                except psutil.Error:
                    pass
    finally:
        os._exit(code)


def _ours_to_kill(child: Any) -> bool:
    """A live child to kill: not a zombie already, and not torch's shared-memory manager.

    The manager exits by itself once we are gone; killing it first makes torch
    abort the main thread (SIGABRT instead of our exit status) while we exit.
    """
    try:
        return bool(child.status() != "zombie" and child.name() != "torch_shm_manager")
    except Exception:  # psutil.Error: it is gone already
        return False


_fork_hook_registered = threading.Event()  # os.register_at_fork hooks cannot be removed: register once
_forks_die_with_us = False


def _die_with_parent() -> None:
    """In a forked child (hivemind's DHT process): get SIGKILL when this process dies, even by SIGKILL.

    It also stops writing its own signals to our wakeup socket, which it
    inherited: the watcher would count one Ctrl-C twice.
    """
    if not _forks_die_with_us:
        return
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one
        pass
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: exit_now still kills the children it can see
        pass


def _say(line: str) -> None:
    """Write to stderr without Python's stream lock, which a stuck main thread may hold."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


class StopSignals:
    """SIGINT/SIGTERM handling of one process; see the module docstring."""

    def __init__(self, stop: threading.Event, starting: bool) -> None:
        self.stop = stop
        self._starting = starting
        self._lock = threading.Lock()
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # set_wakeup_fd needs it: a signal handler must never block
        self._old: dict[int, Any] = {}
        self._old_fd = -1

    def install(self) -> StopSignals:
        """Install the handlers and start the watcher (main thread only)."""
        global _forks_die_with_us
        self._old_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM)}
        if sys.platform == "linux" and not _fork_hook_registered.is_set():
            os.register_at_fork(after_in_child=_die_with_parent)
            _fork_hook_registered.set()
        _forks_die_with_us = True
        threading.Thread(target=self._watch, name="stop-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced (for a command run inside another program, e.g. a test)."""
        global _forks_die_with_us
        _forks_die_with_us = False
        for s, old in self._old.items():
            signal.signal(s, old)
        signal.set_wakeup_fd(self._old_fd)
        self._write.close()  # the watcher reads EOF and ends

    def _note(self, signum: int, frame: FrameType | None) -> None:
        """Installed so that the C-level handler writes to the wakeup fd; the watcher thread does the work.

        It runs on the main thread when that is back in the interpreter. During start-up it makes sure the
        exit carries the signal's status: a signal sent to the whole process group kills the node's p2pd
        too, and a main thread that fails on that and ends the interpreter (status 1) can beat the watcher.
        """
        if self._starting:
            atexit.register(os._exit, 128 + signum)

    def started(self) -> None:
        """Start-up is over: from now on the first signal leaves cleanly (during start-up it exits at once)."""
        with self._lock:
            self._starting = False

    def _watch(self) -> None:
        while True:
            data = self._read.recv(64)
            if not data:
                return
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self.on_signal(signum)

    def on_signal(self, signum: int) -> None:
        """One signal: exit during start-up or on a second Ctrl-C, otherwise ask the node to leave."""
        with self._lock:
            if self._starting:
                _say(f"\nswarm-node: stopped during start-up ({signal.Signals(signum).name})")
                exit_now(128 + signum)
            if self.stop.is_set() and signum == signal.SIGINT:
                exit_now(130)
            if not self.stop.is_set():
                self.stop.set()
                _say(STOPPING)


def install_stop_handlers(stop: threading.Event, starting: bool = False) -> StopSignals:
    """First SIGINT/SIGTERM sets ``stop``; a second Ctrl-C exits at once; while ``starting``, any signal exits.

    Call :meth:`StopSignals.started` once start-up is over.
    """
    return StopSignals(stop, starting).install()


def stop_signals(args: Any, starting: bool) -> StopSignals:
    """The handlers ``main`` installed for this command (``args.stop_signals``), or new ones (direct callers)."""
    installed = getattr(args, "stop_signals", None)
    if isinstance(installed, StopSignals):
        return installed
    return install_stop_handlers(threading.Event(), starting)
