"""The dashboard in a real headless Chromium against a running ``swarm-node local`` swarm.

Checks that the figures appear and update without reloading, that /metrics
speaks Prometheus, and saves a screenshot to ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.observe.metrics import read_events
from tests.integration.browser import INSTALL_HINT, dump_dom, find_chromium, screenshot
from tests.integration.nodes import wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "test-artifacts" / "dashboard.png"


@pytest.fixture
def local_swarm(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``swarm-node local`` with 2 nodes and the dashboard on a free port; yields (url, log dir)."""
    log_dir, out = tmp_path / "runs", tmp_path / "local.log"
    cmd = [sys.executable, "-m", "node", "local", "--nodes", "2", "--rounds", "1000000", "--local", "2"]
    cmd += ["--generations", "4", "--seed", "1", "--log-dir", str(log_dir), "--dashboard-port", "0"]
    with open(out, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: "nodes up" in out.read_text() or proc.poll() is not None, 120, "the local swarm")
        assert proc.poll() is None, out.read_text()
        url = re.search(r"dashboard at (http://\S+)", out.read_text())
        assert url, out.read_text()
        yield url.group(1), log_dir
    finally:
        proc.send_signal(signal.SIGINT)  # local stops its nodes (SIGTERM, then SIGKILL of their groups)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _figure(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m, f"#{element_id} missing from the page"
    return m.group(1)


def _rounds_in_files(log_dir: Path) -> int:
    return sum(len(list(read_events(p, "round"))) for p in log_dir.glob("*/metrics.jsonl"))


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
    second = dump_dom(binary, url)
    assert int(_figure(second, "t-rounds")) > rounds_before, "the figures update"

    metrics = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    assert "# TYPE swarm_node_round gauge" in metrics
    assert len(re.findall(r"^swarm_node_round\{peer=\"\w+\",model=\"[\w-]+\"\} \d+$", metrics, re.M)) == 2

    png = screenshot(binary, url, ARTIFACT)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000, "a real screenshot"
    print(f"screenshot saved to {png}")
