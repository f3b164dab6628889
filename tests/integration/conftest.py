"""Fixtures for integration tests: node processes through tests/procs.py (see nodes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.nodes import Swarm, Zygote
from tests.procs import Procs


@pytest.fixture
def swarm(procs: Procs) -> Iterator[Swarm]:
    """Nodes started with ``python -m node``; they leave on SIGTERM at teardown (SIGKILL after a grace period)."""
    s = Swarm(procs)
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture
def zygote(procs: Procs) -> Iterator[Zygote]:
    """A fork server for node processes; at teardown every node it forked and the server are SIGKILLed."""
    z = Zygote(procs)
    try:
        yield z
    finally:
        procs.reap(grace=0.0)
