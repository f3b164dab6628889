"""One host's flood of its own valid state records under made-up keys, over real processes on 127.0.0.1 (issue 51).

Mallory is one live host with ONE key, her own. The owner rule (``swarm.dht_storage``, ``owners_only``) keeps
every record she sends, since each sits under her own subkey; so she makes up keys instead: a state record
for a new, made-up fingerprint every time (``state_key(swarm, fingerprint)``: one new DHT key each), created
110 s ahead (inside ``MAX_CLOCK_SKEW_S``) with the full 600 s lifetime, which a production node's validator
accepts. Her records outlive every honest one, and before the defence the 32 MiB storage budget, which
evicts the soonest-expiring entries first, evicted every honest record at every honest node: the join and
vote records of a round live ~36 s here, so no round found its group, and honest commits went 62/min -> 0.

Two defences: each honest replica charges what a store RPC brings to its sender, and a sender over its quota
(``dht_sender_entries``, ``dht_sender_bytes``) loses its own soonest-expiring entries, never anyone else's; and
a sender's entries past its rate (``swarm.dht_rate``: 100 a second, bursts of 1,000) are refused before any
signature is checked, so her flood's cost to a replica's CPU is bounded too (without the rate, at her full
~7,000 records a second, the replicas' signature checks cut the flood pair's commits per second to 0.41).

Paired run on one DHT, as ``tests/swarm/test_sync_attacks_flood.py`` (whose helpers it uses): the baseline
pair (swarm ``test-base``) runs a window while the flood pair and Mallory idle; it leaves; Mallory sends a
burst of records, more than the storage budget holds, then goes on as fast as she can; the flood pair runs
the same window from its first step under the flood.

Asserted: commits per inner step and per second under the flood >= 0.7 x the baseline's; at the end both
honest state records are still found in the DHT; the flood pair's replicas evicted Mallory's records for her
quota or refused them for her rate, and none by the total budget. Measured numbers are in SECURITY.md
("Outer sync").

Run as a module (``python -m tests.swarm.test_sync_attacks_owner_flood``) this file is Mallory's process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from hivemind.utils import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from protocol import SigningKey
from swarm.dht_storage import KEY_OVERHEAD_BYTES, StorageEvent, entry_bytes
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.sync import OuterSyncConfig
from swarm.sync.records import STATE_KIND, StateRecord, seal_record, state_key
from tests.faults import FaultSwarm, Peer, final_state, hashes_by_revision
from tests.procs import PYTHON, Reporter
from tests.swarm.test_sync_attacks_flood import (
    BASE_SWARM,
    START_S,
    STEPS,
    SWARM,
    WINDOW_S,
    _outcomes,
    _per_s,
    _per_step,
    _run_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.timeout(300)]

AHEAD_S = 110.0
"""How far ahead each record's ``created`` is: inside the protocol's clock-skew allowance."""
TTL_S = OuterSyncConfig().record_ttl_s
"""The DHT lifetime of every record from its ``created`` (600 s): the most the validator allows."""
BATCH = 250
"""Records per call into Mallory's DHT process (each signed there: the command pipe carries a few bytes)."""
IN_FLIGHT = 3
"""Batches Mallory keeps in flight at once: as fast as her DHT node and the replicas take them."""
RATE = 2000.0
"""Mallory's records per second once her burst is stored (~150x what the flood pair stores). As fast as she can
(~6,000/s here) her own process signs and sends on one of this machine's two cores, which the baseline window
does not pay: the flood pair then commits 0.53 as often per second as the baseline (1.00 per step) with both
defences on, 0.41 without the rate."""
VIEW_S = 3.0
"""How often Mallory reads the flood pair's state key as any node would, to report what it holds."""


# ---- Mallory (this module run as a script) -------------------------------------------------------------


def _record(key: SigningKey) -> tuple[str, str, bytes, float]:
    """(DHT key, subkey, sealed record, expiration) of one record for a made-up fingerprint, ``AHEAD_S`` ahead."""
    fp = os.urandom(8).hex()
    created = get_dht_time() + AHEAD_S
    record = StateRecord(key.peer_id, fp, 0, os.urandom(32).hex(), created)
    return state_key(SWARM, fp), key.peer_id, seal_record(STATE_KIND, record, key), created + TTL_S


async def _flood(_dht: Any, node: Any, seed: bytes, count: int, targets: list[str]) -> int:
    """In Mallory's DHT process: sign ``count`` records, each under its own new key, and send them in one store
    RPC to each of ``targets`` (no lookup first: she knows the replicas); records stored at every target."""
    import asyncio

    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    key = SigningKey(seed)
    keys, subkeys, values, expirations = (list(x) for x in zip(*(_record(key) for _ in range(count)), strict=True))
    ids = [DHTID.generate(source=k) for k in keys]
    packed = [MSGPackSerializer.dumps(v) for v in values]
    calls = [node.protocol.call_store(PeerID.from_base58(t), ids, packed, expirations, subkeys) for t in targets]
    answers = await asyncio.gather(*calls)
    return sum(all(a[i] for a in answers if a is not None) for i in range(count)) if all(answers) else 0


