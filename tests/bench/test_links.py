"""The rate-limited links of bench/links.py: peers reach each other at the rate, and no namespace outlives its run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench import links
from tests.procs import PYTHON

pytestmark = [pytest.mark.process, pytest.mark.skipif(links.unavailable() is not None, reason="needs root and ip/tc")]

SINK = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(30); n = 0; t = time.monotonic()
while (b := c.recv(1 << 20)):
    n += len(b)
print(n * 8 / 1e6 / (time.monotonic() - t), flush=True)
"""
SOURCE = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
for _ in range(int(sys.argv[3])):
    s.sendall(b"x" * (1 << 20))
"""


def _ours() -> set[str]:
    return {line.split()[0] for line in links._run("ip", "netns", "list").splitlines() if line.startswith(links.PREFIX)}


def test_two_peers_reach_each_other_at_the_rate_and_every_namespace_goes_at_close() -> None:
    before = _ours()
    with links.Links(2, 40.0) as made:
        sink = subprocess.Popen([*made.prefix(1), PYTHON, "-c", SINK, made.host(1)], stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout is not None
            port = sink.stdout.readline().strip()
            cmd = [*made.prefix(0), PYTHON, "-c", SOURCE, made.host(1), port, "10"]
            subprocess.run(cmd, check=True, timeout=60)
            mbit = float(sink.stdout.readline())
        finally:
            sink.kill()
            sink.wait(10)
        assert len(_ours() - before) == 3  # two peers and the switch
    assert 30 < mbit < 44, f"{mbit:.1f} Mbit/s over a 40 Mbit/s link"
    assert _ours() == before


def test_namespaces_of_a_killed_run_are_swept_by_the_next() -> None:
    code = "import time; from bench import links; links.Links(2, None); print('up', flush=True); time.sleep(60)"
    maker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert maker.stdout is not None and maker.stdout.readline().strip() == "up"
    left = {name for name in _ours() if name.startswith(f"{links.PREFIX}{maker.pid}-")}
    maker.kill()
    maker.wait(10)
    assert len(left) == 3 and left <= _ours()  # SIGKILL runs no clean-up
    deadline = time.monotonic() + 10
    while left & _ours() and time.monotonic() < deadline:
        links.sweep_stale()
    assert not left & _ours()
