"""One round's reduce-scatter + all-gather on our own P2P streams, and state serving.

Member i of a sorted group of n owns slice i of the flat pseudo-gradient.
Every member opens one stream to every other owner j, sends its (encoded)
part of slice j, and reads back, on the same stream and while it still sends,
the bytes owner j produces by reducing all n parts piece by piece as they land
(:mod:`swarm.sync.pieces`), each weighted by the inner steps its header claims
(capped, see :func:`swarm.sync.robust.clamp_weights`) and clipped by the norm
it claims. The owner takes its own slice from those same bytes. So every
member assembles the average from exactly the reducers' bytes, and members
that finish hold bit-identical averages.

Streams are authenticated by libp2p (the remote peer id comes from the
connection, not from the message). Every header names the group id, the
revision and the slice; any mismatch, any bad size or non-finite value, any
peer error and the round deadline fail the round on this member and make its
slice's reducer refuse everyone else, so a failure spreads fast.

A part for a group this member has not registered yet waits (its own DHT
reads may finish later than the sender's) only while this member is itself
matchmaking or reducing at the part's revision and has read the sender's join
record (:meth:`SyncService.expect`), and at most ``MAX_WAITING_PER_PEER`` /
``MAX_WAITING`` such parts wait at once; any other group id is refused at
once. The ``ping`` op answers at once: members probe each other's liveness
with it (:mod:`swarm.sync.liveness`).

The ``state`` op serves this member's current state to whoever asks (a
newcomer's catch-up), within a budget (:mod:`swarm.sync.serving`): at most
``max_state_serves`` downloads at once and one per asking peer, all sharing one
serialized copy of the state, each cut off at its own deadline; an ask past the
budget is refused at once and the asker tries its next donor.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from swarm.sync import direct
from swarm.sync.channel import (
    Channel,
    SocketChannel,
    StreamChannel,
    both,
    piece_buffer,
    recv_piece,
    recv_pieces,
)
from swarm.sync.config import AbortCause, SyncAborted
from swarm.sync.dialhints import DialHints
from swarm.sync.direct import host_of
from swarm.sync.errors import BadBytes, GroupMismatch, PeerLost
from swarm.sync.notices import EarlyNotices, cause_of, notice, tell, worth_telling
from swarm.sync.pieces import Part, SliceReduction
from swarm.sync.points import Observer, RoundPoint
from swarm.sync.records import valid_origin
from swarm.sync.robust import Suspicion, as_array, norm
from swarm.sync.serving import ServeBudget, ServeRefusal, SharedStates
from swarm.sync.tensors import decode_into, encoded_size, from_bytes, slice_bounds
from swarm.sync.tensors import state_hash as compute_state_hash
from swarm.sync.transport import Opened, Streams
from swarm.sync.wire import check_ok, check_weight, read_header, read_payload, send_error, write_frame, write_head

logger = logging.getLogger(__name__)

MAX_WAITING_PER_PEER = 4
"""Parts from one sender that may wait at once for this member to register their group."""
MAX_WAITING = 64
"""Parts from all senders that may wait at once (bounds what a flood of streams can hold)."""
MAX_PINGS = 32
"""Outbound one-frame asks (pings, abort notices) dialling at once (a page of ghost join records cannot
open hundreds of dials)."""
PING_TRIES = 2
"""Pings per check when the stream closes before an answer (a timeout or a dial error is not retried)."""
INDIRECT_FOR_S = 600.0
"""How long a member sends on the P2P stream to an owner it could not reach directly."""
MAX_STATE_SERVES = 4
"""State downloads served at once unless the constructor says otherwise (OuterSyncConfig.max_state_serves)."""
STATE_DEADLINE_S = 60.0
"""Bound on serving one state download unless the constructor says otherwise (OuterSyncConfig.state_bound_s)."""


@dataclass(frozen=True)
class RoundPlan:
    """Everything members agreed on for one round; ``deadline`` is absolute (service clock)."""

    group_id: str
    revision: int
    members: tuple[str, ...]
    n_elems: int
    compression: str
    aggregator: str
    trim_fraction: float
    deadline: float
    clip_factor: float = 4.0
    max_weight_ratio: float = 4.0
    skip: int = 0
    """A commit takes revision ``revision + 1 + skip`` (see :class:`swarm.sync.decide.GroupDecision`)."""

    def bounds(self) -> list[tuple[int, int]]:
        return slice_bounds(self.n_elems, len(self.members))


@dataclass(frozen=True)
class Snapshot:
    """Immutable outer state: replaced as a whole, never mutated, so it can be served any time."""

    revision: int
    state_hash: str
    anchor: torch.Tensor
    momentum: torch.Tensor
    origin: str = ""
    """The history this state belongs to (hashed into ``state_hash``; "" before any commit): see
    :mod:`swarm.sync.merge`."""


@dataclass(frozen=True)
class AllReduceResult:
    """The average the reducers returned, decoded (member order), the sha256 of each slice's exact bytes,
    and what this member sent."""

    average: np.ndarray
    digests: list[bytes]
    bytes_sent: int
    flagged: dict[str, Suspicion] = field(default_factory=dict)
    """Members whose parts this member, as reducer of its slice, clipped."""
    own_norms: list[float] = field(default_factory=list)
    """The norm of this member's part of each slice, as it was before the round (empty for weight 0)."""


