"""An attacker peer against a live swarm, written as an outsider would: hivemind plus our public modules.

Run as ``python -m tests.integration.attacker --peer MADDR --dir DIR --attacks a,b,...``.
It joins the swarm with DHT nodes that run *no* record validator (an outsider
need not), and for ``--duration`` seconds keeps running the chosen attacks
(docs: SECURITY.md, and issue 11's table):

* ``flood``: ``--flood-keys`` fresh keys, each storing validly signed
  descriptors of payloads nobody serves, in the current and next window keys,
  ``created`` set ``--flood-skew`` seconds in the future (0: honest times, the
  adaptive variant a validator that checks windows cannot tell from a peer);
* ``replay``: honest peers' genuine descriptors, re-stored under the current
  and next window keys with a 1-hour DHT expiration;
* ``garbage``: 40 values of 1.9 MB under keys outside the swarm's namespace,
  10-day expiration;
* publishers, each a live libp2p host with its own key, announcing a fresh
  batch every ``--every`` seconds: ``long`` (validly signed groups of the
  honest nodes' own tasks, with 1,000-character completions), ``foreign``
  (64 groups of a reasoning-gym family the honest nodes do not train on,
  distinct seeds), ``slow`` (serves at 256 B/s), ``silent`` (accepts the
  stream, never answers), ``digest`` (serves bytes that do not match),
  ``amplify`` (valid groups of the honest nodes' own task, each with the
  protocol's 64 completions, all right: the most rows and advantage one
  publisher can claim), ``junk`` (valid groups of ``--junk-family``, each of 64 completions that all state
  the right answer inside junk text a receiver would never write: a poisoner's only way to earn credit).

``watch`` collects the honest nodes' own batches as any peer may (a RolloutExchange) and appends each
one's completions to ``DIR/observed.jsonl``: what the victims write, to see whether the junk spread.

What it did is written as JSON to ``DIR/attacker.json`` (counts per attack),
refreshed every cycle. SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hivemind

from node.tasks.heldout import training_item
from node.tasks.registry import build_task
from protocol import Descriptor, RolloutBatch, RolloutGroup, SigningKey, payload_digest, seal_batch, seal_descriptor
from swarm.exchange import RolloutExchange, window_key
from swarm.identity import Identity, encode_key_file
from swarm.membership import Membership, MembershipConfig

PUBLISHERS = ("long", "foreign", "slow", "silent", "digest", "amplify", "junk")
WINDOW_S = 30.0  # the swarm's default ExchangeConfig.window_s
FOREIGN_FAMILY = "rg:basic_arithmetic"  # honest nodes in the tests train on the built-in tiny tasks only
HONEST_FAMILY = "max"
JUNK = "~^~^`|{}|~^ BUY@evil#$ "
"""What the ``junk`` publisher wraps every right answer in; a victim that learned it writes it (SECURITY.md)."""


def junk_completion(answer: str) -> str:
    """A completion the verifier rewards (its answer is right) whose text no honest policy writes."""
    return f"{JUNK}<answer>{answer}</answer>"


def _identity(root: Path, name: str) -> Identity:
    key = SigningKey.generate()
    path = root / f"{name}.key"
    path.write_bytes(encode_key_file(key))
    os.chmod(path, 0o600)
    return Identity(key, path)


def _descriptor(
    key: SigningKey, round_: int, digest: str, size: int, created: float, families: tuple[str, ...] = (HONEST_FAMILY,)
) -> Descriptor:
    return Descriptor(key.peer_id, round_, digest, size, families, created, created + 300.0)


class Publisher:
    """One live attacker host serving its own batches with a chosen misbehaviour."""

    def __init__(self, mode: str, membership: Membership, swarm_id: str, junk_family: str = "rg:chain_sum") -> None:
        self.mode, self.m, self.swarm_id, self.junk_family = mode, membership, swarm_id, junk_family
        self.served: dict[str, bytes] = {}
        self.round = 0
        self.stored = 0
        self._foreign: list[RolloutGroup] = []

    def start(self) -> Publisher:
        handler = f"{self.swarm_id}.rollouts.fetch"
        self.m.run(self.m.p2p.add_binary_stream_handler(handler, self._handle), 10.0)
        return self

    async def _handle(self, _info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            digest = (await reader.readexactly(64)).decode()
            payload = self.served.get(digest, b"")
            header = b"SNP1" + bytes([0]) + len(payload).to_bytes(4, "big")
            if self.mode == "silent":
                await asyncio.sleep(3600)
            elif self.mode == "slow":
                data = header + payload
                for i in range(0, len(data), 64):
                    writer.write(data[i : i + 64])
                    await writer.drain()
                    await asyncio.sleep(0.25)  # 256 B/s
            elif self.mode == "digest":
                writer.write(header + os.urandom(len(payload)))
                await writer.drain()
            else:
                writer.write(header + payload)
                await writer.drain()
        except Exception:  # the victim hung up: that is its defence working
            pass
        finally:
            writer.close()

    def _groups(self) -> tuple[RolloutGroup, ...]:
        if self.mode == "foreign":
            # two sets of 64 distinct seeds, alternating: a receiver's 64-entry dataset cache always misses,
            # while the attacker builds its 128 datasets once
            if not self._foreign:
                family = build_task(FOREIGN_FAMILY)
                items = [training_item(family, random.randrange(2**40), 0) for _ in range(128)]
                self._foreign = [
                    RolloutGroup(i.ref, i.prompt, ("<answer>1</answer>",) * 4, (0.0,) * 4, "x") for i in items
                ]
            half = 64 * (self.round % 2)
            return tuple(self._foreign[half : half + 64])
        if self.mode == "junk":
            family = build_task(self.junk_family)
            # seed 0, the family's own default config: the receiver's dataset for it is built once
            items = [training_item(family, 0, random.randrange(2**30)) for _ in range(4)]
            return tuple(
                RolloutGroup(i.ref, i.prompt, (junk_completion(i.answer),) * 64, (1.0,) * 64, "tiny-s") for i in items
            )
        family = build_task(HONEST_FAMILY)
        items = [training_item(family, random.randrange(2**40), 0) for _ in range(4)]

        def completions(answer: str) -> tuple[str, ...]:
            if self.mode == "amplify":
                return (answer,) * 64
            if self.mode != "long":
                return (answer,) * 4
            # one right answer among long wrong ones: the group has signal, so a receiver trains on it
            return (answer, "9" * 1000, "8" * 1000, "7" * 1000)

        return tuple(
            RolloutGroup(i.ref, i.prompt, completions(i.answer), (0.0,) * len(completions(i.answer)), "tiny-s")
            for i in items
        )

    def publish(self) -> None:
        self.round += 1
        now = time.time()
        batch = RolloutBatch(self.m.peer_id, self.round, now, self._groups())
        payload = seal_batch(batch, self.m.identity.key)
        digest = payload_digest(payload)
        self.served = {digest: payload}  # only the newest is served
        families = tuple(sorted({g.task.family for g in batch.groups}))
        desc = _descriptor(self.m.identity.key, self.round, digest, len(payload), now, families)
        assert self.m.dht is not None
        key = window_key(self.swarm_id, now, WINDOW_S)
        sealed = seal_descriptor(desc, self.m.identity.key)
        self.stored += bool(self.m.dht.store(key, sealed, desc.expires, subkey=self.m.peer_id))


async def _store_garbage(_dht: Any, node: Any) -> int:
    stored = 0
    for _ in range(40):
        ok = await node.store(f"junk-{os.urandom(8).hex()}", os.urandom(1_900_000), time.time() + 10 * 86400)
        stored += bool(ok)
    return stored


class Attacker:
    """Runs the chosen attacks in cycles until ``deadline``; counts what it did in ``report``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(args.dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.attacks = set(args.attacks.split(","))
        self.report: Counter[str] = Counter()
        self.flood_keys = [SigningKey.generate() for _ in range(args.flood_keys)] if "flood" in self.attacks else []
        self.members: list[Membership] = []
        self.publishers: list[Publisher] = []
        self.watcher: RolloutExchange | None = None

    def _join(self, name: str) -> Membership:
        cfg = MembershipConfig(swarm_id=self.args.swarm_id, host="127.0.0.1", initial_peers=(self.args.peer,))
        m = Membership(_identity(self.root, name), cfg).start()  # no validator: an outsider's choice
        self.members.append(m)
        return m

    def start(self) -> None:
        self.base = self._join("base")
        for mode in PUBLISHERS:
            if mode in self.attacks:
                publisher = Publisher(mode, self._join(mode), self.args.swarm_id, self.args.junk_family)
                self.publishers.append(publisher.start())
        if "watch" in self.attacks:
            self.watcher = RolloutExchange(self._join("watch")).start()
        self.report["peers"] = len(self.members)
        ids = {p.mode: p.m.peer_id for p in self.publishers}
        (self.root / "attacker-ids.json").write_text(json.dumps({"base": self.base.peer_id, **ids}))

    @property
    def dht(self) -> hivemind.DHT:
        assert self.base.dht is not None
        return self.base.dht

    def _store_many(self, what: str, records: Sequence[tuple[str, bytes, float, str | None]]) -> None:
        """Store all at once (futures in flight together), count sent and stored under ``what``."""
        futures = [self.dht.store(k, v, exp, subkey=sk, return_future=True) for k, v, exp, sk in records]
        for future in futures:
            try:
                self.report[f"{what}_stored"] += bool(future.result(timeout=20.0))
            except Exception:
                future.cancel()
            self.report[f"{what}_sent"] += 1

    def flood(self) -> None:
        now = time.time()
        created = now + self.args.flood_skew
        keys = [window_key(self.args.swarm_id, t, WINDOW_S) for t in (now, now + WINDOW_S)]
        records: list[tuple[str, bytes, float, str | None]] = []
        for key in self.flood_keys:
            desc = _descriptor(key, 1, os.urandom(32).hex(), 19_000, created)
            sealed = seal_descriptor(desc, key)
            records += [(dht_key, sealed, desc.expires, key.peer_id) for dht_key in keys]
        self._store_many("flood", records)

    def replay(self) -> None:
        now = time.time()
        found = self.dht.get(window_key(self.args.swarm_id, now, WINDOW_S), latest=True)
        own = {m.peer_id for m in self.members}
        if found is None or not isinstance(found.value, dict):
            return
        records: list[tuple[str, bytes, float, str | None]] = []
        for subkey, item in found.value.items():
            if subkey in own or not isinstance(subkey, str):
                continue
            for t in (now, now + WINDOW_S):
                records.append((window_key(self.args.swarm_id, t, WINDOW_S), item.value, now + 3600.0, subkey))
        self._store_many("replay", records)

    def garbage(self) -> None:
        if self.report["garbage_sent"] >= 40:
            return
        # stored from inside the DHT process: hivemind's pipe to it breaks on megabytes of arguments
        self.report["garbage_stored"] += self.dht.run_coroutine(_store_garbage)
        self.report["garbage_sent"] += 40

    def dht_cycle(self) -> None:
        """One round of the DHT attacks (slow: stores that honest validators refuse wait for replies)."""
        steps: dict[str, Callable[[], None]] = {"flood": self.flood, "replay": self.replay, "garbage": self.garbage}
        for name, step in steps.items():
            if name in self.attacks:
                t0 = time.monotonic()
                step()
                print(f"attacker: {name} took {time.monotonic() - t0:.2f}s", file=sys.stderr, flush=True)
        self.report["dht_cycles"] += 1

    def publish_cycle(self) -> None:
        """Every publisher announces a fresh batch."""
        for p in self.publishers:
            try:
                p.publish()
                self.report[f"{p.mode}_published"] += 1
            except Exception:
                self.report[f"{p.mode}_publish_errors"] += 1
        self.report["stored_by_publishers"] = sum(p.stored for p in self.publishers)
        (self.root / "attacker.json").write_text(json.dumps(self.report))

    def watch(self) -> None:
        """Collect the honest nodes' newest batches; append what they wrote to ``observed.jsonl``."""
        if self.watcher is None:
            return
        own = {m.peer_id for m in self.members}
        result = self.watcher.collect(since=time.time() - 120.0, limit=8)
        with (self.root / "observed.jsonl").open("a") as out:
            for desc, batch in result.accepted:
                if desc.publisher in own:
                    continue
                completions = [c for g in batch.groups for c in g.completions]
                line = {
                    "time": time.time(),
                    "publisher": desc.publisher,
                    "round": batch.round,
                    "completions": completions,
                }
                out.write(json.dumps(line) + "\n")
                self.report["watched_batches"] += 1

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        for m in self.members:
            m.shutdown()


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--peer", required=True, help="multiaddr of a swarm node to join through")
    p.add_argument("--dir", required=True, help="where keys and attacker.json go")
    # junk and watch are for one victim of a reasoning-gym family (test_attack_junk.py), not in the default mix
    p.add_argument("--attacks", default="flood,replay,garbage," + ",".join(m for m in PUBLISHERS if m != "junk"))
    p.add_argument("--swarm-id", default="swarm-node")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--every", type=float, default=2.0, help="seconds between cycles")
    p.add_argument("--dht-every", type=float, default=15.0, help="seconds between flood/replay rounds")
    p.add_argument("--flood-keys", type=int, default=300)
    p.add_argument("--junk-family", default="rg:chain_sum", help="the task family of the junk publisher's groups")
    p.add_argument("--flood-skew", type=float, default=100.0, help="seconds added to flood descriptors' created")
    return p.parse_args()


def main() -> None:
    args = _parse()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    attacker = Attacker(args)
    try:
        attacker.start()
        (Path(args.dir) / "attacker.json").write_text(json.dumps(attacker.report))
        (Path(args.dir) / "attacker.ready").touch()
        deadline = time.monotonic() + args.duration

        def dht_loop() -> None:
            while not stop.is_set() and time.monotonic() < deadline:
                attacker.dht_cycle()
                stop.wait(args.dht_every)

        def watch_loop() -> None:
            while not stop.is_set() and time.monotonic() < deadline:
                attacker.watch()
                stop.wait(args.every)

        threading.Thread(target=dht_loop, daemon=True).start()
        threading.Thread(target=watch_loop, daemon=True).start()
        while not stop.is_set() and time.monotonic() < deadline:
            attacker.publish_cycle()
            stop.wait(args.every)
    finally:
        attacker.close()


if __name__ == "__main__":
    main()
