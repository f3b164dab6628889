"""The reachability decision (pure) and the peer/round prefix of log lines."""

from __future__ import annotations

import logging

import pytest

from node.observe.logs import CONTEXT, ContextFilter
from node.observe.reach import reachability_advice, startup_reach
from swarm.reach import Reachability, Verdict

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
