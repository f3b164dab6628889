"""Fixtures shared by every test folder, and the rule that keeps the fast tier honest.

A test that starts a process (a hivemind DHT, p2pd, a node, the CLI, a browser) is marked
``process``: ``make test-fast`` leaves those out. Every other test runs with process starts
forbidden, so a test that starts one without the mark fails with the fix in its message instead
of slowing the fast tier down unnoticed.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.procs import Procs

PROCESS_MARK = "process"
PROCESS_MARKS = (PROCESS_MARK, "network")  # a network test starts hivemind's processes
PROCESS_FIXTURES = frozenset({"procs", "fault_swarm", "swarm4", "swarm", "zygote"})
"""Fixtures that start processes: a test that uses one is marked without saying so itself."""


class UnmarkedProcessStart(RuntimeError):
    """A test without the ``process`` mark tried to start a process."""


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise UnmarkedProcessStart("this test starts a process: mark it @pytest.mark.process (make test-fast skips those)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what starts processes: everything under tests/integration, and every user of a process fixture."""
    for item in items:
        integration = f"{os.sep}tests{os.sep}integration{os.sep}" in str(item.path)
        if integration or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(PROCESS_MARK)


@pytest.fixture(autouse=True)
def _no_unmarked_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if any(request.node.get_closest_marker(m) is not None for m in PROCESS_MARKS):
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Processes this test starts (logs in ``tmp_path``); every group is reaped at teardown (tests/procs.py)."""
    with Procs(tmp_path) as p:
        yield p
