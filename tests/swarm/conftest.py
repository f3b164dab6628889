"""Fixtures for swarm tests: exchange workers (workers.py) and sync peers (tests/faults.py), via tests/procs.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults import FaultSwarm
from tests.procs import Procs
from tests.swarm.exchange_worker import make_batch
from tests.swarm.workers import WorkerProc, start_workers


@pytest.fixture(scope="module")
def swarm4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProc]]:
    """Four exchange nodes in separate processes, joined through the first."""
    procs = Procs(tmp_path_factory.mktemp("swarm4"))
    try:
        workers = start_workers(procs, 4)
        yield workers
        for w in workers:
            w.quit()
    finally:
        procs.reap(settle=8.0, grace=2.0)


@pytest.fixture(name="fault_swarm")
def fault_swarm_fixture(procs: Procs) -> Iterator[FaultSwarm]:
    """A :class:`FaultSwarm` in the test's ``tmp_path``; every peer is stopped (or killed) afterwards."""
    swarm = FaultSwarm(procs)
    try:
        yield swarm
    finally:
        swarm.close()


@pytest.fixture
def batch_factory() -> Callable[..., Any]:
    return make_batch
