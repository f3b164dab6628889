"""Dashboard figures from metrics files, the JSON API and the Prometheus text."""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from node.dashboard import prometheus
from node.dashboard.data import PEERS_KEPT, MetricsTail, NodeView, SwarmView
from node.dashboard.page import PAGE
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


def write_eval(w: MetricsWriter, peer: str, rnd: int, accuracy: float, /, **extra: Any) -> None:
    fields: dict[str, Any] = {
        "time": 10.0 + rnd, "peer": peer, "round": rnd, "accuracy": accuracy, "sample_reward": accuracy / 2,
        "per_family": {"max": accuracy, "sum": 1.0 - accuracy}, "items": 128, "eval_s": 1.5, "complete": True,
    }  # fmt: skip
    w.write("eval", **{**fields, **extra})


SAMPLE = re.compile(r'^[a-z_]+\{(?:[a-z_]+="[^"\\]*",?)+\} -?\d+(?:\.\d+)?(?:e[-+]\d+)?$')


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
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or SAMPLE.match(line), line
    assert 'swarm_node_round{peer="aaaaaa",model="tiny-s"} 4' in text
    assert 'swarm_node_external_rejected_total{peer="bbbbbb",model="tiny-s",reason="prompt mismatch"} 4' in text
    assert 'swarm_node_rollout_bytes_total{peer="aaaaaa",model="tiny-s",direction="in"} 400' in text


def test_heldout_start_and_latest_per_node_and_swarm_mean(tmp_path: Path) -> None:
    a = write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 0)
    write_eval(a, "peer-aaaaaa", 0, 0.25)  # before training: the start of "start -> now"
    for r in range(1, 5):
        a.write("round", time=10.0 + r, peer="peer-aaaaaa", round=r, reward_mean=0.1)
        if r % 2 == 0:
            write_eval(a, "peer-aaaaaa", r, 0.25 + r / 10, complete=r < 4)
    a.close()
    b = write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 2)
    write_eval(b, "peer-bbbbbb", 0, 0.5, sample_reward=None)
    b.close()
    write_node(tmp_path / "cccccc" / "metrics.jsonl", "peer-cccccc", 2).close()  # evaluation off

    snap = swarm_view(tmp_path, "t").snapshot(now=20.0)
    heldout = {n["peer"]: n["heldout"] for n in snap["nodes"]}
    assert heldout["aaaaaa"] == {
        "accuracy": 0.65, "round": 4, "sample_reward": 0.325, "age_s": 6.0, "per_family": {"max": 0.65, "sum": 0.35},
        "items": 128, "complete": False, "first_accuracy": 0.25, "first_round": 0,
        "series": [[0, 0.25], [2, 0.45], [4, 0.65]],
    }  # fmt: skip
    assert heldout["bbbbbb"]["accuracy"] == heldout["bbbbbb"]["first_accuracy"] == 0.5
    assert heldout["bbbbbb"]["sample_reward"] is None and heldout["cccccc"] is None
    totals = snap["totals"]
    assert totals["heldout_nodes"] == 2  # the node that never evaluated does not pull the mean down
    assert totals["heldout_accuracy"] == pytest.approx((0.65 + 0.5) / 2)
    assert totals["heldout_first_accuracy"] == pytest.approx((0.25 + 0.5) / 2)


def test_heldout_prometheus_gauges(tmp_path: Path) -> None:
    w = write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 3)
    write_eval(w, "peer-aaaaaa", 0, 0.25)
    write_eval(w, "peer-aaaaaa", 3, 0.5, per_family={"max": 0.75, 'we"ird': 0.25})
    w.close()
    write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 3).close()
    text = prometheus.render(swarm_view(tmp_path, "t").snapshot())
    for line in text.splitlines():
        assert line.startswith("#") or SAMPLE.match(line) or 'family="we\\"ird"' in line, line
    for name in ("accuracy", "sample_reward", "round", "family_accuracy"):
        assert f"# TYPE swarm_node_heldout_{name} gauge" in text and f"# HELP swarm_node_heldout_{name} " in text
    assert 'swarm_node_heldout_accuracy{peer="aaaaaa",model="tiny-s"} 0.5' in text.splitlines()
    assert 'swarm_node_heldout_sample_reward{peer="aaaaaa",model="tiny-s"} 0.25' in text.splitlines()
    assert 'swarm_node_heldout_round{peer="aaaaaa",model="tiny-s"} 3' in text.splitlines()
    assert 'swarm_node_heldout_family_accuracy{peer="aaaaaa",model="tiny-s",family="max"} 0.75' in text
    assert 'swarm_node_heldout_family_accuracy{peer="aaaaaa",model="tiny-s",family="we\\"ird"} 0.25' in text
    assert not [line for line in text.splitlines() if line.startswith("swarm_node_heldout") and "bbbbbb" in line]


