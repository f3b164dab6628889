"""Dial-backs: the verdict by majority, the server's bounds, and a real dial on loopback."""

from __future__ import annotations

import asyncio
import socket

from swarm import reach
from swarm.reach import DialBack, DialBackServer, DialStatus, Reachability, Verdict, encode_request, verdict

UP, DOWN, NO = DialStatus.REACHABLE, DialStatus.UNREACHABLE, DialStatus.REFUSED


def test_the_verdict_is_the_majority_of_the_peers_that_dialled() -> None:
    nat = verdict([DialBack(DOWN, "203.0.114.100"), DialBack(DOWN, "203.0.114.100"), None], ["10.20.0.10"])
    assert nat == Verdict(Reachability.NAT, "203.0.114.100", 2)
    public = verdict([DialBack(UP, "203.0.114.10")] * 2 + [DialBack(DOWN, "203.0.114.10")], ["203.0.114.10"])
    assert public.reachability is Reachability.PUBLIC  # one liar among three does not flip it
    forwarded = verdict([DialBack(UP, "198.51.100.7")], ["192.168.1.5"])
    assert forwarded == Verdict(Reachability.FORWARDED, "198.51.100.7", 1)
    assert verdict([DialBack(UP, "1.2.3.4"), DialBack(DOWN, "1.2.3.4")], []).reachability is Reachability.UNKNOWN
    assert verdict([DialBack(NO, ""), None], ["10.0.0.1"]) == Verdict(Reachability.UNKNOWN, None, 0)
    # a neighbour in the same home reaches it across the LAN; the peer outside does not: behind NAT
    home = verdict([DialBack(UP, "10.20.0.10"), DialBack(DOWN, "203.0.114.100")], ["10.20.0.10"])
    assert home == Verdict(Reachability.NAT, "203.0.114.100", 1)
    lab = verdict([DialBack(UP, "127.0.0.1")], ["127.0.0.1"])  # a swarm on one machine: only private views
    assert lab.reachability is Reachability.PUBLIC


def test_the_server_dials_each_asking_ip_at_most_once_per_period_and_never_more_than_its_slots() -> None:
    now = [0.0]
    server = DialBackServer(lambda: now[0])
    assert all(server.admit("203.0.114.100") for _ in range(reach.PER_IP_DIALS))  # a home of a few nodes
    assert not server.admit("203.0.114.100")  # more keys from the same IP get nothing more
    now[0] += reach.PER_IP_S
    assert server.admit("203.0.114.100")
    assert not server.admit(None)  # a relayed or unparsable connection: no IP to dial
    server._busy = reach.MAX_DIALS_AT_ONCE
    assert not server.admit("203.0.114.101")


async def _ask_loopback(server: DialBackServer, port: int, remote: str) -> DialBack | None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.handle(remote, reader, writer)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
        w.write(encode_request(port))
        await w.drain()
        answer = await reach.read_answer(r, 5.0)
        w.close()
        return answer
    finally:
        srv.close()


def test_a_real_dial_back_finds_a_listener_and_misses_a_closed_port_at_the_connections_ip() -> None:
    dialled: list[tuple[str, int]] = []

    async def spy(ip: str, port: int, timeout: float) -> bool:
        dialled.append((ip, port))
        return await reach.tcp_dial(ip, port, timeout)

    listener = socket.create_server(("127.0.0.1", 0))
    open_port = listener.getsockname()[1]
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    now = [0.0]
    server = DialBackServer(lambda: now[0], dial=spy)
    try:
        up = asyncio.run(_ask_loopback(server, open_port, "/ip4/127.0.0.1/tcp/5555"))
        down = asyncio.run(_ask_loopback(server, closed_port, "/ip4/127.0.0.1/tcp/5555"))
        for _ in range(reach.PER_IP_DIALS - 2):
            asyncio.run(_ask_loopback(server, open_port, "/ip4/127.0.0.1/tcp/5555"))
        refused = asyncio.run(_ask_loopback(server, open_port, "/ip4/127.0.0.1/tcp/5555"))
    finally:
        listener.close()
    assert up == DialBack(UP, "127.0.0.1") and down == DialBack(DOWN, "127.0.0.1")
    assert refused == DialBack(NO, "127.0.0.1")  # asked too often within the period
    assert dialled[:2] == [("127.0.0.1", open_port), ("127.0.0.1", closed_port)]  # only the connection's own IP
    assert len(dialled) == reach.PER_IP_DIALS
