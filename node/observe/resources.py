"""What a node costs its machine: resident memory and CPU time of the node and of its helpers.

Out-of-memory reports from volunteers are only useful with the figure beside them, so every
round carries it. The node process is the trainer; its children are the hivemind DHT process
and p2pd (with ``local``, each forked node's own helpers). Reading them takes well under a
millisecond per process through psutil; a helper that exits between listing and reading is
skipped, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

MB = 1024 * 1024


@dataclass(frozen=True)
class Resources:
    """Resident set sizes (MB) of this process and of all its descendants; CPU seconds of both, cumulative."""

    rss_mb: float
    children_rss_mb: float
    cpu_s: float
    children_cpu_s: float


def _cpu(times: Any) -> float:
    return float(times.user + times.system)


def sample(process: psutil.Process | None = None) -> Resources:
    """The current figures of ``process`` (this one by default) and its descendants."""
    me = process or psutil.Process()
    with me.oneshot():
        rss, cpu = me.memory_info().rss, _cpu(me.cpu_times())
    child_rss, child_cpu = 0, 0.0
    for child in me.children(recursive=True):
        try:
            with child.oneshot():
                child_rss += child.memory_info().rss
                child_cpu += _cpu(child.cpu_times())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return Resources(round(rss / MB, 1), round(child_rss / MB, 1), round(cpu, 3), round(child_cpu, 3))