def test_node_without_eval_has_no_heldout_figures(tmp_path: Path) -> None:
    write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 2).close()
    snap = swarm_view(tmp_path, "t").snapshot(now=5.0)
    assert snap["nodes"][0]["heldout"] is None
    assert snap["totals"]["heldout_accuracy"] is None and snap["totals"]["heldout_nodes"] == 0
    text = prometheus.render(snap)
    assert "# TYPE swarm_node_heldout_accuracy gauge" in text
    assert not [line for line in text.splitlines() if line.startswith("swarm_node_heldout")]


BAD_EVALS = [
    {"accuracy": "0.5"},
    {"accuracy": None},
    {"accuracy": 1.5},
    {"accuracy": True},
    {"accuracy": [0.5]},
    {"round": "3"},
    {"round": -1},
    {"round": 2.5},
    {"round": None},
]


@pytest.mark.parametrize("bad", BAD_EVALS, ids=[str(b) for b in BAD_EVALS])
def test_malformed_eval_event_is_skipped_not_a_crash(tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "aaaaaa" / "metrics.jsonl"
    w = write_node(path, "peer-aaaaaa", 2)
    write_eval(w, "peer-aaaaaa", 0, 0.25)
    write_eval(w, "peer-aaaaaa", 2, 0.75, **bad)
    w.close()
    heldout = SwarmView("t", lambda: [path]).snapshot(now=20.0)["nodes"][0]["heldout"]
    assert heldout["accuracy"] == heldout["first_accuracy"] == 0.25 and heldout["round"] == 0


def test_missing_fields_and_raw_bad_lines_do_not_break_the_view(tmp_path: Path) -> None:
    path = tmp_path / "aaaaaa" / "metrics.jsonl"
    write_node(path, "peer-aaaaaa", 1).close()
    with open(path, "a") as f:
        f.write('{"event":"eval","time":3,"peer":"peer-aaaaaa","round":1}\n')  # no accuracy
        f.write('{"event":"eval","time":3,"peer":"peer-aaaaaa","accuracy":0.5}\n')  # no round
        f.write('{"event":"eval","time":3,"round":1,"accuracy":NaN}\n')  # Python's json reads NaN
        f.write('{"event":"eval","time":"x","round":1.0,"accuracy":0.5,"sample_reward":"high",')
        f.write('"per_family":{"max":"good","sum":0.5,"mul":2},"items":"many","complete":"yes"}\n')
    snap = SwarmView("t", lambda: [path]).snapshot(now=20.0)
    heldout = snap["nodes"][0]["heldout"]
    assert heldout["accuracy"] == 0.5 and heldout["round"] == 1  # the one usable event; bad extras read as unknown
    assert heldout["sample_reward"] is None and heldout["per_family"] == {"sum": 0.5}
    assert heldout["items"] is None and heldout["complete"] is None and heldout["age_s"] is None
    assert "swarm_node_heldout_sample_reward{" not in prometheus.render(snap)


def test_page_has_heldout_column_card_and_panel() -> None:
    for marker in (">held-out</th>", 'id="t-heldout"', 'id="heldout-chart"', 'id="heldout-families"'):
        assert marker in PAGE, marker
    assert "heldoutCells(n.heldout)" in PAGE and "drawHeldout(d.nodes)" in PAGE


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


def test_memory_and_cpu_per_node_in_json_page_and_prometheus(tmp_path: Path) -> None:
    w = write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 2)
    w.write("round", time=3.0, peer="peer-aaaaaa", round=3, rss_mb=512.5, children_rss_mb=96.0, cpu_s=42.25,
            children_cpu_s=7.0, sample_tokens_per_s=150.5, train_tokens_per_s=900.0)  # fmt: skip
    w.close()
    write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 2).close()  # an older node: no figures
    snap = swarm_view(tmp_path, "t").snapshot()
    a, b = sorted(snap["nodes"], key=lambda n: n["peer"])
    assert (a["rss_mb"], a["children_rss_mb"], a["cpu_s"], a["children_cpu_s"]) == (512.5, 96.0, 42.25, 7.0)
    assert (b["rss_mb"], b["cpu_s"]) == (None, None)
    assert (a["sample_tokens_per_s"], a["train_tokens_per_s"], b["sample_tokens_per_s"]) == (150.5, 900.0, None)
    lines = prometheus.render(snap).splitlines()
    assert 'swarm_node_tokens_per_second{peer="aaaaaa",model="tiny-s",phase="sample"} 150.5' in lines
    assert (
        f'swarm_node_resident_memory_bytes{{peer="aaaaaa",model="tiny-s",process="node"}} {512 * 2**20 + 2**19}'
        in lines
    )
    assert f'swarm_node_resident_memory_bytes{{peer="aaaaaa",model="tiny-s",process="helpers"}} {96 * 2**20}' in lines
    assert 'swarm_node_cpu_seconds_total{peer="aaaaaa",model="tiny-s",process="node"} 42.25' in lines
    assert not [line for line in lines if line.startswith("swarm_node_resident") and "bbbbbb" in line]
    assert "memory MB" in PAGE and 'cell("memory"' in PAGE and "tokens per second of its sampling" in PAGE


