"""A rollout-exchange node in its own process, driven by JSON lines on stdin.

Used by the network tests (so a peer can be SIGKILLed) and by
bench/bench_gossip.py. Start it with ``python exchange_worker.py --identity
PATH [--initial-peer MADDR]``; it prints ``@@ {"peer_id", "maddrs"}`` once
ready, then answers each command line with one ``@@ {...}`` line:

* ``{"cmd": "publish", "round": 1, "groups": 2, "completions": 4, "chars": 64}``
* ``{"cmd": "collect", "since": 0.0, "limit": 8}``
* ``{"cmd": "fetch", "peer": ID, "digest": HEX, "size": N}`` (one timed pull, no DHT)
* ``{"cmd": "judge", "peer": ID, "accepted": 2, "informative": 1, "refused": 0}`` (what a node reports)
* ``{"cmd": "stats"}`` / ``{"cmd": "reputation"}`` / ``{"cmd": "quit"}``
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from protocol import RolloutBatch, RolloutGroup, TaskRef, open_batch, payload_digest
from swarm.exchange import ExchangeConfig, RolloutExchange
from swarm.identity import load_or_create
from swarm.membership import Membership, MembershipConfig
from swarm.payload_stream import fetch_one
from swarm.validation import rollout_validator


def make_batch(
    publisher: str, round_: int, groups: int = 2, completions: int = 4, chars: int = 64, created: float = 0.0
) -> RolloutBatch:
    """A valid batch of ``groups`` x ``completions`` texts of ``chars`` characters each."""
    out = []
    for i in range(groups):
        texts = tuple((f"{round_}.{i}.{j} " * chars)[:chars] for j in range(completions))
        task = TaskRef.make("arith", {"digits": 2}, seed=round_, index=i)
        out.append(RolloutGroup(task, f"what is {i} + {i}?", texts, (1.0,) * completions, "toy-1m"))
    return RolloutBatch(publisher, round_, created or time.time(), tuple(out))


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _handle(ex: RolloutExchange, cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["cmd"] == "publish":
        shape = {k: cmd[k] for k in ("groups", "completions", "chars") if k in cmd}
        batch = make_batch(ex.peer_id, cmd["round"], **shape)
        t0 = time.perf_counter()
        desc = ex.publish(batch)
        elapsed = time.perf_counter() - t0
        return {"digest": desc.payload_digest, "size": desc.payload_size, "created": desc.created, "publish_s": elapsed}
    if cmd["cmd"] == "collect":
        res = ex.collect(cmd["since"], cmd["limit"])
        accepted = [[d.publisher, d.payload_digest, d.round, d.payload_size] for d, _ in res.accepted]
        return {
            "accepted": accepted,
            "rejected": [[peer, r.reason.value, r.detail] for peer, r in res.rejected],
            "failed": res.failed,
            "seen": res.seen,
            "elapsed_s": res.elapsed_s,
            "skipped_banned": res.skipped_banned,
        }
    if cmd["cmd"] == "fetch":  # one bare stream pull + verification, timed (for the benchmark)
        return _timed_fetch(ex, cmd["peer"], cmd["digest"], cmd["size"])
    if cmd["cmd"] == "judge":
        ex.judge(cmd["peer"], accepted=cmd["accepted"], informative=cmd["informative"], refused=cmd["refused"])
        return {"ok": True}
    if cmd["cmd"] == "stats":
        return ex.stats()
    if cmd["cmd"] == "reputation":
        return ex.reputation_summary()
    return {"error": f"unknown command {cmd['cmd']!r}"}


def _timed_fetch(ex: RolloutExchange, peer: str, digest: str, size: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    coro = fetch_one(ex.membership.p2p, peer, ex.handler_name, digest, size, ex.cfg.chunk_bytes, ex.cfg.pace)
    payload = ex.membership.run(coro, ex.cfg.fetch_timeout_s)
    t1 = time.perf_counter()
    open_batch(payload)
    return {"fetch_s": t1 - t0, "verify_s": time.perf_counter() - t1, "ok": payload_digest(payload) == digest}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", required=True)
    ap.add_argument("--initial-peer", default=None)
    ap.add_argument("--swarm-id", default="test-swarm")
    ap.add_argument("--fetch-timeout", type=float, default=5.0)
    ap.add_argument("--collect-timeout", type=float, default=10.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    peers = (args.initial_peer,) if args.initial_peer else ()
    mcfg = MembershipConfig(swarm_id=args.swarm_id, host="127.0.0.1", initial_peers=peers)
    member = Membership(load_or_create(args.identity), mcfg, [rollout_validator()]).start()
    xcfg = ExchangeConfig(fetch_timeout_s=args.fetch_timeout, collect_timeout_s=args.collect_timeout)
    ex = RolloutExchange(member, xcfg).start()
    try:
        _reply({"peer_id": member.peer_id, "maddrs": member.visible_multiaddrs()})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            _reply(_handle(ex, cmd))
    finally:
        ex.close()
        member.shutdown()


if __name__ == "__main__":
    main()
