from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.nodes import Swarm, swarm_fixture


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    yield from swarm_fixture(tmp_path)
