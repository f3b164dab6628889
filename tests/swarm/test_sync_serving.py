"""State downloads within a budget (swarm.sync.serving), and SyncService serving them to stalled readers.

No network: the service's handler runs on in-memory streams whose reader can stall, as a stranger that
asks for the state and never reads does. The live flood is tests/swarm/test_sync_attacks_state_flood.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import torch

from protocol import codec
from swarm.sync import OuterSyncConfig
from swarm.sync.allreduce import Snapshot, SyncService
from swarm.sync.catchup import CatchUpper
from swarm.sync.config import SyncAborted
from swarm.sync.dhtio import SyncRecords
from swarm.sync.records import StateRecord
from swarm.sync.serving import MAX_HELD_STATES, ServeBudget, ServeRefusal, SharedStates
from swarm.sync.tensors import from_bytes, state_hash
from swarm.sync.wire import check_ok, read_header

# ---- the budget ---------------------------------------------------------------------------------------------


def test_one_download_per_peer_and_at_most_limit_in_all_each_refusal_counted_by_reason() -> None:
    budget = ServeBudget(3)
    assert [budget.take(p) for p in "abc"] == [None, None, None]
    assert budget.take("a") is ServeRefusal.PEER_BUSY  # checked first: one peer never learns the others' load
    assert budget.take("d") is ServeRefusal.BUSY
    assert budget.take("e") is ServeRefusal.BUSY
    assert budget.refusals == {ServeRefusal.PEER_BUSY: 1, ServeRefusal.BUSY: 2}
    assert budget.active == 3


def test_a_released_slot_serves_the_next_ask() -> None:
    budget = ServeBudget(1)
    assert budget.take("a") is None
    assert budget.take("b") is ServeRefusal.BUSY
    budget.release("a")
    assert budget.active == 0
    assert budget.take("b") is None and budget.take("a") is ServeRefusal.BUSY
    budget.release("b")
    budget.release("b")  # a release too many frees nothing it did not take
    assert budget.active == 0 and budget.take("a") is None


@pytest.mark.parametrize("limit", [0, -1])
def test_a_budget_of_no_downloads_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ServeBudget(limit)
    with pytest.raises(ValueError, match="max_state_serves=0; use at least 1"):
        OuterSyncConfig(max_state_serves=0)


# ---- one shared copy per state ------------------------------------------------------------------------------


def _builder(built: list[str]) -> Any:
    def build(key: str) -> Any:
        async def run() -> memoryview:
            built.append(key)
            await asyncio.sleep(0)
            return memoryview(key.encode())

        return run

    return build


def test_concurrent_downloads_of_one_state_share_one_build() -> None:
    async def main() -> None:
        built: list[str] = []
        states, build = SharedStates(), _builder(built)
        held = [states.hold("s1", build("s1")) for _ in range(10)]
        assert all(h is held[0] for h in held) and held[0] is not None
        assert bytes(await held[0]) == b"s1" and built == ["s1"] and states.builds == 1
        for _ in range(9):
            states.let_go("s1", current="s1")
        assert len(states) == 1
        states.let_go("s1", current="s1")
        assert len(states) == 1  # the current state stays for the next ask
        assert states.hold("s1", build("s1")) is held[0] and built == ["s1"]

    asyncio.run(main())


def test_at_most_the_current_and_one_older_state_are_held() -> None:
    async def main() -> None:
        built: list[str] = []
        states, build = SharedStates(), _builder(built)
        assert states.hold("s1", build("s1")) is not None
        assert states.hold("s2", build("s2")) is not None  # the state changed while s1 is served
        assert MAX_HELD_STATES == 2 and states.hold("s3", build("s3")) is None  # both still in use
        states.let_go("s1", current="s3")  # s1's last download is over and it is not current: it goes
        assert len(states) == 1
        assert states.hold("s3", build("s3")) is not None
        states.let_go("s2", current="s3")
        states.let_go("s3", current="s3")
        assert len(states) == 1
        assert states.hold("s4", build("s4")) is not None  # s3 idle and no longer current: dropped for s4
        assert len(states) == 1 and states.builds == 4

    asyncio.run(main())


def test_a_failed_build_is_not_kept_for_the_next_ask() -> None:
    async def main() -> None:
        async def broken() -> memoryview:
            raise RuntimeError("out of memory")

        states = SharedStates()
        held = states.hold("s1", broken)
        assert held is not None
        with pytest.raises(RuntimeError):
            await held
        states.let_go("s1", current="s1")
        assert len(states) == 0

    asyncio.run(main())


# ---- the service, on in-memory streams ----------------------------------------------------------------------


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class _Writer:
    """A stream writer whose reader takes ``window`` bytes, then stalls (or reads everything: ``window`` None).

    Counts what is written; keeps the bytes only for a reader that reads (a stalled one's are not looked at).
    """

    def __init__(self, window: int | None) -> None:
        self.window, self.written, self.data = window, 0, bytearray()
        self.transport = _Transport()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self.window is None or len(self.data) < 4096:
            self.data += bytes(data)

    async def drain(self) -> None:
        if self.window is not None and self.written > self.window:
            await asyncio.Event().wait()  # the reader never reads again

    def close(self) -> None:
        self.closed = True

    async def reply(self) -> dict[str, Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(bytes(self.data))
        reader.feed_eof()
        return await read_header(reader, 1.0)


def _ask() -> asyncio.StreamReader:
    head = codec.pack({"op": "state", "size": 0})
    reader = asyncio.StreamReader()
    reader.feed_data(len(head).to_bytes(4, "big") + head)
    return reader


async def _serve(service: SyncService, peer: str, writer: _Writer) -> None:
    """One ask for the state from ``peer``, answered on ``writer``."""
    await service._handle(peer, _ask(), cast(asyncio.StreamWriter, writer))


def _service(snap: list[Snapshot], serves: int, deadline: float) -> SyncService:
    streams: Any = None  # serving needs no network: the handler is called directly
    return SyncService(
        streams, "test.sync", "me", 5.0, lambda: snap[0], max_state_serves=serves, state_deadline=deadline
    )


def _snap(n: int, value: float) -> Snapshot:
    anchor, momentum = torch.full((n,), value), torch.full((n,), -value)
    return Snapshot(1, state_hash(anchor, momentum), anchor, momentum)


def test_stalled_readers_take_only_the_budget_share_one_copy_and_free_their_slots_at_the_deadline() -> None:
    """Ten strangers that never read: three are served, seven refused at once; the slots free at the deadline."""

    async def main() -> None:
        snap = [_snap(300_000, 1.5)]  # 2.4 MB of state: several 1 MiB chunks
        service = _service(snap, serves=3, deadline=0.5)
        stalled = [_Writer(window=256 * 1024) for _ in range(10)]
        tasks = [asyncio.ensure_future(_serve(service, f"p{i}", w)) for i, w in enumerate(stalled)]
        await asyncio.sleep(0.2)
        refused = [w for w in stalled if w.closed]
        assert len(refused) == 7, [w.written for w in stalled]
        for w in refused:
            reply = await w.reply()
            assert reply["ok"] is False and "state downloads at their limit" in reply["error"], reply
        assert service.serve_refusals == {ServeRefusal.BUSY: 7}
        assert service.state_builds == 1  # one copy for all three downloads
        await asyncio.wait_for(asyncio.gather(*tasks), 2.0)  # each cut off at its deadline
        served = [w for w in stalled if w not in refused]
        assert all(w.transport.aborted for w in served)
        reader = _Writer(window=None)  # an honest reader now gets the whole state
        await asyncio.wait_for(_serve(service, "honest", reader), 2.0)
        reply = await reader.reply()
        check_ok(reply)
        head = 4 + int.from_bytes(reader.data[:4], "big")
        payload = bytes(reader.data[head:])
        n = snap[0].anchor.numel()
        assert len(payload) == reply["size"] == 8 * n
        assert torch.equal(from_bytes(payload[: 4 * n], n), snap[0].anchor)
        assert torch.equal(from_bytes(payload[4 * n :], n), snap[0].momentum)
        assert service.state_builds == 1  # the state did not change: its bytes were kept for the next ask

    asyncio.run(main())


def test_one_peer_gets_one_download_at_a_time() -> None:
    async def main() -> None:
        service = _service([_snap(300_000, 0.5)], serves=8, deadline=0.3)
        first, second = _Writer(window=1024), _Writer(window=1024)
        task = asyncio.ensure_future(_serve(service, "mallory", first))
        await asyncio.sleep(0.05)
        await _serve(service, "mallory", second)
        assert "a state download to this peer is under way" in (await second.reply())["error"]
        assert service.serve_refusals == {ServeRefusal.PEER_BUSY: 1}
        await asyncio.wait_for(task, 2.0)

    asyncio.run(main())


def test_a_new_state_while_two_older_ones_are_still_served_is_refused() -> None:
    async def main() -> None:
        snap = [_snap(300_000, 1.0)]
        service = _service(snap, serves=8, deadline=0.4)
        tasks = []
        for i in range(3):
            if i:
                snap[0] = _snap(300_000, 1.0 + i)  # the group commits while the older state is served
            writer = _Writer(window=1024)
            tasks.append(asyncio.ensure_future(_serve(service, f"p{i}", writer)))
            await asyncio.sleep(0.05)
        assert writer.closed and "older states are still being served" in (await writer.reply())["error"]
        assert service.serve_refusals == {ServeRefusal.STATES_HELD: 1} and service.state_builds == 2
        await asyncio.wait_for(asyncio.gather(*tasks), 2.0)

    asyncio.run(main())


# ---- the asking side: a refusal is a failed donor -----------------------------------------------------------


class _Records:
    def __init__(self, states: dict[str, StateRecord]) -> None:
        self.states = states

    def refresh_state(self, revision: int, state_hash: str, origin: str = "") -> bool:
        return True

    def read_states(self) -> dict[str, StateRecord]:
        return self.states


def test_a_donor_that_refuses_for_its_budget_is_passed_for_the_next_one() -> None:
    own = torch.ones(10)
    snap = Snapshot(3, state_hash(own, torch.zeros(10)), own, torch.zeros(10))
    got = Snapshot(4, state_hash(own + 0.01, torch.zeros(10)), own + 0.01, torch.zeros(10))
    states = {p: StateRecord(p, "0123456789abcdef", 4, got.state_hash, 1.0) for p in ("b", "c")}
    asked: list[str] = []

    def fetch(donor: str, n: int, timeout: float) -> Snapshot:
        asked.append(donor)
        if len(asked) == 1:  # what fetch_state raises on the budget's refusal frame
            check_ok({"ok": False, "error": f"state not served: {ServeRefusal.BUSY.value}"})
        return got

    records = cast(SyncRecords, _Records(states))
    upper = CatchUpper("a", records, fetch, OuterSyncConfig(), frozenset({"b", "c"}), lambda *_: None)
    assert upper.catch_up(snap, lambda: False) is got
    assert sorted(asked) == ["b", "c"]
    with pytest.raises(SyncAborted, match="state downloads at their limit"):
        check_ok({"ok": False, "error": f"state not served: {ServeRefusal.BUSY.value}"})