def test_peers_table_folds_batches_groups_and_refusals_per_publisher(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "aaaaaa" / "metrics.jsonl")
    w.write("start", time=1.0, peer="peer-aaaaaa", model="tiny-s")
    w.write("round", time=2.0, peer="peer-aaaaaa", round=1, batches_from={"pub111": 2},
            external_peers={"12D3pub111": 3}, refused_from={"evil99": 5})  # fmt: skip
    w.write("round", time=3.0, peer="peer-aaaaaa", round=2, batches_from={"pub111": 1, "pub222": 1},
            external_peers={"12D3pub111": 1}, refused_from="not a dict")  # fmt: skip
    w.close()
    (node,) = swarm_view(tmp_path, "t").snapshot(now=4.0)["nodes"]
    rows = {r["peer"]: r for r in node["peers"]}
    assert [r["peer"] for r in node["peers"]][-1] == "evil99"  # seen longest ago: last
    assert (rows["pub111"]["batches"], rows["pub111"]["used"], rows["pub111"]["round"]) == (3, 4, 2)
    assert (rows["evil99"]["refused"], rows["evil99"]["used"], rows["evil99"]["age_s"]) == (5, 0, 2.0)
    assert rows["pub222"]["batches"] == 1 and 'id="peers"' in PAGE and "drawPeers(d.nodes)" in PAGE


def test_a_flood_of_publisher_keys_does_not_grow_the_peers_view() -> None:
    view = NodeView()
    for r in range(1, 21):
        view.add({"event": "round", "time": 1.0 + r, "round": r, "refused_from": {f"k{r}-{i}": 1 for i in range(64)}})
    assert len(view.peers) == PEERS_KEPT and "k20-63" in view.peers and "k1-0" not in view.peers
    shown = view.peers_json(now=30.0)
    assert len(shown) == 32 and shown[0]["peer"] == "k20-63"


def test_last_sync_shows_result_cause_group_duration_suspects_and_age(tmp_path: Path) -> None:
    w = write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 2)
    w.write("sync", time=5.0, peer="peer-aaaaaa", revision=3, state_hash="ab" * 32, committed=True, group_size=3,
            reason="committed", cause="", sync_s=1.25, caught_up=True, suspect_peers={})  # fmt: skip
    w.write("sync", time=8.0, peer="peer-aaaaaa", revision=3, state_hash="ab" * 32, committed=False, group_size=2,
            reason="aborted", cause="member lost before voting", sync_s=4.5,
            suspect_peers={"12D3evil42": "clipped"})  # fmt: skip
    w.close()
    (node,) = swarm_view(tmp_path, "t").snapshot(now=10.0)["nodes"]
    assert node["last_sync"] == {
        "time": 8.0, "result": "aborted", "cause": "member lost before voting", "group_size": 2, "sync_s": 4.5,
        "suspects": {"evil42": "clipped"}, "age_s": 2.0,
    }  # fmt: skip
    assert node["catch_ups"] == 1 and "syncCell(n)" in PAGE
    write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 1).close()
    assert [n["last_sync"] for n in swarm_view(tmp_path, "t").snapshot(now=10.0)["nodes"] if n["peer"] == "bbbbbb"] == [
        None
    ]


