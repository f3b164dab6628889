"""The dashboard in a real headless Chromium against a running ``swarm-node local`` swarm.

Checks that the figures appear and update without reloading, that /metrics
speaks Prometheus, and saves a screenshot to ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.observe.metrics import read_events
from tests.integration.browser import INSTALL_HINT, dump_dom, find_chromium, screenshot
from tests.procs import PYTHON, REPO, Procs, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

ARTIFACT = REPO / "test-artifacts" / "dashboard.png"


@pytest.fixture
def local_swarm(procs: Procs) -> Iterator[tuple[str, Path]]:
    """``swarm-node local`` with 2 nodes and the dashboard on a free port; yields (url, log dir)."""
    log_dir = procs.root / "runs"
    cmd = [PYTHON, "-m", "node", "local", "--nodes", "2", "--rounds", "1000000", "--local", "2"]
    cmd += ["--generations", "4", "--seed", "1", "--log-dir", str(log_dir), "--dashboard-port", "0"]
    cmd += ["--models", "tiny-s", "--sync-every", "3"]  # one architecture: the outer sync has a partner
    local = procs.start("local", cmd)
    try:
        wait_for(lambda: "nodes up" in local.output(), 120, "the local swarm", poll=0.25, watch=[local])
        url = re.search(r"dashboard at (http://\S+)", local.output())
        assert url, local.output()
        yield url.group(1), log_dir
    finally:
        local.send(signal.SIGINT)  # local stops its nodes (SIGTERM, then SIGKILL of their groups)
        procs.reap(settle=40.0)  # then SIGTERM, SIGKILL of its group if it has not left by then


def _figure(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m, f"#{element_id} missing from the page"
    return m.group(1)


def _rounds_in_files(log_dir: Path) -> int:
    return sum(len(list(read_events(p, "round"))) for p in log_dir.glob("*/metrics.jsonl"))


def _commits_in_files(log_dir: Path) -> int:
    return sum(sum(1 for e in read_events(p, "sync") if e.get("committed")) for p in log_dir.glob("*/metrics.jsonl"))


def test_dashboard_in_chromium(local_swarm: tuple[str, Path]) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    url, log_dir = local_swarm
    wait_for(lambda: _rounds_in_files(log_dir) >= 6, 60, "a few rounds")

    first = dump_dom(binary, url)
    assert _figure(first, "t-nodes").endswith("/ 2"), "both nodes listed"
    assert len(re.findall(r'<tr data-peer="', first)) == 2
    assert re.search(r'<path d="M[\d. ML]+"', first), "reward curves drawn"
    assert re.search(r'data-k="reward">\d\.\d{3}<', first), "a reward figure per node"
    assert "live, updated" in _figure(first, "updated")
    rounds_before = int(_figure(first, "t-rounds"))
    assert rounds_before > 0

    wait_for(lambda: _rounds_in_files(log_dir) >= rounds_before + 6, 60, "more rounds")
    wait_for(lambda: _commits_in_files(log_dir) >= 2, 120, "an outer sync committed by both nodes")
    second = dump_dom(binary, url)
    assert int(_figure(second, "t-rounds")) > rounds_before, "the figures update"
    assert re.search(r'data-k="memory">\d+ / \d+<', second), "each node's memory: node / DHT and p2pd"
    assert re.search(r'<tr data-publisher="\w+">', second), "the peers table lists the other node"
    assert re.search(r'data-k="sync">[1-9]\d* / ', second), "the outer sync's commits"
    last = re.findall(r'data-k="last_sync"[^>]*>([^<]*)<', second)  # the cell has a title: catch-ups, suspects
    assert any(re.match(r"[a-z ]+(\([^)]*\))?, \d+ peers, [\d.]+ s, ", x) for x in last), last

    metrics = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    assert "# TYPE swarm_node_round gauge" in metrics
    assert len(re.findall(r'^swarm_node_resident_memory_bytes\{.*process="node"\} \d+$', metrics, re.M)) == 2
    assert len(re.findall(r"^swarm_node_round\{peer=\"\w+\",model=\"[\w-]+\"\} \d+$", metrics, re.M)) == 2

    png = screenshot(binary, url, ARTIFACT)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000, "a real screenshot"
    print(f"screenshot saved to {png}")
