"""Fixtures for swarm tests: exchange nodes in their own processes (see workers.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # for exchange_worker and workers (tests are not a package)

from exchange_worker import make_batch  # noqa: E402
from workers import WorkerProc, start_workers  # noqa: E402


@pytest.fixture(scope="module")
def swarm4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProc]]:
    """Four exchange nodes in separate processes, joined through the first."""
    workers = start_workers(tmp_path_factory.mktemp("swarm4"), 4)
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()


@pytest.fixture
def batch_factory() -> Callable[..., Any]:
    return make_batch
