"""Rollout exchange: announce batches in the DHT, serve and fetch payloads over P2P streams.

A node *publishes* a batch by sealing it, keeping the bytes in a small LRU
that its stream handler serves, and storing a signed :class:`Descriptor`
(never the payload: see docs/ARCHITECTURE.md, "Rollout exchange") in the DHT under a time-windowed key with
its own peer id as the subkey. A node *collects* by reading the current and
previous window keys, choosing descriptors (pure :func:`swarm.selection.select_descriptors`,
steered by each publisher's :class:`~swarm.reputation.Reputation`), fetching
their payloads in parallel under a per-fetch deadline that follows from the
payload's size and a minimum transfer rate, and verifying each payload (pure
:func:`verify_payload`). Every outcome feeds the publisher's reputation, and
every digest tried (accepted, refused or failed) is remembered and never
fetched again. Network trouble never raises from :meth:`RolloutExchange.collect`:
it becomes a counted rejection or failure reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hivemind.p2p import PeerID

from protocol import limits
from protocol.errors import MessageRejected
from protocol.messages import open_batch, payload_digest, seal_batch, seal_descriptor
from protocol.schema import Descriptor, RolloutBatch
from swarm import discovery
from swarm.membership import Membership
from swarm.payload_relay import RELAY_SUFFIX, RelayServer, fetch_via
from swarm.payload_stream import FetchError, FetchFailure, Pace, fetch_many, serve_one
from swarm.refusals import BatchRejection, PayloadRejected, Refusal
from swarm.reputation import Offence, Reputation, ReputationConfig
from swarm.selection import OpenedCache, Selection, select_descriptors

logger = logging.getLogger(__name__)

__all__ = [  # selection and refusals live in their own modules; importable from here too
    "BatchRejection",
    "CollectResult",
    "ExchangeConfig",
    "OpenedCache",
    "PayloadRejected",
    "Refusal",
    "RolloutExchange",
    "Selection",
    "select_descriptors",
    "verify_payload",
    "window_key",
]


def _positive(name: str, value: float, unit: str = "") -> None:
    if not value > 0:
        raise ValueError(f"{name}={value!r} must be > 0{unit}; set a positive value")


@dataclass
class ExchangeConfig:
    """Timing and size knobs of the rollout exchange."""

    window_s: float = field(default=30.0, metadata={"help": "Width of a DHT key's time window, seconds."})
    descriptor_ttl_s: float = field(
        default=300.0, metadata={"help": "How long a published descriptor stays valid, seconds."}
    )
    fetch_timeout_s: float = field(default=5.0, metadata={"help": "Bound on fetching one payload, seconds."})
    collect_timeout_s: float = field(default=10.0, metadata={"help": "Bound on a whole collect(), seconds."})
    max_served: int = field(default=32, metadata={"help": "Most recent own batches kept for serving."})
    max_parallel_fetches: int = field(default=8, metadata={"help": "Most payload fetches in flight."})
    chunk_bytes: int = field(default=256 * 1024, metadata={"help": "Stream read/write chunk size, bytes."})
    dht_timeout_s: float = field(default=5.0, metadata={"help": "Bound on one DHT store or read, seconds."})
    publish_wait_s: float = field(
        default=0.2,
        metadata={
            "help": "Longest a round waits for its descriptor's DHT store, seconds; a slower store (e.g. a "
            "replica that answers slowly on purpose) finishes and is counted in the background."
        },
    )
    remember_fetched: int = field(
        default=4096,
        metadata={"help": "How many tried digests (fetched, refused or failed) are remembered to never fetch again."},
    )
    dial_timeout_s: float = field(
        default=2.0, metadata={"help": "Bound on opening a stream to a publisher (relays included), seconds."}
    )
    first_byte_timeout_s: float = field(
        default=1.0, metadata={"help": "Bound on a publisher's response header once the stream is open, seconds."}
    )
    min_rate_bps: float = field(
        default=64 * 1024, metadata={"help": "Slowest payload transfer accepted after the grace period, bytes/s."}
    )
    rate_grace_s: float = field(
        default=1.0, metadata={"help": "Seconds after the response header before the minimum rate is enforced."}
    )
    max_future_s: float = field(
        default=30.0,
        metadata={"help": "Clock skew tolerated in a descriptor's `created`; later ones are refused, seconds."},
    )
    live_timeout_s: float = field(
        default=0.5, metadata={"help": "Bound on asking our p2p daemon which peers are connected, seconds."}
    )
    discovery_reads: int = field(
        default=2, metadata={"help": "Shard keys of each time window that one collect reads (sharded discovery)."}
    )
    min_shards: int = field(
        default=1,
        metadata={
            "help": "Fewest shard keys per time window, a power of two up to 1024; the count grows with the swarm's "
            "estimated size (swarm.discovery)."
        },
    )
    reputation: ReputationConfig = field(
        default_factory=ReputationConfig,
        metadata={"help": "Per-publisher reputation: exploration slots, decay, bans, memory bound."},
    )

    def __post_init__(self) -> None:
        timeouts = ("window_s", "fetch_timeout_s", "collect_timeout_s", "dht_timeout_s", "dial_timeout_s")
        for name in (
            *timeouts,
            "first_byte_timeout_s",
            "rate_grace_s",
            "live_timeout_s",
            "min_rate_bps",
            "publish_wait_s",
        ):
            _positive(name, getattr(self, name), " (bytes/s)" if name == "min_rate_bps" else " seconds")
        if not 0 <= self.max_future_s <= limits.MAX_CLOCK_SKEW_S:
            raise ValueError(f"max_future_s={self.max_future_s!r}; use a value in [0, {limits.MAX_CLOCK_SKEW_S}]")
        if not 0 < self.descriptor_ttl_s <= limits.MAX_DESCRIPTOR_TTL_S:
            raise ValueError(
                f"descriptor_ttl_s={self.descriptor_ttl_s!r}; use a value in (0, {limits.MAX_DESCRIPTOR_TTL_S}]"
            )
        if self.min_shards not in discovery.LEVELS:
            raise ValueError(f"min_shards={self.min_shards!r}; use a power of two from 1 to {discovery.MAX_SHARDS}")
        for name in ("max_served", "max_parallel_fetches", "remember_fetched", "discovery_reads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}; use at least 1")
        if not 4096 <= self.chunk_bytes <= 4 * 1024 * 1024:
            raise ValueError(f"chunk_bytes={self.chunk_bytes!r}; use 4096..4194304 (e.g. 262144)")

    @property
    def pace(self) -> Pace:
        """The transfer pace every publisher must keep (see ``swarm.payload_stream.Pace``)."""
        return Pace(self.dial_timeout_s, self.first_byte_timeout_s, self.min_rate_bps, self.rate_grace_s)


@dataclass
class CollectResult:
    """What one collect() got: verified batches, refusals and failures (peer id, reason), timing.

    ``rejected`` holds trust failures (forged, tampered, malformed or
    future-dated data); ``failed`` holds availability failures (unreachable
    peer, too slow, a batch its publisher no longer serves). Both lower the
    publisher's reputation, trust failures more. ``skipped_banned`` counts
    the banned publishers whose descriptors were not even opened.
    """

    accepted: list[tuple[Descriptor, RolloutBatch]]
    rejected: list[tuple[str, Refusal]]
    seen: int
    elapsed_s: float
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped_banned: int = 0


def window_key(swarm_id: str, t: float, window_s: float) -> str:
    """DHT key of the time window containing ``t`` when the swarm has one shard (see swarm.discovery)."""
    return discovery.descriptor_key(swarm_id, int(t // window_s), 1, 0)


def verify_payload(desc: Descriptor, payload: bytes) -> RolloutBatch:
    """Check ``payload`` against ``desc`` and open it; :class:`PayloadRejected` names the problem."""
    if len(payload) != desc.payload_size:
        detail = f"got {len(payload)} bytes, descriptor says {desc.payload_size}"
        raise PayloadRejected(BatchRejection.SIZE_MISMATCH, detail)
    if payload_digest(payload) != desc.payload_digest:
        raise PayloadRejected(BatchRejection.DIGEST_MISMATCH)
    try:
        batch = open_batch(payload)
    except MessageRejected as e:
        kind = BatchRejection.BAD_SIGNATURE if "signature" in e.reason else BatchRejection.BAD_BATCH
        raise PayloadRejected(kind, e.reason) from None
    if batch.publisher != desc.publisher:
        raise PayloadRejected(BatchRejection.PUBLISHER_MISMATCH, f"batch names {batch.publisher[-6:]}")
    if batch.round != desc.round:
        raise PayloadRejected(BatchRejection.ROUND_MISMATCH, f"batch {batch.round}, descriptor {desc.round}")
    return batch


RELAYS_TRIED = 2
"""Relays a fetch tries, one after the other, when its publisher cannot be dialled (swarm.payload_relay)."""
RELAY_FIRST_S = 120.0
"""After a publisher's payload came through a relay, its next fetches go to the relay first for this long
(a direct dial to a NATed publisher only waits out its timeout); then a direct dial is tried again."""
REMEMBERED_RELAYS = 16
"""Publishers reached directly that are remembered as relays for the ones that cannot be dialled."""

_MAX_PENDING_STORES = 4
"""Descriptor stores left to finish in the background at once (see RolloutExchange._store)."""


class RolloutExchange:
    """Publishes this node's rollout batches and collects other peers'. Thread-safe for one caller."""

    def __init__(
        self,
        membership: Membership,
        cfg: ExchangeConfig | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.membership = membership
        self.cfg = cfg or ExchangeConfig()
        self.round = 0
        self._clock = clock
        self._rng = rng or random.Random()
        self._served: OrderedDict[str, bytes] = OrderedDict()
        # (publisher, digest) tried: accepted, refused or failed (but not cut by our own deadline); never again.
        # Keyed by publisher too: a peer that names another's digest must not mark the genuine one as tried.
        self._fetched: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._reputation = Reputation(self.cfg.reputation)
        self._opened = OpenedCache()
        self._pending_stores = 0
        self._store_times: deque[float] = deque(maxlen=64)  # recent completed stores' durations, s
        self._shards = self.cfg.min_shards  # this node's view of the swarm's shard count, and its size estimate
        self._estimate = 0.0
        self._lock = threading.Lock()
        counters = ("bytes_in", "bytes_out", "fetch_ok", "fetch_failed", "fetch_too_slow", "fetch_relayed", "published")
        self._stats = dict.fromkeys((*counters, "publish_failed", "served", "skipped_banned"), 0)
        # publishers a direct fetch reached lately (most recent last): they can relay to the ones we cannot reach
        self._reached: OrderedDict[str, None] = OrderedDict()
        self._relayed: set[tuple[str, str]] = set()  # fetched through a relay, until verified
        self._needs_relay: OrderedDict[str, float] = OrderedDict()  # publisher -> until when to ask a relay first
        self._relay = RelayServer(membership.peer_id, self._open_payload_stream, self.cfg.pace, self.cfg.chunk_bytes)
        self._started = False

    @property
    def peer_id(self) -> str:
        return self.membership.peer_id

    @property
    def handler_name(self) -> str:
        return f"{self.membership.cfg.swarm_id}.rollouts.fetch"

    def _tag(self) -> str:
        return f"[{self.peer_id[-6:]} r={self.round}]"

    def start(self) -> RolloutExchange:
        """Register the payload stream handler (membership must be started)."""
        p2p = self.membership.p2p
        self.membership.run(p2p.add_binary_stream_handler(self.handler_name, self._handle), self.cfg.dht_timeout_s)
        relay = p2p.add_binary_stream_handler(self.handler_name + RELAY_SUFFIX, self._handle_relay)
        self.membership.run(relay, self.cfg.dht_timeout_s)
        self._started = True
        logger.info("%s serving payloads as %s", self._tag(), self.handler_name)
        return self

    def close(self) -> None:
        """Remove the handler (bounded) and drop served payloads."""
        if not self._started:
            return
        self._started = False
        try:
            p2p = self.membership.p2p
            for name in (self.handler_name, self.handler_name + RELAY_SUFFIX):
                self.membership.run(p2p.remove_binary_stream_handler(name), self.cfg.dht_timeout_s)
        except Exception as e:  # closing: the P2P side may already be gone
            logger.debug("%s removing handler: %s", self._tag(), e)
        with self._lock:
            self._served.clear()

    def stats(self) -> dict[str, int]:
        """Counters since start, and ``store_ms``: the median time of the last 64 descriptor stores that
        completed, in ms (0 before the first), i.e. how long a descriptor takes to become readable."""
        with self._lock:
            times = sorted(self._store_times)
            return {**self._stats, "store_ms": round(1000 * times[len(times) // 2]) if times else 0}

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    # ---- publishing and serving -------------------------------------------------------------

    def publish(self, batch: RolloutBatch) -> Descriptor:
        """Seal and serve ``batch`` and announce it in the DHT; returns the descriptor.

        A failed DHT store is logged and counted (``publish_failed``), not raised:
        the batch is still served, and the next publish tries again.
        """
        if not self._started:
            raise RuntimeError("RolloutExchange.publish before start()")
        self.round = batch.round
        payload = seal_batch(batch, self.membership.identity.key)
        digest = payload_digest(payload)
        with self._lock:
            self._served[digest] = payload
            while len(self._served) > self.cfg.max_served:
                self._served.popitem(last=False)
        created = float(self._clock())
        families = sorted({g.task.family for g in batch.groups})[: limits.MAX_TASK_FAMILIES]
        desc = Descriptor(
            self.peer_id, batch.round, digest, len(payload), tuple(families), created,
            created + self.cfg.descriptor_ttl_s,
        )  # fmt: skip
        with self._lock:
            shards, estimate = self._shards, self._estimate
        window = int(created // self.cfg.window_s)
        swarm_id, floor = self.membership.cfg.swarm_id, self.cfg.min_shards
        keys = discovery.publisher_keys(swarm_id, self.peer_id, window, shards, estimate, floor)
        ok = self._store(keys[0], desc)
        for extra in keys[1:]:  # near a shard-count threshold: also where nodes a level away read
            self._store(extra, desc)
        state = "pending" if ok is None else ok
        logger.info("%s published %s (%d bytes, stored=%s)", self._tag(), digest[:12], len(payload), state)
        return desc

    def _store(self, key: str, desc: Descriptor) -> bool | None:
        """Store ``desc``; its outcome, or None when it is still in flight after ``publish_wait_s``.

        A DHT store waits for every replica it asks, and a hostile replica can answer slowly:
        the round waits a short while, then the store is counted when it ends. At most
        ``_MAX_PENDING_STORES`` wait in the background; past that the round waits in full.
        """
        sealed = seal_descriptor(desc, self.membership.identity.key)
        dht = self.membership.dht
        if dht is None:
            self._count(publish_failed=1)
            return False
        started = time.monotonic()
        # done at the first replica that holds it (readers can find it from then on); hivemind goes on storing
        # to the other replicas in the background. Waiting for all of them measured the slowest replica, not
        # when the descriptor became readable, and on a busy DHT held a store for seconds (bench/RESULTS.md)
        future = dht.store(
            key, sealed, desc.expires, subkey=self.peer_id, return_future=True,
            await_all_replicas=False, await_all_tasks=False,
        )  # fmt: skip
        with self._lock:
            wait = self.cfg.publish_wait_s if self._pending_stores < _MAX_PENDING_STORES else self.cfg.dht_timeout_s
        try:
            ok = bool(future.result(timeout=wait))
        except TimeoutError:
            if wait >= self.cfg.dht_timeout_s:
                return self._store_failed(future, key, "timeout")
            with self._lock:
                self._pending_stores += 1
            future.add_done_callback(lambda f: self._store_done(f, started))
            return None
        except Exception as e:
            return self._store_failed(future, key, str(e) or type(e).__name__)
        self._count(published=int(ok), publish_failed=int(not ok))
        self._store_took(ok, started)
        return ok

    def _store_took(self, ok: bool, started: float) -> None:
        if ok:
            with self._lock:
                self._store_times.append(time.monotonic() - started)

    def _store_failed(self, future: Any, key: str, why: str) -> bool:
        future.cancel()
        self._count(publish_failed=1)
        logger.warning("%s DHT store of %s failed: %s", self._tag(), key, why)
        return False

    def _store_done(self, future: Any, started: float) -> None:
        """A background store ended (called from hivemind's future thread)."""
        ok = not future.cancelled() and future.exception() is None and bool(future.result())
        with self._lock:
            self._pending_stores -= 1
        self._count(published=int(ok), publish_failed=int(not ok))
        self._store_took(ok, started)

    def _lookup(self, digest: str) -> bytes | None:
        with self._lock:
            payload = self._served.get(digest)
            if payload is not None:
                self._served.move_to_end(digest)
            return payload

    async def _handle(self, _info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            coro = serve_one(reader, writer, self._lookup, self.cfg.chunk_bytes)
            sent = await asyncio.wait_for(coro, self.cfg.fetch_timeout_s)
            self._count(bytes_out=sent, served=int(sent > 0))
        except Exception as e:  # a client went away or sent garbage: its problem
            logger.debug("%s serving a payload failed: %s", self._tag(), e or type(e).__name__)
        except asyncio.CancelledError:  # leaving mid-stream: quietly (see swarm.sync.hivemind_transport)
            pass
        finally:
            writer.close()

    async def _handle_relay(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._relay.handle(info.peer_id.to_base58(), reader, writer)
        except asyncio.CancelledError:  # leaving mid-relay: quietly
            writer.close()

    async def _open_payload_stream(self, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        _, reader, writer = await self.membership.p2p.call_binary_stream_handler(
            PeerID.from_base58(peer), self.handler_name
        )
        return reader, writer

    def relay_stats(self) -> dict[str, int]:
        """Fetches this node relayed for others, refused to, and the payload bytes it moved for them."""
        return {"relayed": self._relay.relayed, "refused": self._relay.refused, "bytes": self._relay.bytes}

    def _relays_for(self, publisher: str) -> list[str]:
        """Who may relay a fetch from ``publisher``: the peers we joined through, then those we reached lately."""
        initial = [a.rsplit("/p2p/", 1)[-1] for a in self.membership.cfg.initial_peers if "/p2p/" in a]
        with self._lock:
            recent = list(reversed(self._reached))
        chosen = [p for p in dict.fromkeys([*initial, *recent]) if p not in (publisher, self.peer_id)]
        return chosen[:RELAYS_TRIED]

    # ---- collecting -------------------------------------------------------------------------

    def collect(self, since: float, limit: int) -> CollectResult:
        """Fetch and verify up to ``limit`` other peers' batches announced since ``since``.

        Bounded by ``collect_timeout_s``; never raises for network trouble.
        """
        start = time.monotonic()
        deadline = start + self.cfg.collect_timeout_s
        now = float(self._clock())
        entries = self._read_entries(now, deadline)
        live = self._live_peers(deadline)
        with self._lock:
            sel = select_descriptors(
                entries, own=self.peer_id, now=now, since=since, fetched=self._fetched, limit=limit,
                rng=self._rng, reputation=self._reputation, live=live, max_future_s=self.cfg.max_future_s,
                opened=self._opened,
            )  # fmt: skip
            for publisher in {p for p, r in sel.rejected if r.reason is BatchRejection.FUTURE_DATED}:
                self._reputation.penalize(publisher, Offence.FUTURE_DATED, now)
        results = self._fetch_all(sel.chosen, deadline - time.monotonic())
        failed: list[tuple[str, str]] = []
        accepted = self._verify_all(sel.chosen, results, sel.rejected, failed, now)
        elapsed = time.monotonic() - start
        self._count(skipped_banned=sel.skipped_banned)
        logger.info(
            "%s collected %d of %d chosen (%d seen, %d rejected, %d failed, %d banned skipped) in %.2fs",
            self._tag(), len(accepted), len(sel.chosen), len(entries), len(sel.rejected), len(failed),
            sel.skipped_banned, elapsed,
        )  # fmt: skip
        return CollectResult(accepted, sel.rejected, len(entries), elapsed, failed, sel.skipped_banned)

    def judge(self, publisher: str, *, accepted: int, informative: int, refused: int) -> None:
        """Feed back the node's local re-verification of ``publisher``'s groups into its reputation.

        ``accepted`` groups passed, ``informative`` of them have a non-zero
        advantage, ``refused`` failed verification.
        """
        now = float(self._clock())
        with self._lock:
            self._reputation.judge(publisher, now, accepted=accepted, informative=informative, refused=refused)

    def reputation_summary(self) -> dict[str, Any]:
        """JSON-able: publishers tracked, banned now, and bans started so far by reason."""
        now = float(self._clock())
        with self._lock:
            return self._reputation.summary(now)

    def _live_peers(self, deadline: float) -> frozenset[str]:
        """Peer ids our p2p daemon is connected to now; empty when it does not answer in time."""
        budget = min(self.cfg.live_timeout_s, deadline - time.monotonic())
        if budget <= 0:
            return frozenset()
        try:
            infos = self.membership.run(self.membership.p2p.list_peers(), budget)
            return frozenset(info.peer_id.to_base58() for info in infos)
        except Exception as e:  # only a hint for exploration: go on without it
            logger.debug("%s listing connected peers failed: %s", self._tag(), e or type(e).__name__)
            return frozenset()

    def _read_entries(self, now: float, deadline: float) -> list[tuple[Any, Any]]:
        """Raw (subkey, value) pairs under the sampled shard keys of the current and previous windows; the
        publishers found there update this node's estimate of the swarm's size and so its shard count."""
        dht = self.membership.dht
        if dht is None:
            return []
        swarm_id, window = self.membership.cfg.swarm_id, int(now // self.cfg.window_s)
        with self._lock:
            shards = self._shards
            plan = discovery.read_plan((window, window - 1), shards, self.cfg.discovery_reads, self._rng)
        futures = [dht.get(read.key(swarm_id), latest=True, return_future=True) for read in plan]
        entries: list[tuple[Any, Any]] = []
        by_read: dict[discovery.ShardRead, list[str]] = {}
        for read, future in zip(plan, futures, strict=True):
            budget = max(0.0, min(self.cfg.dht_timeout_s, deadline - time.monotonic()))
            try:
                found = future.result(timeout=budget)
            except Exception as e:
                future.cancel()
                logger.warning("%s DHT read of %s failed: %s", self._tag(), read.key(swarm_id), e or type(e).__name__)
                continue
            items = found.value.items() if found is not None and isinstance(found.value, dict) else []
            entries.extend((subkey, item.value) for subkey, item in items)
            # the subkeys are peer ids (the validator checks each against its signer); a bad one just counts
            by_read[read] = [k for k, _ in items if isinstance(k, str)]
        self._update_shards(shards, discovery.estimate_publishers(by_read, shards))
        return entries

    def _update_shards(self, shards: int, estimate: float | None) -> None:
        if estimate is None:  # no shard of this node's level answered: keep the last view
            return
        with self._lock:
            self._estimate = discovery.smoothed(self._estimate, estimate)
            estimate = self._estimate
            self._shards = max(self.cfg.min_shards, discovery.next_shard_count(shards, estimate))
            if self._shards != shards:
                logger.info("%s ~%.0f publishers per window: %d shard keys (was %d)", self._tag(), estimate,
                            self._shards, shards)  # fmt: skip

    @property
    def shards(self) -> int:
        """The shard count this node publishes under now."""
        with self._lock:
            return self._shards

    def _fetch_all(self, chosen: list[Descriptor], budget: float) -> dict[tuple[str, str], bytes | FetchError]:
        """Payload bytes or why the fetch failed, per chosen (publisher, digest); absent when our deadline cut it."""
        if not chosen or budget <= 0:
            return {}
        try:
            wanted = [(d.publisher, d.payload_digest, d.payload_size) for d in chosen]
            coro = fetch_many(
                self.membership.p2p, self.handler_name, wanted, budget_s=budget, parallel=self.cfg.max_parallel_fetches,
                chunk_bytes=self.cfg.chunk_bytes, pace=self.cfg.pace, cap_s=self.cfg.fetch_timeout_s,
                fallback=self._fetch_relayed, relay_first=self._relay_first,
            )  # fmt: skip
            result: dict[tuple[str, str], bytes | FetchError] = self.membership.run(coro, budget + 2.0)
            return result
        except Exception as e:  # the loop itself is stuck or gone
            logger.warning("%s fetching failed as a whole: %s", self._tag(), e or type(e).__name__)
            return {}

    def _relay_first(self, publisher: str) -> bool:
        """Whether ``publisher``'s last payload came through a relay lately (its direct dial would only wait)."""
        with self._lock:
            until = self._needs_relay.get(publisher)
        return until is not None and time.monotonic() < until

    async def _fetch_relayed(self, publisher: str, digest: str, size: int, left: float) -> bytes:
        """``publisher``'s payload through the first relay that delivers it in the ``left`` seconds."""
        end = asyncio.get_running_loop().time() + left
        error = FetchError(FetchFailure.UNREACHABLE, "no relay to try")
        for relay in self._relays_for(publisher):
            remaining = end - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            coro = fetch_via(self.membership.p2p, relay, self.handler_name, publisher, digest, size,
                             self.cfg.chunk_bytes, self.cfg.pace)  # fmt: skip
            try:
                payload = await asyncio.wait_for(coro, remaining)
            except (FetchError, TimeoutError) as e:
                error = e if isinstance(e, FetchError) else FetchError(FetchFailure.TOO_SLOW, "relay too slow")
                continue
            self._count(fetch_relayed=1)
            with self._lock:
                self._relayed.add((publisher, digest))
                self._needs_relay[publisher] = time.monotonic() + RELAY_FIRST_S
                self._needs_relay.move_to_end(publisher)
                while len(self._needs_relay) > REMEMBERED_RELAYS * 16:
                    self._needs_relay.popitem(last=False)
            return payload
        raise error

    def _verify_all(
        self,
        chosen: list[Descriptor],
        results: dict[tuple[str, str], bytes | FetchError],
        rejected: list[tuple[str, Refusal]],
        failed: list[tuple[str, str]],
        now: float,
    ) -> list[tuple[Descriptor, RolloutBatch]]:
        accepted: list[tuple[Descriptor, RolloutBatch]] = []
        for desc in chosen:
            result = results.get((desc.publisher, desc.payload_digest))
            relayed = self._take_relayed(desc)
            if not isinstance(result, bytes):
                reason = COLLECT_DEADLINE if result is None else result.reason
                failed.append((desc.publisher, reason))
                slow = result is not None and result.kind is FetchFailure.TOO_SLOW
                self._count(fetch_failed=1, fetch_too_slow=int(slow))
                logger.info("%s fetch from %s failed: %s", self._tag(), desc.publisher[-6:], reason)
                if result is not None:  # a cut by our own deadline is no fault of the publisher: try again later
                    self._settle(desc, now, offence_for_failure(result.kind), credit=False)
                continue
            self._count(bytes_in=len(result))
            try:
                accepted.append((desc, verify_payload(desc, result)))
            except PayloadRejected as e:
                self._count(fetch_failed=1)
                rejected.append((desc.publisher, e.refusal))
                self._settle(desc, now, offence_for_refusal(e.refusal.reason), credit=False)
                logger.warning("%s rejected payload from %s: %s", self._tag(), desc.publisher[-6:], e.reason)
                continue
            self._count(fetch_ok=1)
            self._settle(desc, now, None, credit=True)
            if not relayed:
                self._remember_reached(desc.publisher)
        return accepted

    def _take_relayed(self, desc: Descriptor) -> bool:
        """Whether ``desc``'s payload came through a relay (forgotten now, whatever its verification says)."""
        key = (desc.publisher, desc.payload_digest)
        with self._lock:
            relayed = key in self._relayed
            self._relayed.discard(key)
        return relayed

    def _remember_reached(self, publisher: str) -> None:
        """``publisher`` answered a direct fetch: it can relay to the publishers this node cannot dial."""
        with self._lock:
            self._reached[publisher] = None
            self._reached.move_to_end(publisher)
            while len(self._reached) > REMEMBERED_RELAYS:
                self._reached.popitem(last=False)

    def _settle(self, desc: Descriptor, now: float, offence: Offence | None, *, credit: bool) -> None:
        """Remember ``desc``'s digest for good; penalise its publisher for ``offence`` or credit the delivery."""
        with self._lock:
            self._fetched[(desc.publisher, desc.payload_digest)] = None
            while len(self._fetched) > self.cfg.remember_fetched:
                self._fetched.popitem(last=False)
            if offence is not None:
                self._reputation.penalize(desc.publisher, offence, now)
            elif credit:
                self._reputation.delivered(desc.publisher, now)


COLLECT_DEADLINE = "collect deadline"
"""The ``failed`` reason of a fetch cut by this node's own collect deadline (no fault of the publisher)."""


def offence_for_failure(kind: FetchFailure) -> Offence | None:
    """What a failed fetch says about its publisher; None when nothing (an error reply is an honest answer).

    An honest publisher answers "unknown digest" for a batch it no longer
    serves; an attacker replaying its old descriptors must not get it penalised.
    """
    if kind is FetchFailure.PEER_ERROR:
        return None
    if kind is FetchFailure.TOO_SLOW:
        return Offence.TOO_SLOW
    if kind in (FetchFailure.TOO_LARGE, FetchFailure.SIZE_MISMATCH, FetchFailure.BAD_HEADER):
        return Offence.DIGEST_MISMATCH  # it announced other bytes than it signed for
    return Offence.UNREACHABLE


def offence_for_refusal(reason: BatchRejection) -> Offence:
    """What a refused payload says about its publisher (streams are authenticated: the bytes are its own)."""
    if reason in (BatchRejection.DIGEST_MISMATCH, BatchRejection.SIZE_MISMATCH):
        return Offence.DIGEST_MISMATCH
    return Offence.REFUSED_CONTENT
