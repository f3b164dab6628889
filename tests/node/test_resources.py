"""The memory and CPU figures of a round: this process and its children, read live."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from node.observe.resources import sample

CHILD = "import time; x = bytearray(80 * 1024 * 1024); print('ready', flush=True); time.sleep(60)"


def test_this_process_alone() -> None:
    r = sample()
    assert r.rss_mb == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.2)
    assert r.cpu_s > 0


@pytest.mark.process
def test_a_child_holding_80_mb_is_counted_and_a_gone_one_is_not() -> None:
    before = sample()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with_child = sample()
        assert with_child.children_rss_mb >= before.children_rss_mb + 80
        assert with_child.rss_mb < with_child.children_rss_mb  # the child's memory is not this process's
    finally:
        child.kill()
        child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while sample().children_rss_mb >= before.children_rss_mb + 80 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sample().children_rss_mb < before.children_rss_mb + 80
