"""A private asyncio event loop on a daemon thread, for P2P calls from sync code.

hivemind's P2P client is asyncio-based; the node is synchronous (torch). Every
call into the loop goes through :meth:`LoopThread.run` with a timeout, so a
stuck coroutine can never hang the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs one asyncio loop on a daemon thread until :meth:`stop`."""

    def __init__(self, name: str = "swarm-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop; raise TimeoutError (and cancel it) after ``timeout`` s."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"operation did not finish within {timeout:.1f} s") from None

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel pending tasks, stop the loop and join the thread (bounded)."""
        if not self.loop.is_running():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=timeout) if tasks else None

        try:
            self.run(_cancel_all(), timeout)
        except (TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