def _mallory(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Mallory: flood the DHT with her own state records under made-up keys")
    p.add_argument("--identity", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--initial-peer", required=True)
    p.add_argument("--fingerprint", required=True, help="the flood pair's: the views read its state key")
    p.add_argument("--flood-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--burst", type=int, required=True, help="records sent before the flood pair starts")
    p.add_argument("--rate", type=float, default=RATE, help="records/s after the burst (0: as fast as she can)")
    p.add_argument("--watch", action="append", default=[], help="honest peers: flooded, and looked for in views")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    out = Reporter(args.report)
    flood_file, stop_file = Path(args.flood_file), Path(args.stop_file)
    identity = load_or_create(args.identity)
    cfg = MembershipConfig(swarm_id=SWARM, host="127.0.0.1", initial_peers=(args.initial_peer,))
    with Membership(identity, cfg) as m:
        assert m.dht is not None
        dht = m.dht
        out.write(event="ready", peer=m.peer_id, time=time.time())
        end = time.monotonic() + 300.0  # bounded: the test touches the flood file or the stop file
        while not flood_file.exists() and not stop_file.exists() and time.monotonic() < end:
            time.sleep(0.05)
        if not flood_file.exists():
            return 1
        flood = partial(_flood, seed=identity.key.seed, count=BATCH, targets=args.watch)
        pending: list[Future[int]] = []
        t0, sent, stored, burst_done = time.time(), 0, 0, False
        t_burst = t0
        next_view = next_batch = time.monotonic()
        while not stop_file.exists():
            while len(pending) < IN_FLIGHT and (not burst_done or time.monotonic() >= next_batch):
                pending.append(dht.run_coroutine(flood, return_future=True))
                sent += BATCH
                next_batch = max(next_batch, time.monotonic() - 1.0) + (BATCH / args.rate if args.rate else 0.0)
            if pending:
                stored += pending.pop(0).result(60.0)
            else:
                time.sleep(max(0.0, min(next_batch, next_view) - time.monotonic()))  # the flood's pace
            if not burst_done and sent >= args.burst:
                burst_done = True
                for f in pending:  # the whole burst is stored before the test starts the flood pair
                    stored += f.result(60.0)
                pending.clear()
                t_burst = time.time()
                out.write(event="flooded", time=t_burst, burst_s=t_burst - t0, sent=sent, ok=stored)
                next_batch = time.monotonic()
            if burst_done and time.monotonic() >= next_view:
                next_view += VIEW_S
                try:
                    found = dht.get(state_key(SWARM, args.fingerprint), latest=True, return_future=True).result(10.0)
                except Exception as e:  # a read that fails under the flood is reported, not fatal
                    logging.warning("view read failed: %r", e)
                    continue
                held = set(found.value) if found is not None and isinstance(found.value, dict) else set()
                out.write(
                    event="view",
                    time=time.time(),
                    honest=sorted(p for p in args.watch if p in held),
                    sent=sent,
                    ok=stored,
                    rate=(sent - args.burst) / max(1e-9, time.time() - t_burst),
                )
        for f in pending:
            stored += f.result(60.0)
        out.write(event="stopped", time=time.time(), sent=sent, ok=stored, took_s=time.time() - t0)
    return 0


# ---- the test ------------------------------------------------------------------------------------------


def _burst() -> int:
    """Records that overfill a node's whole storage budget, each under a new key (what the budget alone lets
    one host evict everything with), rounded up to Mallory's batches."""
    cfg = MembershipConfig(swarm_id=SWARM)
    _, sub, value, _ = _record(SigningKey.generate())
    per_record = KEY_OVERHEAD_BYTES + entry_bytes(sub, MSGPackSerializer.dumps(value))
    need = int(1.2 * cfg.dht_storage_bytes / per_record)
    return -(-need // BATCH) * BATCH


def _start_mallory(swarm: FaultSwarm, initial_peer: str, fp: str, watch: list[str], flood: Path) -> Peer:
    root = swarm.root
    report = root / "mallory.jsonl"
    cmd = [PYTHON, "-m", "tests.swarm.test_sync_attacks_owner_flood", "--identity", str(root / "mallory.key")]
    cmd += ["--report", str(report), "--initial-peer", initial_peer, "--fingerprint", fp, "--burst", str(_burst())]
    cmd += ["--flood-file", str(flood), "--stop-file", str(swarm.stop_file)]
    for peer in watch:
        cmd += ["--watch", peer]
    return Peer("mallory", swarm.procs.start("mallory", cmd), report)


def test_one_owners_flood_of_made_up_keys_does_not_evict_honest_records(fault_swarm: FaultSwarm) -> None:
    root = fault_swarm.root
    go_flood, halt_flood, flood = root / "go-flood", root / "halt-flood", root / "flood"
    halt_base, stop_base = root / "halt-base", root / "stop-base"
    # the flood pair first: its "a" is every peer's bootstrap, so the flood pair trusts only its own members
    a = fault_swarm.start("a", *STEPS, "--update-seed", "1", "--go-file", str(go_flood), "--halt-file", str(halt_flood))
    b = fault_swarm.start("b", *STEPS, "--update-seed", "2", "--go-file", str(go_flood), "--halt-file", str(halt_flood))
    base_args = ("--swarm", BASE_SWARM, "--halt-file", str(halt_base), "--stop-file", str(stop_base))
    base = [fault_swarm.start(f"base-{n}", *STEPS, "--update-seed", s, *base_args) for n, s in (("a", "1"), ("b", "2"))]
    fp = a.wait_ready(START_S)["fingerprint"]
    honest = [a.info["peer"], b.wait_ready(START_S)["peer"]]
    mallory = _start_mallory(fault_swarm, a.info["maddrs"][0], fp, honest, flood)
    for p in (*base, mallory):
        p.wait_ready(START_S)
    everyone = [a, b, *base, mallory]
    t_start = time.time()

    # baseline: the base pair alone (the flood pair and Mallory idle on the same DHT)
    t_base = time.time()
    fault_swarm.go()
    _run_for(t_base, everyone, "the baseline window")
    halt_base.touch()
    for p in base:
        final_state(p, 60.0)
    stop_base.touch()
    for p in base:
        p.proc.wait(30.0)

    # the burst, then the flood pair from its first step while Mallory goes on
    flood.touch()
    flooded = mallory.wait_for(lambda r: r.get("event") == "flooded", 90.0, "the burst stored")
    t_flood = time.time()
    go_flood.touch()
    _run_for(t_flood, [a, b, mallory], "the flood window")
    views = [v for v in mallory.records("view") if v["time"] >= t_flood]
    halt_flood.touch()
    done = [final_state(p, 60.0) for p in (a, b)]

    base_step, flood_step = _per_step(base, t_base), _per_step([a, b], t_flood)
    base_s, flood_s = _per_s(base, t_base), _per_s([a, b], t_flood)
    events = [d["dht_storage_events"] for d in done]
    quota = [e.get(StorageEvent.EVICTED_SENDER_QUOTA.value, 0) for e in events]
    rated = [e.get(StorageEvent.REFUSED_RATE.value, 0) for e in events]
    budget = [e.get(StorageEvent.EVICTED_BUDGET.value, 0) for e in events]
    cfg = MembershipConfig()
    print(f"attack: one host, its own key, a new made-up fingerprint per record, created +{AHEAD_S:.0f} s,")
    print(f"  lifetime {TTL_S:.0f} s; quota {cfg.dht_sender_entries} entries / {cfg.dht_sender_bytes} B per sender")
    print(f"  burst: {flooded['sent']} records in {flooded['burst_s']:.1f} s ({flooded['ok']} stored at both)")
    after = views[-1]["sent"] - flooded["sent"] if views else 0
    print(f"  then {after} more during the flood window ({views[-1]['rate'] if views else 0:.0f} records/s)")
    rates = f"commits per 100 steps, commits/s per node over {WINDOW_S:.0f} s"
    print(f"baseline: {100 * base_step:.1f}, {base_s:.2f} {rates}: {[_outcomes(p, t_base) for p in base]}")
    print(f"flood:    {100 * flood_step:.1f}, {flood_s:.2f} {rates}: {[_outcomes(p, t_flood) for p in (a, b)]}")
    print(
        f"flood / baseline: per step {flood_step / max(base_step, 1e-9):.2f}, "
        f"per second {flood_s / max(base_s, 1e-9):.2f} (both asserted >= 0.7)"
    )
    print(f"at the flood pair's replicas: refused for her rate {rated}; evicted for her quota {quota}, ")
    print(f"  for the total budget {budget}")
    print(f"  entries their storage holds at the end: {[d['dht_entries'] for d in done]}")
    print(f"honest state records in Mallory's reads of the key during the flood: {[len(v['honest']) for v in views]}")
    print(f"wall time from the baseline's start: {time.time() - t_start:.0f} s")

    assert base_step > 0.1, "the baseline pair barely committed: the machine is too loaded to measure"
    assert flooded["sent"] >= _burst()  # the attack ran: more records than the whole budget holds
    assert flood_step >= 0.7 * base_step, (base_step, flood_step)
    assert flood_s >= 0.7 * base_s, (base_s, flood_s)
    assert views and views[-1]["honest"] == sorted(honest), views[-3:]  # honest records held at the end
    paid = [q + r for q, r in zip(quota, rated, strict=True)]
    assert all(n >= flooded["sent"] // 2 for n in paid), (quota, rated)  # her records reached them; she paid
    assert budget == [0, 0], budget  # no one else's entry was evicted for her
    assert all(len(h) == 1 for h in hashes_by_revision([a, b]).values()), hashes_by_revision([a, b])


if __name__ == "__main__":
    sys.exit(_mallory(sys.argv[1:]))
