"""Dashboard figures from metrics files, the JSON API and the Prometheus text."""

from __future__ import annotations

import http.client
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from node.dashboard import prometheus
from node.dashboard.data import MetricsTail, SwarmView
from node.dashboard.server import Dashboard, DashboardConfig, host_allowed, swarm_view
from node.observe.metrics import MetricsWriter


def write_node(path: Path, peer: str, rounds: int, start_round: int = 0) -> MetricsWriter:
    w = MetricsWriter(path)
    w.write("start", time=1.0, peer=peer, model="tiny-s")
    for r in range(start_round + 1, start_round + rounds + 1):
        w.write(
            "round", time=float(r), peer=peer, round=r, reward_mean=r / 10, external_reward_mean=0.5,
            external_groups=2, accepted_groups=3, external_rejected=2, rejected_reasons={"prompt mismatch": 1},
            fetch_failed=1, reward_mismatches=0, dropped_zero_adv=1, peers_seen=2, bytes_in=100 * r,
            bytes_out=50 * r, round_s=0.5,
        )  # fmt: skip
    return w


def test_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"event":"a"}\n{"event":')
    tail = MetricsTail(path)
    assert [e["event"] for e in tail.poll()] == ["a"]
    with open(path, "a") as f:
        f.write('"b"}\n')
    assert [e["event"] for e in tail.poll()] == ["b"]
    assert tail.poll() == []


def test_view_folds_rounds_syncs_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "aaaaaa" / "metrics.jsonl"
    w = write_node(path, "peer-aaaaaa", 3)
    w.write("sync", time=4.0, revision=1, state_hash="ab" * 32, committed=True, reason="committed", bytes_sent=10)
    w.write("sync", time=5.0, revision=1, state_hash="ab" * 32, committed=False, reason="no partner", bytes_sent=0)
    w.write("sync", time=5.5, revision=1, committed=False, reason="aborted", cause="commit timeout")
    w.close()
    write_node(path, "peer-aaaaaa", 2, start_round=3).close()  # a restart: byte counters start again
    view = SwarmView("t", lambda: [path])
    node: dict[str, Any] = view.snapshot(now=6.0)["nodes"][0]
    assert node["round"] == 5 and node["status"] == "running" and node["revision"] == 1
    assert node["sync_committed"] == 1 and node["sync_no_partner"] == 1  # nobody to sync with is not a failure
    assert node["sync_aborted"] == {"commit timeout": 1}
    assert node["rejected"] == {"prompt mismatch": 5, "other": 5}
    assert node["bytes_in"] == 300 + 500 and node["accepted"] == 15
    assert [p[0] for p in node["series"]] == [1, 2, 3, 4, 5]
    assert view.snapshot(now=1000.0)["nodes"][0]["status"] == "silent"


def test_prometheus_text_is_well_formed(tmp_path: Path) -> None:
    for peer in ("peer-aaaaaa", "peer-bbbbbb"):
        write_node(tmp_path / peer[-6:] / "metrics.jsonl", peer, 4).close()
    text = prometheus.render(swarm_view(tmp_path, "t").snapshot())
    sample = re.compile(r'^[a-z_]+\{(?:[a-z_]+="[^"\\]*",?)+\} -?\d+(?:\.\d+)?(?:e[-+]\d+)?$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert 'swarm_node_round{peer="aaaaaa",model="tiny-s"} 4' in text
    assert 'swarm_node_external_rejected_total{peer="bbbbbb",model="tiny-s",reason="prompt mismatch"} 4' in text
    assert 'swarm_node_rollout_bytes_total{peer="aaaaaa",model="tiny-s",direction="in"} 400' in text


def test_server_serves_page_json_and_metrics(tmp_path: Path) -> None:
    write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 2).close()
    dash = Dashboard(swarm_view(tmp_path, "t"), DashboardConfig(port=0))
    url = dash.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "api/summary" in page and "<script" in page and "http" not in page.split("<script", 1)[1]
        summary = json.loads(urllib.request.urlopen(url + "api/summary", timeout=10).read())
        assert summary["totals"]["nodes"] == 1
        with urllib.request.urlopen(url + "metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        dash.close()


def _status(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_loopback_dashboard_refuses_foreign_host_headers(tmp_path: Path) -> None:
    """DNS rebinding: a foreign page that resolves its name to 127.0.0.1 must not read the metrics."""
    write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 2).close()
    dash = Dashboard(swarm_view(tmp_path, "t"), DashboardConfig(port=0))
    dash.start()
    port = int(dash.url.rstrip("/").rsplit(":", 1)[1])
    try:
        for path in ("/", "/api/summary", "/metrics"):
            assert _status(port, path, "attacker.example") == 421
            assert _status(port, path, f"attacker.example:{port}") == 421
        for good in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", f"[::1]:{port}", "127.5.6.7"):
            assert _status(port, "/api/summary", good) == 200, good
        assert dash.refused_hosts == 6
    finally:
        dash.close()


def test_host_check_only_on_a_loopback_bind() -> None:
    assert host_allowed("my-box.lan:8080", "0.0.0.0")
    assert not host_allowed("my-box.lan:8080", "127.0.0.1")
    assert not host_allowed(None, "127.0.0.1") and not host_allowed("", "::1")
    assert not host_allowed("127.0.0.1.attacker.example", "127.0.0.1")


def test_dashboard_config_validation() -> None:
    with pytest.raises(ValueError, match="--dashboard-host"):
        DashboardConfig(port=0, host="localhost:80")
    with pytest.raises(ValueError, match="--dashboard-port"):
        DashboardConfig(port=70000)
