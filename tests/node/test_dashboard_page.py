"""The dashboard page in headless Chromium at 1280 px, over metrics files of four nodes (no swarm needed).

The page marks its nodes table ``data-fits="true"`` when every column is on
screen; the figures and the new lines (verdict, join command, uptime,
version, sparklines) are read back from the rendered DOM.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.dashboard.data import version
from node.dashboard.server import Dashboard, DashboardConfig, swarm_view
from node.observe.metrics import MetricsWriter
from tests.integration.browser import FLAGS, INSTALL_HINT, find_chromium

pytestmark = pytest.mark.process

MODELS = ("tiny-s", "tiny-m", "tiny-l", "tiny-gpt2")


def _write_swarm(root: Path, now: float) -> None:
    """Four nodes 300 rounds in, with the widest figures a node shows: MB of traffic, syncs, evaluations."""
    for i, model in enumerate(MODELS):
        peer = f"12D3KooWTestPeer{i}abc{i}{i}{i}"
        w = MetricsWriter(root / peer[-6:] / "metrics.jsonl")
        addrs = [] if i == 3 else [f"/ip4/127.0.0.1/tcp/4100{i}/p2p/{peer}"]  # the last one in client mode
        w.write("start", time=now - 400, peer=peer, model=model, multiaddrs=addrs)
        for r in range(1, 301):
            w.write(
                "round", time=now - 300 + r, peer=peer, round=r, reward_mean=r / 300 * (i + 1) / 4 + (r % 3) / 20,
                external_reward_mean=0.512, external_groups=2, accepted_groups=3, external_rejected=2,
                rejected_reasons={"prompt mismatch": 2}, fetch_failed=1, dropped_zero_adv=1, peers_seen=3,
                bytes_in=123_456 * r, bytes_out=65_432 * r, round_s=0.52, rss_mb=612.3, children_rss_mb=88.1,
                sample_tokens_per_s=1234.5, train_tokens_per_s=56789.1,
                cpu_s=1321.0, children_cpu_s=112.0, batches_from={"aaaaaa": 2}, external_peers={"aaaaaa": 2},
            )  # fmt: skip
            if r % 100 == 0:
                w.write("eval", time=now - 300 + r, peer=peer, round=r, accuracy=0.2 + r / 1000 * (i + 1),
                        sample_reward=0.3, per_family={"max": 0.5, "min": 0.4}, items=326, complete=True)  # fmt: skip
            if r % 30 == 0:
                w.write("sync", time=now - 300 + r, revision=r // 30, state_hash="ab" * 32, committed=True,
                        reason="committed", group_size=3, sync_s=12.4, bytes_sent=1000)  # fmt: skip
        w.close()


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[str]:
    import time

    _write_swarm(tmp_path, time.time())
    dash = Dashboard(swarm_view(tmp_path, "local swarm (4 nodes)"), DashboardConfig(port=0))
    try:
        yield dash.start()
    finally:
        dash.close()


def _dom(binary: str, url: str, width: int) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900"]
        cmd += ["--virtual-time-budget=4000", "--dump-dom", url]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "<html" in res.stdout, res.stderr[-2000:]
    return res.stdout


def _text(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m, f"#{element_id} missing from the page"
    return m.group(1)


def test_page_fits_1280_px_and_shows_trend_join_uptime_version(dashboard: str) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    dom = _dom(binary, dashboard, 1280)
    assert 'id="nodes-wrap" data-fits="true"' in dom, "every column of the nodes table is on a 1280 px screen"
    assert _text(dom, "verdict") == "4 of 4 nodes learning"
    assert _text(dom, "join").startswith("swarm-node join --peer /ip4/127.0.0.1/tcp/4100")
    assert _text(dom, "uptime") == "7m"
    assert _text(dom, "version") == f"swarm-node {version()}"
    assert len(re.findall(r'<tr data-peer="', dom)) == 4, "one nodes-table row per node"
    assert len(re.findall(r'<tr data-heldout-peer="', dom)) == 4, "and one per node in the held-out panel"
    assert len(re.findall(r'<svg class="spark"[^>]*><path d="M[\d. ML]+"', dom)) == 4, "a sparkline per node"
    assert len(re.findall(r'data-k="trend" title="learning: held-out ', dom)) == 4
    client = re.search(r'<td data-k="peer" title="([^"]*)">abc333<', dom)
    assert client and "accepts no connections" in client.group(1)
