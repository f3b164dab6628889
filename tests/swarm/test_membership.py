"""Membership on real hivemind processes (127.0.0.1 only)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from swarm.errors import BootstrapFailed, PortInUse
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig, parse_peer_multiaddr

pytestmark = pytest.mark.network


def cfg(**kw: Any) -> MembershipConfig:
    return MembershipConfig(host="127.0.0.1", bootstrap_attempts=2, bootstrap_backoff_s=0.1, **kw)


def test_join_uses_our_identity_and_shuts_down_in_bounded_time(tmp_path: Path) -> None:
    a_id, b_id = load_or_create(tmp_path / "a.key"), load_or_create(tmp_path / "b.key")
    with Membership(a_id, cfg()) as a:
        addrs = a.visible_multiaddrs()
        assert addrs and all(a_id.peer_id in m for m in addrs)
        b = Membership(b_id, cfg(initial_peers=tuple(addrs))).start()
        try:
            assert b.dht is not None and b.dht.peer_id.to_base58() == b_id.peer_id
        finally:
            t0 = time.monotonic()
            b.shutdown()
            # the documented bound: loop, P2P replica and DHT process each stop within shutdown_timeout_s
            assert time.monotonic() - t0 < 3 * b.cfg.shutdown_timeout_s
        assert b.dht is None


def test_unreachable_initial_peer_fails_with_a_plain_message(tmp_path: Path) -> None:
    ghost = load_or_create(tmp_path / "ghost.key").peer_id
    m = Membership(load_or_create(tmp_path / "a.key"), cfg(initial_peers=(f"/ip4/127.0.0.1/tcp/1/p2p/{ghost}",)))
    t0 = time.monotonic()
    with pytest.raises(BootstrapFailed, match="none of the initial peers answered after 2 tries"):
        m.start()
    # the documented bound: each try within startup_timeout_s, backoff doubling between tries
    c = m.cfg
    backoff = sum(c.bootstrap_backoff_s * 2**i for i in range(c.bootstrap_attempts - 1))
    assert time.monotonic() - t0 < c.bootstrap_attempts * c.startup_timeout_s + backoff


def test_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        m = Membership(load_or_create(tmp_path / "a.key"), cfg(port=port))
        with pytest.raises(PortInUse, match=f"port {port}"):
            m.start()


def test_multiaddr_validation() -> None:
    with pytest.raises(ValueError, match="not a multiaddr"):
        parse_peer_multiaddr("hello")
    with pytest.raises(ValueError, match="/p2p/"):
        parse_peer_multiaddr("/ip4/127.0.0.1/tcp/5")
    with pytest.raises(ValueError, match="port 70000"):
        MembershipConfig(port=70000)
