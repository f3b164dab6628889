"""Rollout exchange: announce batches in the DHT, serve and fetch payloads over P2P streams.

A node *publishes* a batch by sealing it, keeping the bytes in a small LRU
that its stream handler serves, and storing a signed :class:`Descriptor`
(never the payload: see docs/ARCHITECTURE.md, "Rollout exchange") in the DHT under a time-windowed key with
its own peer id as the subkey. A node *collects* by reading the current and
previous window keys, choosing descriptors (pure :func:`select_descriptors`),
fetching their payloads in parallel under per-fetch and overall deadlines, and
verifying each payload (pure :func:`verify_payload`). Network trouble never
raises from :meth:`RolloutExchange.collect`: it becomes a rejection reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from protocol import limits
from protocol.errors import MessageRejected
from protocol.messages import open_batch, open_descriptor, payload_digest, seal_batch, seal_descriptor
from protocol.schema import Descriptor, RolloutBatch
from swarm.membership import Membership
from swarm.payload_stream import FetchError, fetch_one, serve_one

logger = logging.getLogger(__name__)


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
    remember_fetched: int = field(
        default=4096, metadata={"help": "How many fetched digests are remembered to skip re-fetching."}
    )

    def __post_init__(self) -> None:
        for name in ("window_s", "fetch_timeout_s", "collect_timeout_s", "dht_timeout_s"):
            _positive(name, getattr(self, name), " seconds")
        if not 0 < self.descriptor_ttl_s <= limits.MAX_DESCRIPTOR_TTL_S:
            raise ValueError(
                f"descriptor_ttl_s={self.descriptor_ttl_s!r}; use a value in (0, {limits.MAX_DESCRIPTOR_TTL_S}]"
            )
        for name in ("max_served", "max_parallel_fetches", "remember_fetched"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}; use at least 1")
        if not 4096 <= self.chunk_bytes <= 4 * 1024 * 1024:
            raise ValueError(f"chunk_bytes={self.chunk_bytes!r}; use 4096..4194304 (e.g. 262144)")


class BatchRejection(StrEnum):
    """Why a peer's descriptor or payload was refused: a trust failure, counted by value.

    The values are the labels shown in metrics (``rejected_reasons``) and on the dashboard.
    """

    BAD_DESCRIPTOR = "bad descriptor"
    WRONG_SUBKEY = "descriptor under another peer's subkey"
    SIZE_MISMATCH = "size mismatch"
    DIGEST_MISMATCH = "digest mismatch"
    BAD_SIGNATURE = "bad signature"
    BAD_BATCH = "bad batch"
    PUBLISHER_MISMATCH = "publisher mismatch"
    ROUND_MISMATCH = "round mismatch"


@dataclass(frozen=True)
class Refusal:
    """A refused descriptor or payload: the reason to count, and details for the log only."""

    reason: BatchRejection
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


class PayloadRejected(MessageRejected):
    """A fetched payload that does not match its descriptor or does not open."""

    def __init__(self, reason: BatchRejection, detail: str = "") -> None:
        super().__init__(str(Refusal(reason, detail)))
        self.refusal = Refusal(reason, detail)


@dataclass
class CollectResult:
    """What one collect() got: verified batches, refusals and failures (peer id, reason), timing.

    ``rejected`` holds trust failures (forged, tampered or malformed data);
    ``failed`` holds availability failures (unreachable peer, timeout, a batch
    its publisher no longer serves), which say nothing against the peer.
    """

    accepted: list[tuple[Descriptor, RolloutBatch]]
    rejected: list[tuple[str, Refusal]]
    seen: int
    elapsed_s: float
    failed: list[tuple[str, str]] = field(default_factory=list)


def window_key(swarm_id: str, t: float, window_s: float) -> str:
    """DHT key of the time window containing ``t``."""
    return f"{swarm_id}:rollouts:{int(t // window_s)}"


def select_descriptors(
    entries: Iterable[tuple[Any, Any]],
    *,
    own: str,
    now: float,
    since: float,
    fetched: Container[str],
    limit: int,
    rng: random.Random,
) -> tuple[list[Descriptor], list[tuple[str, Refusal]]]:
    """Choose what to fetch from raw DHT ``(subkey, value)`` entries.

    Forged or malformed entries are rejected with a reason; own, expired,
    older-than-``since``, future-dated and already fetched ones are dropped
    silently. At most ``limit`` are chosen, newest first, ties in random order.
    """
    valid: dict[str, Descriptor] = {}
    rejected: list[tuple[str, Refusal]] = []
    for subkey, value in entries:
        who = subkey if isinstance(subkey, str) else repr(subkey)[:64]
        try:
            desc = open_descriptor(value)
        except MessageRejected as e:
            rejected.append((who, Refusal(BatchRejection.BAD_DESCRIPTOR, e.reason)))
            continue
        if desc.publisher != subkey:
            rejected.append((who, Refusal(BatchRejection.WRONG_SUBKEY, f"descriptor of {desc.publisher[-6:]}")))
            continue
        stale = desc.expires <= now or desc.created < since or desc.created > now + limits.MAX_CLOCK_SKEW_S
        if desc.publisher == own or stale or desc.payload_digest in fetched:
            continue
        valid[desc.payload_digest] = desc
    order = sorted(valid.values(), key=lambda d: (-d.created, rng.random()))
    return order[: max(limit, 0)], rejected


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
        self._fetched: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(
            ("bytes_in", "bytes_out", "fetch_ok", "fetch_failed", "published", "publish_failed", "served"), 0
        )
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
            self.membership.run(p2p.remove_binary_stream_handler(self.handler_name), self.cfg.dht_timeout_s)
        except Exception as e:  # closing: the P2P side may already be gone
            logger.debug("%s removing handler: %s", self._tag(), e)
        with self._lock:
            self._served.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

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
        ok = self._store(window_key(self.membership.cfg.swarm_id, created, self.cfg.window_s), desc)
        self._count(published=int(ok), publish_failed=int(not ok))
        logger.info("%s published %s (%d bytes, stored=%s)", self._tag(), digest[:12], len(payload), ok)
        return desc

    def _store(self, key: str, desc: Descriptor) -> bool:
        sealed = seal_descriptor(desc, self.membership.identity.key)
        dht = self.membership.dht
        if dht is None:
            return False
        future = dht.store(key, sealed, desc.expires, subkey=self.peer_id, return_future=True)
        try:
            return bool(future.result(timeout=self.cfg.dht_timeout_s))
        except Exception as e:
            future.cancel()
            logger.warning("%s DHT store of %s failed: %s", self._tag(), key, e or type(e).__name__)
            return False

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
        finally:
            writer.close()

    # ---- collecting -------------------------------------------------------------------------

    def collect(self, since: float, limit: int) -> CollectResult:
        """Fetch and verify up to ``limit`` other peers' batches announced since ``since``.

        Bounded by ``collect_timeout_s``; never raises for network trouble.
        """
        start = time.monotonic()
        deadline = start + self.cfg.collect_timeout_s
        now = float(self._clock())
        entries = self._read_entries(now, deadline)
        with self._lock:
            fetched = set(self._fetched)
        chosen, rejected = select_descriptors(
            entries, own=self.peer_id, now=now, since=since, fetched=fetched, limit=limit, rng=self._rng
        )
        results = self._fetch_all(chosen, deadline - time.monotonic())
        failed: list[tuple[str, str]] = []
        accepted = self._verify_all(chosen, results, rejected, failed)
        elapsed = time.monotonic() - start
        logger.info(
            "%s collected %d of %d chosen (%d seen, %d rejected, %d failed) in %.2fs",
            self._tag(), len(accepted), len(chosen), len(entries), len(rejected), len(failed), elapsed,
        )  # fmt: skip
        return CollectResult(accepted, rejected, len(entries), elapsed, failed)

    def _read_entries(self, now: float, deadline: float) -> list[tuple[Any, Any]]:
        """Raw (subkey, value) pairs under the current and previous window keys."""
        dht = self.membership.dht
        if dht is None:
            return []
        swarm_id, window = self.membership.cfg.swarm_id, self.cfg.window_s
        keys = [window_key(swarm_id, now, window), window_key(swarm_id, now - window, window)]
        futures = [dht.get(key, latest=True, return_future=True) for key in keys]
        entries: list[tuple[Any, Any]] = []
        for key, future in zip(keys, futures, strict=True):
            budget = max(0.0, min(self.cfg.dht_timeout_s, deadline - time.monotonic()))
            try:
                found = future.result(timeout=budget)
            except Exception as e:
                future.cancel()
                logger.warning("%s DHT read of %s failed: %s", self._tag(), key, e or type(e).__name__)
                continue
            if found is not None and isinstance(found.value, dict):
                entries.extend((subkey, item.value) for subkey, item in found.value.items())
        return entries

    def _fetch_all(self, chosen: list[Descriptor], budget: float) -> dict[str, bytes | str]:
        """Payload bytes, or a failure reason, per chosen digest."""
        if not chosen:
            return {}
        if budget <= 0:
            return {d.payload_digest: "collect deadline" for d in chosen}
        try:
            result: dict[str, bytes | str] = self.membership.run(self._fetch_many(chosen, budget), budget + 2.0)
            return result
        except Exception as e:  # the loop itself is stuck or gone
            logger.warning("%s fetching failed as a whole: %s", self._tag(), e or type(e).__name__)
            return {d.payload_digest: "collect deadline" for d in chosen}

    async def _fetch_many(self, chosen: list[Descriptor], budget: float) -> dict[str, bytes | str]:
        slots = asyncio.Semaphore(self.cfg.max_parallel_fetches)

        async def one(desc: Descriptor) -> bytes | str:
            async with slots:
                return await self._fetch_one(desc)

        tasks = {d.payload_digest: asyncio.create_task(one(d)) for d in chosen}
        done, pending = await asyncio.wait(tasks.values(), timeout=budget)
        for task in pending:
            task.cancel()
        return {dg: task.result() if task in done else "collect deadline" for dg, task in tasks.items()}

    async def _fetch_one(self, desc: Descriptor) -> bytes | str:
        try:
            coro = fetch_one(
                self.membership.p2p, desc.publisher, self.handler_name, desc.payload_digest,
                desc.payload_size, self.cfg.chunk_bytes,
            )  # fmt: skip
            return await asyncio.wait_for(coro, self.cfg.fetch_timeout_s)
        except TimeoutError:
            return "fetch timeout"
        except FetchError as e:
            return e.reason
        except Exception as e:  # never let one bad peer break the collect
            return f"fetch failed: {type(e).__name__}: {e}"[:200]

    def _verify_all(
        self,
        chosen: list[Descriptor],
        results: dict[str, bytes | str],
        rejected: list[tuple[str, Refusal]],
        failed: list[tuple[str, str]],
    ) -> list[tuple[Descriptor, RolloutBatch]]:
        accepted: list[tuple[Descriptor, RolloutBatch]] = []
        for desc in chosen:
            result = results.get(desc.payload_digest, "collect deadline")
            if isinstance(result, str):
                self._count(fetch_failed=1)
                failed.append((desc.publisher, result))
                logger.info("%s fetch from %s failed: %s", self._tag(), desc.publisher[-6:], result)
                continue
            self._count(bytes_in=len(result))
            try:
                accepted.append((desc, verify_payload(desc, result)))
                self._count(fetch_ok=1)
                self._remember(desc.payload_digest)
            except PayloadRejected as e:
                self._count(fetch_failed=1)
                rejected.append((desc.publisher, e.refusal))
                if e.refusal.reason not in (BatchRejection.DIGEST_MISMATCH, BatchRejection.SIZE_MISMATCH):
                    self._remember(desc.payload_digest)  # right bytes, bad content: never valid
                logger.warning("%s rejected payload from %s: %s", self._tag(), desc.publisher[-6:], e.reason)
        return accepted

    def _remember(self, digest: str) -> None:
        with self._lock:
            self._fetched[digest] = None
            while len(self._fetched) > self.cfg.remember_fetched:
                self._fetched.popitem(last=False)
