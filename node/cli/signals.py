"""Stopping a node process: the first signal asks politely, a second Ctrl-C exits at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType


def exit_now(code: int) -> None:
    """Exit at once, taking this process's own children (DHT process, p2pd) along.

    ``os._exit`` skips every cleanup, so without this the hivemind child and
    its p2pd daemon would be left running as orphans.
    """
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    finally:
        os._exit(code)


def install_stop_handlers(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM stops after the current step; a second Ctrl-C exits at once."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            exit_now(130)
        stop.set()
        print("\nswarm-node: leaving after the current step (Ctrl-C again to exit now)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
