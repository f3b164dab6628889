"""A sweep's run in parts: what each part cost, and whether an interrupted run can go on.

A real model's run lasts longer than a working session (SmolLM2-135M on a 2-core CPU: ~80 minutes
per swarm), so a run stopped part-way continues from its nodes' last checkpoints instead of starting
over. Every node writes one on leave and every ``checkpoint_every`` rounds; a run goes on only when
every node has one, since a node that started fresh beside resumed partners would train a different
number of rounds. Each part's wall time and machine load add up in ``load.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOAD = "load.json"
"""Per run: the machine's 1-minute load average before it and during it (the issue's protocol records load)."""

CHECKPOINT_FILES = ("checkpoint.pt", "checkpoint.prev.pt")
"""A node's checkpoint and the one before it (:mod:`node.core.checkpoint`; named here to keep torch out)."""


@dataclass(frozen=True)
class RunLoad:
    """The 1-minute load average when a run started, its mean and maximum while it ran, and the CPUs.

    ``samples``, ``wall_s`` and ``parts`` add up over the parts of a run that was interrupted and resumed.
    """

    start: float
    mean: float
    max: float
    cpus: int
    samples: int = 0
    wall_s: float = 0.0
    parts: int = 1

    @classmethod
    def of(cls, samples: list[float], wall_s: float = 0.0) -> RunLoad:
        """From load samples, the first taken before the run started."""
        during = samples[1:] or samples
        return cls(
            round(samples[0], 2), round(sum(during) / len(during), 2), round(max(during), 2), os.cpu_count() or 1,
            len(during), round(wall_s, 1),
        )  # fmt: skip

    def then(self, later: RunLoad) -> RunLoad:
        """This part followed by ``later``: the first start, the mean over every sample, the highest load."""
        n = self.samples + later.samples
        mean = (self.mean * self.samples + later.mean * later.samples) / n if n else later.mean
        return RunLoad(
            self.start, round(mean, 2), max(self.max, later.max), self.cpus, n, round(self.wall_s + later.wall_s, 1),
            self.parts + later.parts,
        )  # fmt: skip


def read_load(run_dir: Path) -> RunLoad | None:
    """The run's recorded load, or None if it has none (or an unreadable one)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        return RunLoad(**json.loads((run_dir / LOAD).read_text()))
    return None


def resumable(run_dir: Path, nodes: int) -> bool:
    """Whether an unfinished run's ``nodes`` nodes each left a checkpoint to go on from."""
    dirs = [p.parent for p in run_dir.glob("*/metrics.jsonl")]
    return len(dirs) == nodes and all(any((d / f).is_file() for f in CHECKPOINT_FILES) for d in dirs)


def load_line(out: Path, run_names: list[str]) -> str:
    """One sentence on the machine's load over the finished runs, or "" if none recorded it."""
    loads = [x for x in (read_load(out / name) for name in run_names) if x is not None]
    if not loads:
        return ""
    means = sorted(x.mean for x in loads)
    resumed = sum(1 for x in loads if x.parts > 1)
    text = (
        f"Machine load (1-minute average, {loads[0].cpus} CPUs), sampled twice a second during each of {len(loads)} "
        f"runs: run means {means[0]:.1f}-{means[-1]:.1f} (median {means[len(means) // 2]:.1f}), highest "
        f"{max(x.max for x in loads):.1f}; per run in `<run>/{LOAD}`."
    )
    if resumed:
        text += f" {resumed} of them ran in parts (stopped, then resumed from their nodes' checkpoints)."
    return text + "\n\n"
