"""The reachability decision (pure) and the peer/round prefix of log lines."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from node.cli.serve import start_relay_watch
from node.observe.logs import CONTEXT, ContextFilter
from node.observe.reach import reachability_advice, relay_news, relayed_via, startup_reach
from swarm.reach import Reachability, Verdict
from tests.procs import poll_until

PRIVATE = ["/ip4/127.0.0.1/tcp/31337/p2p/X", "/ip4/192.168.1.20/tcp/31337/p2p/X"]


@pytest.mark.parametrize(
    "visible, announce, client, host, expect",
    [
        (PRIVATE, [], False, "0.0.0.0", "forward TCP port 31337"),
        (["/ip4/10.0.0.5/tcp/4000/p2p/X"], [], False, "0.0.0.0", "--announce /ip4/<public-ip>/tcp/4000"),
        (["/ip4/100.64.3.3/tcp/4000/p2p/X"], [], False, "0.0.0.0", "--client-mode"),  # carrier-grade NAT
        ([*PRIVATE, "/ip4/198.51.99.7/tcp/31337/p2p/X"], [], False, "0.0.0.0", None),  # a public address
        (PRIVATE, ["/ip4/198.51.99.7/tcp/31337"], False, "0.0.0.0", None),  # announced
        (PRIVATE, [], True, "0.0.0.0", None),  # client mode only dials out
        (["/ip4/127.0.0.1/tcp/5/p2p/X"], [], False, "127.0.0.1", None),  # deliberately local
        ([], [], False, "0.0.0.0", "no TCP/IPv4 listen address"),
    ],
)
def test_reachability_advice(
    visible: list[str], announce: list[str], client: bool, host: str, expect: str | None
) -> None:
    advice = reachability_advice(visible, announce, client, host)
    if expect is None:
        assert advice is None
    else:
        assert advice is not None and expect in advice


def test_log_lines_carry_peer_and_round() -> None:
    filt = ContextFilter()
    CONTEXT.peer, CONTEXT.round = "", 0
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    filt.filter(rec)
    assert rec.ctx == ""  # type: ignore[attr-defined]
    CONTEXT.peer, CONTEXT.round = "a1b2c3", 12
    try:
        filt.filter(rec)
        assert rec.ctx == "[a1b2c3 r=12] "  # type: ignore[attr-defined]
        tagged = logging.LogRecord("x", logging.INFO, __file__, 1, "[%s r=%d] sync", ("a1b2c3", 3), None)
        filt.filter(tagged)
        assert tagged.ctx == "", "a line that already names the peer is not prefixed twice"  # type: ignore[attr-defined]
    finally:
        CONTEXT.peer, CONTEXT.round = "", 0


def test_a_node_behind_nat_offers_the_peer_it_joined_never_its_private_address() -> None:
    addrs = ["/ip4/10.20.0.10/tcp/7100/p2p/me"]
    boot = "/ip4/203.0.114.10/tcp/7100/p2p/boot"
    join, note = startup_reach(Verdict(Reachability.NAT, "203.0.114.100", 2), addrs, [boot], "me")
    assert join == f"swarm-node join --peer {boot}" and "10.20.0.10" not in join
    assert note is not None and "behind NAT" in note and "203.0.114.100:7100" in note
    join, note = startup_reach(Verdict(Reachability.FORWARDED, "198.51.100.7", 1), addrs, [boot], "me")
    assert join == "swarm-node join --peer /ip4/198.51.100.7/tcp/7100/p2p/me" and "--announce" in (note or "")
    join, note = startup_reach(Verdict(Reachability.UNKNOWN, None, 0), addrs, [boot], "me")
    assert join == f"swarm-node join --peer {addrs[0]}" and note is None  # no answer: the address advice speaks


class _Metrics:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def write(self, event: str, **fields: object) -> None:
        self.lines.append({"event": event, **fields})


class _Node:
    """What the relay watch reads of a node: its stop event, clock, id and metrics."""

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.metrics = _Metrics()
        self.peer_id = "12D3KooWnode"

    def clock(self) -> float:
        return 0.0


RELAYED = "/ip4/203.0.114.10/tcp/7100/p2p/12D3KooWrelay/p2p-circuit"


def test_a_natted_node_says_once_when_its_relay_slot_comes_and_stops_watching(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node, asked = _Node(), [[], [], ["/ip4/10.20.0.10/tcp/7100", RELAYED]]
    thread = start_relay_watch(node, lambda latest: asked.pop(0) if asked else [], poll_s=0.01)  # type: ignore[arg-type]
    thread.join(5)
    assert not thread.is_alive(), "the watch goes on after the relayed address came"
    out = capsys.readouterr().out
    assert out.count("relayed via /ip4/203.0.114.10/tcp/7100/p2p/12D3KooWrelay") == 1, out
    assert node.metrics.lines[-1]["relayed_via"] == "/ip4/203.0.114.10/tcp/7100/p2p/12D3KooWrelay"


def test_a_natted_node_warns_once_with_the_fix_when_no_relay_slot_comes(capsys: pytest.CaptureFixture[str]) -> None:
    node = _Node()
    thread = start_relay_watch(node, lambda latest: [], poll_s=0.01, warn_after_s=0.05)  # type: ignore[arg-type]
    assert poll_until(lambda: "no relay slot" in capsys.readouterr().out or None, 5)
    time.sleep(0.1)  # more polls past the bound: still one warning
    node.stop_event.set()
    thread.join(5)
    assert "no relay slot" not in capsys.readouterr().out
    assert [m["relayed_via"] for m in node.metrics.lines] == [""]


def test_relay_news_names_the_relay_and_warns_only_past_the_bound() -> None:
    assert relayed_via(["/ip4/10.0.0.1/tcp/1", RELAYED]) == RELAYED.removesuffix("/p2p-circuit")
    assert relay_news([], 299.0, False, 300.0) is None
    warning = relay_news([], 300.0, False, 300.0)
    assert warning is not None and "--announce" in warning
    assert relay_news([], 400.0, True, 300.0) is None
