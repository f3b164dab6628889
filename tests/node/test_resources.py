"""The memory and CPU figures of a round: a process and its descendants, read live."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from node.observe.resources import sample

HOLDER = "import time; x = bytearray(80 * 1024 * 1024); print('ready', flush=True); time.sleep(60)"
# a parent that starts the 80 MB holder and waits: its descendants are exactly that child (the test
# process itself may have other children from other tests)
PARENT = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=sys.stdout); c.wait()"
)


def test_this_process_alone() -> None:
    r = sample()
    assert r.rss_mb == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.2)
    assert r.cpu_s > 0


@pytest.mark.process
def test_a_child_holding_80_mb_is_counted_and_a_gone_one_is_not() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
        proc = psutil.Process(parent.pid)
        with_child = sample(proc)
        assert with_child.children_rss_mb >= 80
        assert with_child.rss_mb < 80  # the child's memory is not the parent's
        for child in proc.children(recursive=True):
            child.kill()
        deadline = time.monotonic() + 10
        while sample(proc).children_rss_mb >= 80 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sample(proc).children_rss_mb < 80
    finally:
        parent.kill()
        parent.wait(timeout=10)