def test_node_entry_gives_join_command_uptime_and_trend(tmp_path: Path) -> None:
    addrs = ["/ip4/127.0.0.1/tcp/4001/p2p/peer-aaaaaa", "/ip4/192.168.1.7/tcp/4001/p2p/peer-aaaaaa"]
    w = MetricsWriter(tmp_path / "aaaaaa" / "metrics.jsonl")
    w.write("start", time=100.0, peer="peer-aaaaaa", model="tiny-s", multiaddrs=addrs)
    for r in range(1, 41):
        w.write("round", time=100.0 + r, peer="peer-aaaaaa", round=r, reward_mean=r / 40)
    write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 3).close()  # no address: client mode
    w.close()
    snap = swarm_view(tmp_path, "t").snapshot(now=200.0)
    a, b = snap["nodes"]
    assert a["join"] == "swarm-node join --peer /ip4/192.168.1.7/tcp/4001/p2p/peer-aaaaaa"  # reachable first
    assert b["join"] is None and snap["totals"]["join"] == a["join"]
    assert a["uptime_s"] == 100.0
    assert a["trend"]["trend"] == "learning" and a["trend"]["source"] == "reward"
    assert a["trend"]["text"].startswith("learning: reward 0.14 -> 0.89 over 39 rounds")
    assert b["trend"]["trend"] == "too early to tell"
    assert snap["totals"]["verdict"] == "1 of 2 nodes learning, 1 too early to tell"
    assert snap["version"] == importlib.metadata.version("swarm-node")
    lines = prometheus.render(snap).splitlines()
    assert 'swarm_node_uptime_seconds{peer="aaaaaa",model="tiny-s"} 100' in lines
    assert 'swarm_node_learning{peer="aaaaaa",model="tiny-s",source="reward"} 1' in lines
    assert not [line for line in lines if line.startswith('swarm_node_learning{peer="bbbbbb"')]  # too early
    assert f'swarm_node_info{{peer="bbbbbb",model="tiny-s",version="{snap["version"]}"}} 1' in lines


def test_uptime_and_join_end_when_the_node_leaves(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "aaaaaa" / "metrics.jsonl")
    w.write("start", time=1.0, peer="peer-aaaaaa", model="tiny-s", multiaddrs=["/ip4/127.0.0.1/tcp/1/p2p/x"])
    w.write("summary", time=5.0, peer="peer-aaaaaa")
    w.close()
    snap = swarm_view(tmp_path, "t").snapshot(now=9.0)
    assert snap["nodes"][0]["uptime_s"] is None and snap["totals"]["join"] is None  # nobody to join through


def test_heldout_trend_uses_the_evaluations_and_their_question_count(tmp_path: Path) -> None:
    w = write_node(tmp_path / "aaaaaa" / "metrics.jsonl", "peer-aaaaaa", 30)
    write_eval(w, "peer-aaaaaa", 0, 0.40, items=400)
    write_eval(w, "peer-aaaaaa", 30, 0.55, items=400)
    w.close()
    trend = SwarmView("t", lambda: [tmp_path / "aaaaaa" / "metrics.jsonl"]).snapshot(now=50.0)["nodes"][0]["trend"]
    assert (trend["source"], trend["trend"], trend["start"], trend["end"]) == ("held-out", "learning", 0.40, 0.55)
    w = write_node(tmp_path / "bbbbbb" / "metrics.jsonl", "peer-bbbbbb", 30)
    write_eval(w, "peer-bbbbbb", 0, 0.40, items=20)  # the same change on 20 questions is noise
    write_eval(w, "peer-bbbbbb", 30, 0.55, items=20)
    w.close()
    trend = SwarmView("t", lambda: [tmp_path / "bbbbbb" / "metrics.jsonl"]).snapshot(now=50.0)["nodes"][0]["trend"]
    assert (trend["source"], trend["trend"]) == ("held-out", "flat")


def test_page_shows_verdict_join_uptime_version_and_explains_no_signal() -> None:
    for marker in ('id="verdict"', 'id="join"', 'id="uptime"', 'id="version"', 'id="nodes-wrap"', "trendCell(n,"):
        assert marker in PAGE, marker
    assert 'cell("uptime",duration(n.uptime_s))' in PAGE
    assert "accepts no connections (client mode)" in PAGE  # a node nobody can dial says so
    assert re.search(r'<th title="groups whose completions all scored the same reward[^"]*">no signal</th>', PAGE)
    assert 'id="no-signal-help"' in PAGE and "advantage" in PAGE
    assert "--eval-every N" in PAGE  # the held-out hint names the flag that turns it on
