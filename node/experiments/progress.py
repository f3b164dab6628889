"""A progress display across a whole experiment sweep (rich), counted in node-rounds."""

from __future__ import annotations

import logging
from types import TracebackType

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

logger = logging.getLogger(__name__)


class SweepProgress:
    """One bar for the sweep (all node-rounds of all runs) and one for the current run.

    With ``enabled=False`` (or no terminal) nothing is drawn and each finished
    run is logged as one line instead.
    """

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self._done_before = 0  # node-rounds of the runs already finished
        self._progress: Progress | None = None
        self._sweep: TaskID | None = None
        self._run: TaskID | None = None

    def __enter__(self) -> SweepProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("node-rounds"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._progress.start()
            self._sweep = self._progress.add_task("sweep", total=self.total)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_run(self, name: str, node_rounds: int) -> None:
        """A run of ``node_rounds`` node-rounds begins: show its own bar."""
        if self._progress is not None:
            if self._run is not None:
                self._progress.remove_task(self._run)
            self._run = self._progress.add_task(name, total=node_rounds)

    def update_run(self, node_rounds: int) -> None:
        """The current run has recorded ``node_rounds`` node-rounds so far."""
        if self._progress is not None and self._sweep is not None:
            self._progress.update(self._sweep, completed=self._done_before + node_rounds)
            if self._run is not None:
                self._progress.update(self._run, completed=node_rounds)

    def finished_run(self, name: str, node_rounds: int, skipped: bool) -> None:
        """A run ended (or was already finished before): count all of its node-rounds."""
        self._done_before += node_rounds
        if self._progress is not None and self._sweep is not None:
            self._progress.update(self._sweep, completed=self._done_before)
        what = "already finished, skipped" if skipped else "ended"
        if self._progress is not None:  # print, not rich's log: a line of results carries no source link
            self._progress.console.print(f"{name}: {what}")
        else:
            logger.info("%s: %s (%d/%d node-rounds of the sweep)", name, what, self._done_before, self.total)
