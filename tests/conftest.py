"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Processes this test starts (logs in ``tmp_path``); every group is reaped at teardown (tests/procs.py)."""
    with Procs(tmp_path) as p:
        yield p
