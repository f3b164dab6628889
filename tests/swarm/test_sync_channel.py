"""``both``: two transfers on one connection, and what is left when one of them fails."""

from __future__ import annotations

import asyncio
import socket

import pytest

from swarm.sync.channel import both


async def _read_forever(sock: socket.socket) -> None:
    buf = bytearray(16)
    while True:
        await asyncio.wait_for(asyncio.get_running_loop().sock_recv_into(sock, buf), 30.0)


async def _fail_soon() -> None:
    await asyncio.sleep(0.01)
    raise ConnectionResetError("the other side went away")


def test_when_one_fails_the_other_has_ended_before_both_returns() -> None:
    """A caller closes the socket as soon as ``both`` returns: the cancelled read must be off the fd by
    then, or a new connection that reuses the fd number finds it still registered."""

    async def run() -> None:
        a, b = socket.socketpair()
        a.setblocking(False)
        reader = asyncio.ensure_future(_read_forever(a))
        with pytest.raises(ConnectionResetError):
            await both(_fail_soon(), reader)
        assert reader.done() and reader.cancelled()
        loop = asyncio.get_running_loop()
        assert a.fileno() not in loop._selector.get_map()  # type: ignore[attr-defined]
        a.close()
        b.close()

    asyncio.run(run())


def test_both_returns_the_first_result_when_both_succeed() -> None:
    async def one() -> int:
        await asyncio.sleep(0)
        return 1

    async def two() -> None:
        await asyncio.sleep(0.01)

    assert asyncio.run(both(one(), two())) == 1
