"""Two homes behind NAT and one public peer, on the WAN testbed (bench/wan.py): real nodes, real NAT.

Neither home can open a connection into the other (each router masquerades and forwards nothing in).
With the node's defaults, each NATed node says within 10 s of start that it is behind NAT and offers the
public peer's address to join through, never its own private one; each trains on the *other* home's
groups, fetched through the public peer (``fetched_via_relay``), which it could not fetch at all before
the relay; the two homes commit an outer sync together (through a pipe via the public peer); and every
node leaves on SIGTERM within 30 s. Access links run through the user-space link
emulator (5 ms each way), so its path is exercised too. Skips, saying why, where namespaces, nftables or
ethtool are not available (``make wan-deps``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from bench import bench_wan
from bench import wan as wanbed
from bench.linkemu import LinkShape
from bench.links import LinkError
from tests.procs import Procs, pid_alive, poll_until

pytestmark = [pytest.mark.network, pytest.mark.slow]

NODE_ARGS = ["--checkpoint-every", "0", "--eval-every", "0", "--sync-period", "10"]  # sync is opt-in; epochs meet
RELAY_WAIT_S = 150.0
SYNC_WAIT_S = 60.0
"""Bound on both homes' first commit in a group of all three (through the sync's pipes, swarm.sync.pipe:
5.4 s after start on the bench's pair scenario; through a libp2p circuit it could not commit at all)."""


def _events(run: bench_wan.NodeRun, kind: str) -> list[dict[str, Any]]:
    return [e for e in bench_wan.events(run) if e.get("event") == kind]


def _used(run: bench_wan.NodeRun, publisher: str) -> tuple[int, int]:
    """(groups of ``publisher`` trained on, payloads fetched through a relay) so far."""
    rounds = _events(run, "round")
    used = sum(int((r.get("external_peers") or {}).get(publisher, 0)) for r in rounds)
    relayed = max((int(r.get("fetched_via_relay") or 0) for r in rounds), default=0)
    return used, relayed


def _testbed(public: int, homes: list[int], shape: LinkShape | None) -> wanbed.Wan:
    """The testbed, or a skip naming why this machine cannot build it (no root, a tool or a kernel feature)."""
    why = wanbed.unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        return wanbed.Wan(public, homes, shape=shape)
    except LinkError as e:  # e.g. a kernel without NAT: the environment, not the code under test
        pytest.skip(f"the WAN testbed cannot be built here: {e}")


def test_two_homes_behind_nat_learn_from_each_other_through_the_public_peer(tmp_path: Path) -> None:
    with _testbed(1, [1, 1], LinkShape(5.0, 1.0, 0.0)) as bed, Procs(tmp_path) as procs:
        runs = bench_wan.start_nodes(bed, procs, tmp_path, NODE_ARGS)
        public, home_a, home_b = runs
        for home in (home_a, home_b):
            reach = poll_until(lambda h=home: _events(h, "reach") or None, 30)  # type: ignore[misc]
            assert reach, home.proc.log_tail()
            start = _events(home, "start")[0]
            assert reach[0]["reachability"] == "behind NAT", reach
            assert float(reach[0]["time"]) - float(start["time"]) <= 10.0
            log = (home.log_dir / "node.log").read_text()
            join = bench_wan._line_after(log, "Others can join with:")
            assert public.host.ip in join and home.host.ip not in join, join
            assert "behind NAT" in log

        def both_used() -> bool | None:
            a_of_b, a_relayed = _used(home_a, home_b.ready["peer"])
            b_of_a, b_relayed = _used(home_b, home_a.ready["peer"])
            return (a_of_b > 0 and b_of_a > 0 and a_relayed > 0 and b_relayed > 0) or None

        assert poll_until(both_used, RELAY_WAIT_S, poll=1.0), (
            f"home a used {_used(home_a, home_b.ready['peer'])}, home b {_used(home_b, home_a.ready['peer'])}\n"
            + home_a.proc.log_tail()
        )

        def commits(run: bench_wan.NodeRun) -> dict[tuple[int, str], int]:
            return {(e["revision"], e["state_hash"]): e["group_size"] for e in _events(run, "sync") if e["committed"]}

        def synced_across_homes() -> bool | None:
            """One round committed by both homes in one group (the two alone, or with the public peer): their
            parts crossed from home to home, through a pipe via the public peer."""
            a, b, pub = commits(home_a), commits(home_b), commits(public)
            return any(a[k] == 3 or k not in pub for k in a.keys() & b.keys()) or None

        assert poll_until(synced_across_homes, SYNC_WAIT_S, poll=1.0), home_a.proc.log_tail()
        t0 = time.monotonic()
        bench_wan.stop_nodes(runs)
        for run in runs:
            assert run.exit_code == 0 and run.exit_s is not None and run.exit_s <= 30.0, (run.host.name, run.exit_s)
            assert "Traceback" not in (run.log_dir / "node.log").read_text(), run.host.name
        print(json.dumps({r.host.name: r.exit_s for r in runs}), f"left in {time.monotonic() - t0:.1f} s")


def test_a_testbed_killed_with_sigkill_leaves_nothing_once_the_next_one_starts(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: the emulator dies with its maker, and the next testbed deletes the namespaces."""
    why = wanbed.unavailable()
    if why is not None:
        pytest.skip(why)
    ready = tmp_path / "ready"
    code = (
        "import sys, time; sys.path.insert(0, '.'); from bench import wan; from bench.linkemu import LinkShape\n"
        f"w = wan.Wan(1, [1], shape=LinkShape(1.0)); open({str(ready)!r}, 'w').write(str(w._emulator.pid))\n"
        "time.sleep(60)\n"
    )
    with Procs(tmp_path) as procs:
        maker = procs.start("maker", [sys.executable, "-c", code])
        assert poll_until(lambda: ready.exists() or None, 60), maker.log_tail()
        emulator = int(ready.read_text())
        mine = f"{wanbed.PREFIX}{maker.popen.pid}-"
        maker.send(signal.SIGKILL)
        maker.wait(10)
        assert poll_until(lambda: not pid_alive(emulator) or None, 10), "the emulator outlived its maker"
        assert any(n.startswith(mine) for n in _namespaces())
        scratch = list(Path(tempfile.gettempdir()).glob(f"{mine}*"))
        assert scratch, "the testbed's scratch folder is not named after its maker"
        with wanbed.Wan(1, []):
            assert not any(n.startswith(mine) for n in _namespaces())
            assert not any(p.exists() for p in scratch), "a killed testbed's scratch folder was left in /tmp"


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
