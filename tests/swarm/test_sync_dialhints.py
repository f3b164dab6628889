"""Addresses published with state records (swarm.sync.dialhints): what a record may carry and when it is dialled.

The real-process run that needs them (peers of two islands known to each other
only second-hand) is tests/swarm/test_sync_islands.py.
"""

from __future__ import annotations

import pytest

from protocol import SigningKey
from protocol.errors import MessageRejected
from swarm.sync.dialhints import (
    MAX_ADDR_CHARS,
    MAX_ADDRS,
    MAX_CONNECTS,
    RECONNECT_S,
    DialHints,
    transport_addrs,
    valid_addr,
)
from swarm.sync.records import JOIN_KIND, STATE_KIND, JoinRecord, StateRecord, open_record, seal_record
from tests.fakes import FakeClock

FP = "0123456789abcdef"


def test_a_node_publishes_its_transport_addresses_without_its_peer_id() -> None:
    given = [f"/ip4/10.0.0.{i}/tcp/31337/p2p/12D3KooWX" for i in range(6)] + ["/ip4/10.0.0.0/tcp/31337"]
    assert transport_addrs(given) == tuple(f"/ip4/10.0.0.{i}/tcp/31337" for i in range(MAX_ADDRS))
    assert not valid_addr("/ip4/1.2.3.4/tcp/5/p2p/12D3KooWX") and not valid_addr("ip4/1.2.3.4")
    assert not valid_addr("/" + "a" * 200) and not valid_addr("/ip4/\n") and valid_addr("/dns/example.org/tcp/5")


def _open(addrs: list[str]) -> StateRecord:
    key = SigningKey.generate()
    record = StateRecord(key.peer_id, FP, 3, "e" * 64, 1.0, "", tuple(addrs))
    return open_record(seal_record(STATE_KIND, record, key), STATE_KIND, StateRecord.from_wire)


def test_a_state_record_carries_at_most_a_few_well_formed_addresses() -> None:
    assert _open(["/ip4/127.0.0.1/tcp/5"]).addrs == ("/ip4/127.0.0.1/tcp/5",)
    for bad in ([f"/ip4/127.0.0.1/tcp/{i}" for i in range(MAX_ADDRS + 1)], ["/ip4/1.2.3.4/tcp/5/p2p/x"], ["x" * 10]):
        with pytest.raises(MessageRejected, match="addrs"):
            _open(bad)


def test_a_peers_addresses_are_handed_out_for_a_connect_at_most_once_per_reconnect_period() -> None:
    clock = FakeClock(100.0)
    hints = DialHints(clock)
    assert hints.take("b") == ()  # unknown
    hints.learn({"b": StateRecord("b", FP, 3, "e" * 64, 1.0, "", ("/ip4/127.0.0.1/tcp/5",))})
    hints.learn({"c": StateRecord("c", FP, 3, "e" * 64, 1.0)})  # published none: nothing to try
    assert hints.take("b") == ("/ip4/127.0.0.1/tcp/5",) and hints.take("c") == ()
    assert hints.take("b") == ()  # a record naming an unreachable address costs one dial per period
    clock.now += RECONNECT_S
    assert hints.take("b") == ("/ip4/127.0.0.1/tcp/5",)


def test_ghost_records_naming_a_third_party_get_it_dialled_once_per_period_not_once_per_key() -> None:
    """Round-3 finding: 1,024 fresh keys' join records, each naming one victim's address (and their own
    sets of four), had every member connect per key and round. Now one dial per address per period, and
    MAX_CONNECTS connects per period in all."""
    clock = FakeClock(100.0)
    hints = DialHints(clock)
    victim = "/ip4/127.0.0.9/tcp/80"
    ghosts = {f"g{i}": StateRecord(f"g{i}", FP, 3, "e" * 64, 1.0, "", (victim,)) for i in range(1024)}
    hints.learn(ghosts)
    handed = [hints.take(p) for p in ghosts]
    assert sum(victim in h for h in handed) == 1  # with the rule off: 1,024
    spread = {
        f"s{i}": StateRecord(f"s{i}", FP, 3, "e" * 64, 1.0, "", (f"/ip4/127.0.1.{i % 250}/tcp/{i}",))
        for i in range(1024)
    }
    hints.learn(spread)
    assert sum(bool(hints.take(p)) for p in spread) == MAX_CONNECTS - 1  # every connect of the period counts
    clock.now += RECONNECT_S
    honest = StateRecord("h", FP, 3, "e" * 64, 1.0, "", ("/ip4/127.0.0.2/tcp/5",))
    hints.learn({"h": honest})
    assert hints.take("h") == ("/ip4/127.0.0.2/tcp/5",)  # the next period has room again


def test_a_join_record_names_its_signers_addresses_too() -> None:
    """The joiners a member pings may be known to it only through their join records."""
    key = SigningKey.generate()
    addrs = ("/ip4/127.0.0.1/tcp/5",)
    record = JoinRecord(key.peer_id, FP, 3, "e" * 64, 10.0, 10.0, False, 0, addrs)
    assert open_record(seal_record(JOIN_KIND, record, key), JOIN_KIND, JoinRecord.from_wire).addrs == addrs
    bad = JoinRecord(key.peer_id, FP, 3, "e" * 64, 10.0, 10.0, False, 0, ("/ip4/1.2.3.4/tcp/5/p2p/x",))
    with pytest.raises(MessageRejected, match="addrs"):
        open_record(seal_record(JOIN_KIND, bad, key), JOIN_KIND, JoinRecord.from_wire)


def test_records_with_the_most_and_longest_addresses_still_fit_the_record_size_limit() -> None:
    key = SigningKey.generate()
    longest = tuple("/dns/" + str(i) * (MAX_ADDR_CHARS - 15) + "/tcp/65535" for i in range(MAX_ADDRS))
    assert all(valid_addr(a) and len(a) == MAX_ADDR_CHARS for a in longest)
    state = StateRecord(key.peer_id, FP, 2**61, "e" * 64, 1.0e9, "f" * 64, longest)
    assert open_record(seal_record(STATE_KIND, state, key), STATE_KIND, StateRecord.from_wire) == state
    join = JoinRecord(key.peer_id, FP, 2**61, "e" * 64, 1.0e9, 1.0e9, True, 1024, longest)
    assert open_record(seal_record(JOIN_KIND, join, key), JOIN_KIND, JoinRecord.from_wire) == join
