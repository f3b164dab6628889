"""A fork server for node processes: import torch, hivemind and the node once, then fork per start.

A fresh ``python -m node`` spends most of its start-up importing (seconds of
CPU on a loaded 2-core machine); forking a process that already imported
everything makes a test that restarts a node many times affordable. Each
child is a real, separate process in its own session running
``node.cli.main.main(argv)``, so a SIGKILL of its process group is a machine crash
(its DHT child and p2pd die with it).

Protocol: one JSON object per stdin line, ``{"argv": [...], "log": path}``;
the server answers each with the child's pid on one stdout line. Children are
reaped automatically. The client, :class:`tests.integration.nodes.Zygote`,
hands each child's process group to the test's ``procs`` (tests/procs.py),
which signals and reaps it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback


def _fresh_hivemind_locks() -> None:
    """hivemind creates process-shared locks at import; a child killed while holding one would block
    every later fork of this server, so each child gets its own (a fresh process would too)."""
    import multiprocessing as mp

    from hivemind.utils.mpfuture import MPFuture, SharedBytes

    MPFuture._initialization_lock = mp.Lock()
    MPFuture._update_lock = mp.Lock()
    SharedBytes._lock = mp.Lock()


def _child(argv: list[str], log: str) -> None:
    import faulthandler

    os.setsid()
    _fresh_hivemind_locks()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` shows where a child is stuck
    code = 99
    try:
        from node.cli.main import main

        code = main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Read start requests from stdin until EOF."""
    import node.cli.local
    import node.cli.main
    import node.cli.serve  # noqa: F401 - the heavy imports (torch, transformers, hivemind) happen here, once

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap children automatically
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req["argv"], req["log"])
        print(pid, flush=True)


if __name__ == "__main__":
    serve()