class _Round:
    """Owner-side state of one round: this member's slice, reduced piece by piece (:mod:`swarm.sync.pieces`)."""

    def __init__(self, plan: RoundPlan, index: int, me: str, dest: np.ndarray, remaining: Callable[[], float]) -> None:
        self.plan, self.index = plan, index
        lo, hi = plan.bounds()[index]
        self.n = hi - lo
        rule = (plan.aggregator, plan.trim_fraction, plan.clip_factor, plan.max_weight_ratio)
        prefix = f"[{me[-6:]} rev={plan.revision}] slice {index}:"
        self.red = SliceReduction(plan.members, me, self.n, plan.compression, rule, dest, remaining, prefix)
        self.replied = 0
        self.all_replied = asyncio.Event()
        """Set once this member's reply stream to every other member is written (or failed)."""

    def reply_done(self) -> None:
        self.replied += 1
        if self.replied >= len(self.plan.members) - 1:
            self.all_replied.set()

    def fail(self, reason: str, cause: AbortCause = AbortCause.ALLREDUCE_FAILED) -> None:
        self.red.fail(reason, cause)


class SyncService:
    """Serves slice reductions and state snapshots; runs rounds. All methods run on the P2P loop."""

    def __init__(
        self,
        streams: Streams,
        name: str,
        me: str,
        chunk_timeout: float,
        snapshot: Callable[[], Snapshot],
        clock: Callable[[], float] = time.time,
        observe: Observer | None = None,
        register_timeout: float = 10.0,
        direct_host: str | None = None,
        direct_send: bool | None = None,
        max_state_serves: int = MAX_STATE_SERVES,
        state_deadline: float = STATE_DEADLINE_S,
    ) -> None:
        self._streams, self._name, self._me = streams, name, me
        # payloads on direct TCP connections (swarm.sync.direct): taken on a listener on ``direct_host``
        # (None: on P2P streams), sent to owners that offer one when ``direct_send`` (default: if listening)
        self._listener = direct.Listener(direct_host) if direct_host is not None else None
        self._direct_send = direct_host is not None if direct_send is None else direct_send
        self._indirect: dict[str, float] = {}
        """Owners this member could not reach directly, until when (service clock) it sends them on the stream."""
        self._chunk_timeout = chunk_timeout
        # how long a part may wait for this member to reach the same group decision (its DHT
        # reads may finish later than the sender's); the sender's round deadline bounds it too
        self._register_timeout = register_timeout
        self._snapshot, self._clock, self._observe = snapshot, clock, observe
        self._rounds: dict[str, _Round] = {}
        self._finished: deque[str] = deque(maxlen=64)
        # (revision, joiners read) while this member matchmakes or reduces; None otherwise
        self._expected: tuple[int, frozenset[str]] | None = None
        self._waiting: dict[str, int] = {}
        self._ping_slots: asyncio.Semaphore | None = None  # made on the loop, at first use
        self._early = EarlyNotices()
        self._notices: set[asyncio.Future[int]] = set()
        """Abort notices this member is sending (swarm.sync.notices), held so they are not collected."""
        self.hints = DialHints()
        """Peers' published addresses, dialled when one cannot be reached otherwise (swarm.sync.dialhints)."""
        # state downloads (swarm.sync.serving): a stalled reader frees its slot at ``state_deadline``
        self._serves = ServeBudget(max_state_serves)
        self._states = SharedStates()
        self._state_deadline = state_deadline

    @property
    def serve_refusals(self) -> dict[ServeRefusal, int]:
        """State downloads refused at once, by reason (the budget of swarm.sync.serving)."""
        return self._serves.refusals

    @property
    def state_builds(self) -> int:
        """States serialized for downloads so far: one per state hash asked for, however many asked."""
        return self._states.builds

    async def start(self) -> None:
        if self._listener is not None:
            await self._listener.start()
        await self._streams.serve(self._name, self._handle)

    async def stop(self) -> None:
        for rnd in list(self._rounds.values()):
            rnd.fail("shutting down", AbortCause.SHUTTING_DOWN)
        for t in list(self._notices):
            t.cancel()
        try:
            await self._streams.unserve(self._name)
        except Exception as e:
            logger.debug("[%s] removing stream handler: %s", self._me[-6:], e)
        if self._listener is not None:
            await self._listener.stop()

    def expect(self, revision: int, joiners: Collection[str]) -> None:
        """Let parts of ``revision`` from ``joiners`` wait for this member's group (thread-safe: one store)."""
        self._expected = (revision, frozenset(joiners))

    def expect_nothing(self) -> None:
        """Out of matchmaking and all-reduce: refuse every unregistered group id at once."""
        self._expected = None

    def _passed(self, point: RoundPoint, revision: int) -> None:
        if self._observe is not None:
            self._observe(point, revision)

    def _remaining(self, plan: RoundPlan) -> float:
        return max(0.01, plan.deadline - self._clock())

    # ---- serving side -------------------------------------------------------------------------

    async def _handle(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header = await read_header(reader, self._chunk_timeout)
            if header.get("op") == "part":
                await self._serve_part(sender, header, reader, writer)
            elif header.get("op") == "ping":
                await write_frame(writer, {"ok": True}, b"", self._chunk_timeout)
            elif header.get("op") == "state":
                await self._serve_state(sender, writer)
            elif header.get("op") == "abort":
                self._member_gave_up(sender, header)
                await write_frame(writer, {"ok": True}, b"", self._chunk_timeout)
            else:
                await send_error(writer, "unknown op", self._chunk_timeout)
        except Exception as e:  # a server never crashes on a peer's stream: refuse and log
            reason = e.reason if isinstance(e, SyncAborted) else f"{type(e).__name__}"
            logger.debug("[%s] refused a stream: %s", self._me[-6:], reason)
            await send_error(writer, reason, self._chunk_timeout)
        finally:
            writer.close()

    def _may_wait(self, sender: str, revision: Any) -> bool:
        expected = self._expected
        return expected is not None and expected[0] == revision and sender in expected[1]

    async def _wait_round(self, gid: Any, sender: str, revision: Any) -> _Round:
        if gid in self._rounds:
            return self._rounds[gid]
        if gid in self._finished:
            raise GroupMismatch("round already over")
        if not self._may_wait(sender, revision):
            raise GroupMismatch("unknown group id")
        waiting = self._waiting.get(sender, 0)
        if waiting >= MAX_WAITING_PER_PEER or sum(self._waiting.values()) >= MAX_WAITING:
            raise GroupMismatch("too many parts waiting")
        self._waiting[sender] = waiting + 1
        try:
            end = self._clock() + self._register_timeout
            while self._clock() < end and self._may_wait(sender, revision):
                await asyncio.sleep(0.01)
                if gid in self._rounds:
                    return self._rounds[gid]
                if gid in self._finished:
                    raise GroupMismatch("round already over")
        finally:
            self._waiting[sender] -= 1
            if not self._waiting[sender]:
                del self._waiting[sender]
        raise GroupMismatch("unknown group id")

    async def _serve_part(
        self, sender: str, header: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        rnd = await self._wait_round(header.get("group"), sender, header.get("revision"))
        plan = rnd.plan
        if sender not in plan.members or sender == self._me:  # refused, but no reason to fail the round
            raise GroupMismatch(f"{sender[-6:]} is not a member")
        sock: socket.socket | None = None
        joined, replying = False, asyncio.Event()
        try:
            if header.get("revision") != plan.revision or header.get("slice") != rnd.index:
                raise GroupMismatch("revision or slice differs")
            weight = check_weight(header.get("weight"))
            expected = encoded_size(rnd.n, plan.compression) if weight else 0
            claim = header.get("norm") if weight else None
            if weight and not isinstance(claim, float):
                raise BadBytes("a part header without its norm")
            digest: bytes | None = None
            if header.get("direct") is True:
                sock, digest, inline = await self._accept_direct(rnd, header, reader, writer)
                header = inline or header
            if sock is None and header["size"] != expected:
                raise BadBytes(f"part of {header['size']} bytes, expected {expected}")
            rnd.red.join(sender, weight, claim)
            joined = True
            channel: Channel = (
                SocketChannel(sock, self._chunk_timeout) if sock else StreamChannel(reader, writer, self._chunk_timeout)
            )
            reply = self._send_reduced(rnd, writer, sock, replying)
            await both(self._receive_part(rnd, sender, channel, digest, weight), reply)
        except (SyncAborted, TimeoutError) as e:
            if isinstance(e, SyncAborted):
                rnd.fail(e.reason, e.cause)
            else:
                rnd.fail("part timeout", AbortCause.ALLREDUCE_TIMEOUT)
            if replying.is_set():  # no error frame inside a payload: closing the stream says it
                logger.debug("[%s] cut a reply to %s: %s", self._me[-6:], sender[-6:], rnd.red.failed or e)
                return
            raise
        except Exception as e:  # a connection error: the same, and the round goes on for the others
            if replying.is_set():
                logger.debug("[%s] lost the reply to %s: %s", self._me[-6:], sender[-6:], type(e).__name__)
                return
            raise
        finally:
            if joined:
                rnd.reply_done()
            direct.close(sock)

    async def _accept_direct(
        self, rnd: _Round, header: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[socket.socket | None, bytes | None, dict[str, Any] | None]:
        """Offer a ticket; the sender's direct connection and the sha256 its part must match, or the inline
        header it sent instead, to send its part on the stream."""
        digest = header.get("sha256")
        if header["size"] != 0 or not isinstance(digest, bytes) or len(digest) != 32:
            raise BadBytes("direct part header without a sha256, or with a payload")
        if self._listener is None:  # direct payloads off here: port 0 asks for the part on the stream
            await write_frame(writer, {"ok": True, "port": 0, "ticket": b""}, b"", self._chunk_timeout)
            return None, None, await self._inline_header(rnd, reader)
        ticket, arrived = self._listener.issue()
        inline: asyncio.Future[dict[str, Any]] | None = None
        try:
            await write_frame(
                writer, {"ok": True, "port": self._listener.port, "ticket": ticket}, b"", self._chunk_timeout
            )
            inline = asyncio.ensure_future(self._inline_header(rnd, reader))
            either: set[asyncio.Future[Any]] = {arrived, inline}
            done, _ = await asyncio.wait(either, timeout=self._remaining(rnd.plan), return_when=asyncio.FIRST_COMPLETED)
            if arrived in done:
                return self._listener.take(ticket), digest, None
            if inline in done:
                return None, None, await inline
            raise TimeoutError
        finally:
            if inline is not None and not inline.done():
                inline.cancel()
            elif inline is not None and not inline.cancelled():
                inline.exception()  # the part came directly: the stream's end (it may close) is moot
            self._listener.revoke(ticket)

    async def _inline_header(self, rnd: _Round, reader: asyncio.StreamReader) -> dict[str, Any]:
        header = await read_header(reader, self._remaining(rnd.plan))
        if header.get("op") != "inline":
            raise BadBytes("expected the part inline")
        return header

    async def _receive_part(
        self, rnd: _Round, sender: str, channel: Channel, digest: bytes | None, weight: int
    ) -> None:
        """Take ``sender``'s part piece by piece into the reduction's slots (checked against ``digest``,
        the sha256 announced on the stream, when it came on a direct connection)."""
        red, compression = rnd.red, rnd.plan.compression
        if weight:
            hasher = hashlib.sha256() if digest is not None else None
            raw = piece_buffer(compression)
            for k in range(len(red.pieces)):
                await recv_piece(channel, await red.slot(sender, k), compression, hasher, raw)
                red.landed(sender, k)
            if hasher is not None and hasher.digest() != digest:
                raise BadBytes("payload does not match its sha256")
        red.complete(sender)

    async def _send_reduced(
        self, rnd: _Round, writer: asyncio.StreamWriter, sock: socket.socket | None, replying: asyncio.Event
    ) -> None:
        """Send the reduced slice back piece by piece as it is made: on the stream, or on the sender's direct
        connection with its sha256 after it on the stream."""
        red, timeout = rnd.red, self._chunk_timeout
        await red.piece(0)  # a round that fails before its first piece still answers with its reason
        size = encoded_size(rnd.n, rnd.plan.compression)
        replying.set()
        if sock is None:
            await write_head(writer, {"ok": True}, size, timeout)
            channel: Channel = StreamChannel(None, writer, timeout)
        else:
            await write_frame(writer, {"ok": True, "bytes": size}, b"", timeout)
            channel = SocketChannel(sock, timeout)
        for k in range(len(red.pieces)):
            await channel.send(await red.piece(k))
        if sock is not None:
            await write_frame(writer, {"ok": True, "sha256": red.digest}, b"", timeout)

    async def _serve_state(self, peer: str, writer: asyncio.StreamWriter) -> None:
        """Send this member's current state to ``peer`` within the serving budget and its deadline."""
        refusal = self._serves.take(peer)
        if refusal is not None:
            raise SyncAborted(f"state not served: {refusal.value}", AbortCause.PEER_REFUSED)
        try:
            await asyncio.wait_for(self._send_state(writer), self._state_deadline)
        except TimeoutError:
            # a reader stalled past the deadline (or one chunk's timeout): no error frame can follow a payload
            # already begun, and what the transport still buffers for it goes now, not when it reads
            logger.debug("[%s] cut a state download to %s: too slow", self._me[-6:], peer[-6:])
            writer.transport.abort()
        finally:
            self._serves.release(peer)

    async def _send_state(self, writer: asyncio.StreamWriter) -> None:
        snap = self._snapshot()
        held = self._states.hold(snap.state_hash, lambda: self._serialize(snap))
        if held is None:
            reason = self._serves.refuse(ServeRefusal.STATES_HELD).value
            raise SyncAborted(f"state not served: {reason}", AbortCause.PEER_REFUSED)
        try:
            payload = await asyncio.shield(held)  # a download cut off while it builds leaves it to the others
            header = {"ok": True, "revision": snap.revision, "state_hash": snap.state_hash, "n": snap.anchor.numel()}
            header["origin"] = snap.origin
            await write_frame(writer, header, payload, self._chunk_timeout)
        finally:
            self._states.let_go(snap.state_hash, self._snapshot().state_hash)

    @staticmethod
    async def _serialize(snap: Snapshot) -> memoryview:
        """The anchor then the momentum as float32 little-endian bytes, in one buffer (read-only: it is shared)."""

        def build() -> memoryview:
            n = snap.anchor.numel()
            out = np.empty(n + snap.momentum.numel(), dtype="<f4")
            out[:n], out[n:] = as_array(snap.anchor), as_array(snap.momentum)
            return out.view(np.uint8).data.toreadonly()  # bytes, whatever this machine's byte order

        return await asyncio.get_running_loop().run_in_executor(None, build)

    # ---- calling side -------------------------------------------------------------------------

    async def allreduce(
        self, plan: RoundPlan, flat: torch.Tensor, weight: int, in_place: bool = False
    ) -> AllReduceResult:
        """Run one round; return the reducers' bytes, or raise SyncAborted (never partial).

        ``in_place``: the average is written into ``flat``'s own memory (it is lost, whatever the outcome).
        Safe for what is sent: a reduced piece of slice j comes back only once its owner holds this member's
        piece of it, so every byte of ``flat`` it overwrites has been sent.
        """
        index = plan.members.index(self._me)
        # every slice lands in one buffer as its bytes arrive, hashed on the way: nothing to concatenate
        average = as_array(flat) if in_place else np.empty(plan.n_elems, dtype=np.float32)
        lo, hi = plan.bounds()[index]
        rnd = _Round(plan, index, self._me, average[lo:hi], lambda: self._remaining(plan))
        self._rounds[plan.group_id] = rnd
        early = self._early.take(plan.group_id, plan.members)
        background: list[asyncio.Future[None]] = []
        try:
            if early is not None:  # a member's notice came before this member's own DHT reads decided
                raise SyncAborted(f"{early[0][-6:]} gave up ({early[1]})", AbortCause.ABORTED_BY_MEMBER)
            return await self._allreduce(plan, rnd, flat, weight, average, background)
        except SyncAborted as e:
            raise self._give_up(rnd, e) from None
        except TimeoutError:
            raise self._give_up(rnd, SyncAborted("all-reduce timeout", AbortCause.ALLREDUCE_TIMEOUT)) from None
        except Exception as e:  # P2P daemon and connection errors of any kind
            rnd.fail(type(e).__name__)
            raise self._give_up(rnd, SyncAborted(f"all-reduce failed: {type(e).__name__}: {e}")) from None
        finally:
            for t in background:
                t.cancel()
            self._rounds.pop(plan.group_id, None)
            self._finished.append(plan.group_id)

    def _give_up(self, rnd: _Round, e: SyncAborted) -> SyncAborted:
        """Fail ``rnd`` here and, unless a partner's notice failed it, tell the partners (swarm.sync.notices)."""
        rnd.fail(e.reason, e.cause)
        plan, root = rnd.plan, rnd.red.failed or e
        if worth_telling(root.cause, plan.deadline - self._clock()):
            partners = [m for m in plan.members if m != self._me]
            header = notice(plan.group_id, plan.revision, root.cause)
            task = asyncio.ensure_future(tell(self.ask, partners, header))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)
        return e

    def _member_gave_up(self, sender: str, header: dict[str, Any]) -> None:
        """A partner's abort notice: fail the round it names, or keep it for a round this member is about to
        register (as a part would wait); GroupMismatch for anything else."""
        gid, revision, cause = header.get("group"), header.get("revision"), cause_of(header)
        rnd = self._rounds.get(gid) if isinstance(gid, str) else None
        if rnd is not None and sender != self._me and sender in rnd.plan.members and revision == rnd.plan.revision:
            logger.info("[%s rev=%d] %s gave up on the round (%s)", self._me[-6:], revision, sender[-6:], cause)
            rnd.fail(f"{sender[-6:]} gave up ({cause})", AbortCause.ABORTED_BY_MEMBER)
        elif rnd is None and isinstance(gid, str) and gid not in self._finished and self._may_wait(sender, revision):
            self._early.keep(gid, sender, cause)
        else:
            raise GroupMismatch("no round of this member's to end")

    async def _allreduce(
        self,
        plan: RoundPlan,
        rnd: _Round,
        flat: torch.Tensor,
        weight: int,
        average: np.ndarray,
        background: list[asyncio.Future[None]],
    ) -> AllReduceResult:
        bounds = plan.bounds()
        loop = asyncio.get_running_loop()
        parts, own_norms = await loop.run_in_executor(None, self._encode_parts, plan, flat, weight)
        red = rnd.red
        background.append(asyncio.ensure_future(red.run(lambda: self._passed(RoundPoint.REDUCED, plan.revision))))
        background.append(asyncio.ensure_future(self._feed_own(rnd, parts[rnd.index], weight)))
        tasks: list[asyncio.Future[bytes]] = []
        for j, (a, b) in enumerate(bounds):
            if j == rnd.index:
                tasks.append(asyncio.ensure_future(self._own_slice(rnd)))
            else:
                tasks.append(asyncio.ensure_future(self._exchange(plan, j, weight, parts[j], average[a:b])))
        watched: list[asyncio.Future[Any]] = [*tasks, *background]
        for t in watched:  # a task that fails after the round gave up on it: no "never retrieved"
            t.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, pending = await asyncio.wait(tasks, timeout=self._remaining(plan), return_when=asyncio.FIRST_EXCEPTION)
        for t in pending:
            t.cancel()
        errors = [e for e in (t.exception() for t in done if not t.cancelled()) if e is not None]
        if errors:
            raise errors[0]
        if pending:
            raise SyncAborted("all-reduce timeout", AbortCause.ALLREDUCE_TIMEOUT)
        # every member got this one's slice before it moves on to vote: a member that stops
        # after its all-reduce then costs the others a missing vote, not a failed all-reduce
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rnd.all_replied.wait(), min(self._chunk_timeout, self._remaining(plan)))
        sent = sum(p.size for j, p in enumerate(parts) if j != rnd.index)
        total = sent + (len(plan.members) - 1) * encoded_size(rnd.n, plan.compression)
        return AllReduceResult(average, [t.result() for t in tasks], total, dict(red.flagged), own_norms)

    def _encode_parts(self, plan: RoundPlan, flat: torch.Tensor, weight: int) -> tuple[list[Part], list[float]]:
        """This member's part of every slice (the sha256 of its bytes for a direct connection, the norm its
        owner will compute of them), and each part's own norm."""
        if not weight:
            return [Part.of(None, plan.compression, False) for _ in plan.bounds()], []
        parts = [Part.of(flat[a:b], plan.compression, self._direct_send) for a, b in plan.bounds()]
        if plan.compression == "none":
            return parts, [p.claim or 0.0 for p in parts]
        return parts, [norm(flat[a:b]) for a, b in plan.bounds()]

    async def _feed_own(self, rnd: _Round, part: Part, weight: int) -> None:
        """This member's own part of its slice, piece by piece into its reduction (as the others see it)."""
        red = rnd.red
        try:
            red.join(self._me, weight, part.claim)
            for k, data in enumerate(part.pieces()):
                decode_into(data, await red.slot(self._me, k), rnd.plan.compression)
                red.landed(self._me, k)
            red.complete(self._me)
        except SyncAborted as e:
            red.fail(e.reason, e.cause)

    async def _own_slice(self, rnd: _Round) -> bytes:
        """Wait for this member's own reduction (it lands in the average itself); return its bytes' sha256."""
        await rnd.red.done()
        return rnd.red.digest

    async def _exchange(self, plan: RoundPlan, j: int, weight: int, part: Part, dest: np.ndarray) -> bytes:
        """Send this member's part of slice ``j`` to its owner while the reduced slice it returns streams into
        ``dest``; return the sha256 of that slice's bytes."""
        self._passed(RoundPoint.SEND, plan.revision)
        peer = plan.members[j]
        timeout = min(self._chunk_timeout, self._remaining(plan))
        opened = await asyncio.wait_for(self._streams.open(peer, self._name), timeout)
        reader, writer = opened.reader, opened.writer
        host = host_of(opened.addr) if self._direct_send else None
        if self._indirect.get(peer, 0.0) > self._clock():
            host = None
        sock: socket.socket | None = None
        try:
            header: dict[str, Any] = {"op": "part", "group": plan.group_id, "revision": plan.revision, "slice": j}
            header["weight"] = weight
            if weight:
                header["norm"] = part.claim
            if host is None:
                await write_head(writer, header, part.size, self._chunk_timeout)
            else:
                sock = await self._send_direct(plan, peer, host, header, part, reader, writer)
            if sock is not None:
                channel: Channel = SocketChannel(sock, self._chunk_timeout)
            else:
                channel = StreamChannel(reader, writer, self._chunk_timeout)
            receive = self._receive_reduced(plan, j, reader, sock, channel, dest)
            return await both(receive, self._send_part(plan, channel, part))
        finally:
            writer.close()
            direct.close(sock)

    async def _send_part(self, plan: RoundPlan, channel: Channel, part: Part) -> None:
        for data in part.pieces():
            await channel.send(data)
        self._passed(RoundPoint.SENT, plan.revision)

    async def _receive_reduced(
        self,
        plan: RoundPlan,
        j: int,
        reader: asyncio.StreamReader,
        sock: socket.socket | None,
        channel: Channel,
        dest: np.ndarray,
    ) -> bytes:
        """The reduced slice ``j`` into ``dest`` as it streams in; the sha256 of its bytes (checked against the
        one the owner sends after them on the stream, when they came on a direct connection)."""
        reply = await read_header(reader, self._remaining(plan))
        check_ok(reply)
        expected = encoded_size(dest.size, plan.compression)
        hasher = hashlib.sha256()
        if sock is None:
            if reply["size"] != expected:
                raise BadBytes(f"slice {j} of {reply['size']} bytes, expected {expected}")
            await recv_pieces(channel, dest, plan.compression, hasher)
            return hasher.digest()
        if reply.get("bytes") != expected or reply["size"] != 0:
            raise BadBytes(f"slice {j} of {reply.get('bytes')} bytes, expected {expected}")
        await recv_pieces(channel, dest, plan.compression, hasher)
        trailer = await read_header(reader, self._remaining(plan))
        check_ok(trailer)
        if trailer.get("sha256") != hasher.digest():
            raise BadBytes("payload does not match its sha256")
        return hasher.digest()

    async def _send_direct(
        self,
        plan: RoundPlan,
        peer: str,
        host: str,
        header: dict[str, Any],
        part: Part,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> socket.socket | None:
        """Announce the part's sha256, take the owner's ticket, and open a direct connection to the address of
        this stream's connection. Returns the connection, or None after announcing the part on the stream
        because the owner could not be reached (then not tried again for ``INDIRECT_FOR_S``)."""
        me, rev = self._me[-6:], plan.revision
        await write_frame(writer, {**header, "direct": True, "sha256": part.digest}, b"", self._chunk_timeout)
        offer = await read_header(reader, self._remaining(plan))
        check_ok(offer)
        port, ticket = offer.get("port"), offer.get("ticket")
        if port == 0:  # the owner takes payloads on streams only
            await write_head(writer, {"op": "inline"}, part.size, self._chunk_timeout)
            return None
        if not (isinstance(port, int) and 0 < port < 65536 and isinstance(ticket, bytes) and len(ticket) == 16):
            raise BadBytes("malformed direct offer")
        try:
            return await direct.connect(host, port, ticket, min(direct.CONNECT_TIMEOUT_S, self._remaining(plan)))
        except (OSError, TimeoutError) as e:
            # not reachable (NAT, a relay), or turned away before the owner took the ticket (its greeting
            # slots all taken by a flood): no ACK, so the owner is still waiting for either path
            why = type(e).__name__
            logger.info("[%s rev=%d] %s not reachable directly (%s): sending on the stream", me, rev, peer[-6:], why)
            self._indirect[peer] = self._clock() + INDIRECT_FOR_S
        await write_head(writer, {"op": "inline"}, part.size, self._chunk_timeout)
        return None

    async def ping(self, peer: str, timeout: float) -> bool:
        """Whether ``peer`` answers a ping on this service's stream within ``timeout`` s (never raises)."""
        end = self._clock() + timeout
        for _ in range(PING_TRIES):
            try:
                return await asyncio.wait_for(self.ask(peer, {"op": "ping"}), max(0.01, end - self._clock()))
            except (PeerLost, ConnectionError) as e:
                # the stream closed under us before any answer, as a live peer's daemon sometimes does to a
                # fresh stream under full CPU load; left out, that member would abort the round: ask once
                # more while the timeout lasts
                logger.debug("[%s] ping %s: stream closed (%s), asking again", self._me[-6:], peer[-6:], e)
            except Exception as e:  # unreachable, refused, timed out: all mean "did not answer"
                logger.debug("[%s] ping %s failed: %s", self._me[-6:], peer[-6:], type(e).__name__)
                if not await self._reconnect(peer, end - self._clock()):
                    return False
            if self._clock() >= end:
                break
        return False

    async def _dial(self, peer: str) -> Opened:
        """A stream to ``peer``'s handler of this service."""
        return await self._streams.open(peer, self._name)

    async def _reconnect(self, peer: str, timeout: float) -> bool:
        """Connect to ``peer`` through the addresses its own record published (see swarm.sync.dialhints).

        False (nothing to try) if it published none or was tried within RECONNECT_S.
        """
        addrs = self.hints.take(peer)
        if not addrs or timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._streams.connect(peer, addrs), timeout)
        except Exception as e:  # a malformed or wrong address, a refused handshake, a timeout: no route
            logger.debug("[%s] connect to %s through its addresses failed: %s", self._me[-6:], peer[-6:], e)
            return False
        logger.debug("[%s] connected to %s through its published addresses", self._me[-6:], peer[-6:])
        return True

    async def ask(self, peer: str, header: dict[str, Any]) -> bool:
        """Send ``header`` to ``peer``'s handler on a fresh stream; whether it answered ok (raises on a dial or
        stream error). At most ``MAX_PINGS`` dials at once."""
        if self._ping_slots is None:
            self._ping_slots = asyncio.Semaphore(MAX_PINGS)
        async with self._ping_slots:
            opened = await self._dial(peer)
        reader, writer = opened.reader, opened.writer
        try:
            await write_frame(writer, header, b"", self._chunk_timeout)
            return (await read_header(reader, self._chunk_timeout)).get("ok") is True
        finally:
            writer.close()

    async def fetch_state(self, donor: str, n: int, timeout: float, momentum_elems: int | None = None) -> Snapshot:
        """Download ``donor``'s current state; verify it hashes as announced and is finite.

        ``n``: the anchor's values; ``momentum_elems``: the momentum's (None: ``n``; 0 without momentum).
        """
        m = n if momentum_elems is None else momentum_elems
        end = self._clock() + timeout
        try:
            opened = await asyncio.wait_for(self._dial(donor), self._chunk_timeout)
        except Exception:
            if not await self._reconnect(donor, min(self._chunk_timeout, end - self._clock())):
                raise
            opened = await asyncio.wait_for(self._dial(donor), self._chunk_timeout)
        reader, writer = opened.reader, opened.writer
        try:
            await write_frame(writer, {"op": "state"}, b"", self._chunk_timeout)
            header = await read_header(reader, max(0.01, end - self._clock()))
            check_ok(header)
            if header.get("n") != n or header["size"] != 4 * (n + m):
                raise BadBytes(f"state of {header.get('n')} elements ({header['size']} bytes), expected {n}")
            payload = await read_payload(reader, 4 * (n + m), self._chunk_timeout)
        finally:
            writer.close()

        def verify() -> Snapshot:
            anchor, momentum = from_bytes(payload[: 4 * n], n), from_bytes(payload[4 * n :], m)
            origin = header.get("origin", "")
            if not valid_origin(origin):
                raise BadBytes("downloaded state names a malformed origin")
            digest = compute_state_hash(anchor, momentum, origin)
            revision = header.get("revision")
            if digest != header.get("state_hash") or not isinstance(revision, int) or isinstance(revision, bool):
                raise BadBytes("downloaded state does not match its hash")
            # a NaN or inf anchor would poison every later step (hash-valid bytes can still be garbage)
            if not (bool(torch.isfinite(anchor).all()) and bool(torch.isfinite(momentum).all())):
                raise BadBytes("downloaded state is not finite")
            return Snapshot(revision, digest, anchor, momentum, origin)

        return await asyncio.get_running_loop().run_in_executor(None, verify)
