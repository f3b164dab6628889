"""Per-round scalars to TensorBoard or Weights & Biases beside ``metrics.jsonl`` (TRL's ``report_to``).

``metrics.jsonl`` stays the record every reader of this project uses; a researcher who follows runs in
TensorBoard or W&B sees the same numbers there, with the round as the step. The writer here is the node's
metrics writer, so every event the node records passes one place: ``round`` events give the reward, the
groups used, loss and learning rate, ``eval`` events the held-out accuracy, and ``sync`` events the outer
sync's commits (counted, and logged with the round they fall in). Each backend is an optional package,
imported only when chosen; the command line refuses ``--report-to`` when its package is missing
(:func:`node.core.options.report_to_problem`), before anything heavy loads.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from node.observe.metrics import MetricsWriter

logger = logging.getLogger(__name__)

ROUND_SCALARS = {
    "reward_mean": "reward/local",
    "external_reward_mean": "reward/external",
    "local_groups": "groups/local",
    "external_groups": "groups/external",
    "trained_groups": "groups/trained",
    "external_rejected": "groups/rejected_completions",
    "loss": "train/loss",
    "lr": "train/lr",
    "peers_seen": "swarm/peers_seen",
    "round_s": "time/round_s",
}
"""``round`` event key -> scalar tag."""
EVAL_SCALARS = {"accuracy": "heldout/accuracy", "sample_reward": "heldout/sample_reward"}
"""``eval`` event key -> scalar tag (round 0: before training)."""
SYNC_SCALARS = ("sync/commits", "sync/attempts")
"""Outer syncs committed and tried so far, logged with each round once a sync has been tried."""

TENSORBOARD_FOLDER = "tensorboard"
"""Beside the node's ``metrics.jsonl``: ``tensorboard --logdir <log-dir>`` shows every node of a run or sweep."""
WANDB_PROJECT = "swarm-node"


@dataclass
class ScalarFeed:
    """Turns metrics events into (step, scalars); the sync tally carries over from event to event."""

    commits: int = 0
    attempts: int = 0

    def take(self, event: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
        """The scalars an event gives at its round, or None for an event that logs none (a sync is counted)."""
        kind = event.get("event")
        if kind == "sync":
            self.attempts += 1
            self.commits += int(bool(event.get("committed")))
            return None
        table = ROUND_SCALARS if kind == "round" else EVAL_SCALARS if kind == "eval" else None
        if table is None or event.get("round") is None:
            return None
        values = {tag: float(event[key]) for key, tag in table.items() if _number(event.get(key))}
        if kind == "round" and self.attempts:
            values |= dict(zip(SYNC_SCALARS, (float(self.commits), float(self.attempts)), strict=True))
        return int(event["round"]), values


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Sink(Protocol):
    """Where the scalars go."""

    def add(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """TensorBoard event files in ``folder``, written by torch's writer (it needs the tensorboard package)."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: an optional package, and torch's

        self._writer = SummaryWriter(log_dir=str(folder), flush_secs=10)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One Weights & Biases run per node: named by the node, grouped by its swarm (a sweep's run)."""

    def __init__(self, folder: Path, name: str, group: str) -> None:
        wandb: Any = importlib.import_module("wandb")  # lazy: an optional package
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=name, group=group,
                               dir=str(folder))  # fmt: skip

    def add(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


def open_sink(report_to: str, folder: Path, name: str, group: str) -> Sink | None:
    """The sink ``--report-to`` names (None for ``none``)."""
    if report_to == "none":
        return None
    if report_to == "tensorboard":
        return TensorBoardSink(folder / TENSORBOARD_FOLDER)
    if report_to == "wandb":
        return WandbSink(folder, name, group)
    raise ValueError(f"--report-to {report_to!r}; use none, tensorboard or wandb")


class ReportingWriter(MetricsWriter):
    """The node's metrics writer, handing each event's scalars to a sink as well; closing it closes the sink."""

    def __init__(self, path: str | os.PathLike[str], sink: Sink) -> None:
        super().__init__(path)
        self._sink = sink
        self._feed = ScalarFeed()

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = super().write(event, **fields)
        found = self._feed.take(record)
        if found is not None and found[1]:
            self._sink.add(*found)
        return record

    def close(self) -> None:
        super().close()
        self._sink.close()


def metrics_writer(path: Path, report_to: str, name: str, group: str) -> MetricsWriter:
    """The node's metrics writer: ``metrics.jsonl`` at ``path``, and the scalars to ``report_to`` unless none.

    ``name`` and ``group`` name a W&B run (the node and its swarm); TensorBoard's files go beside ``path``.
    """
    sink = open_sink(report_to, path.parent, name, group)
    if sink is None:
        return MetricsWriter(path)
    logger.info("reporting per-round scalars to %s", report_to)
    return ReportingWriter(path, sink)
