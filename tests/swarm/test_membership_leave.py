"""Leaving after a Ctrl-C to the process group: p2pd has stopped first, and the DHT process is stopped quietly."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig

pytestmark = pytest.mark.network


def test_a_dht_whose_p2pd_stopped_first_is_stopped_at_once_and_quietly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    m = Membership(load_or_create(tmp_path / "a.key"), MembershipConfig(host="127.0.0.1", address_book=False)).start()
    assert m.dht is not None and m.dht.pid is not None
    dht = psutil.Process(m.dht.pid)
    daemons = [p for p in dht.children(recursive=True) if "p2pd" in p.name()]
    assert daemons, "the DHT process runs p2pd"
    for d in daemons:
        d.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C does to every process of the group
    psutil.wait_procs(daemons, timeout=10)
    t0 = time.monotonic()
    m.shutdown()
    took = time.monotonic() - t0
    assert not dht.is_running() or dht.status() == psutil.STATUS_ZOMBIE
    # hivemind's own shutdown would wait its grace (3 s) for a DHT that cannot leave without its daemon
    assert took < 2.5, f"shutdown took {took:.1f}s"
    assert "hard way" not in capfd.readouterr().err
    print(f"left in {took:.2f}s with p2pd already gone")
