"""A simulated network for the outer sync: in-memory streams and records on one virtual clock, with faults.

It implements :mod:`swarm.sync.transport` (streams, a record store, a loop)
for any number of members in one process, so the real :class:`OuterSync`
runs whole rounds without daemons, in a fraction of a second of wall time.

Time: one asyncio loop (:class:`VirtualLoop`) whose clock is virtual. When
nothing is ready to run, no member thread is computing and no executor job
is out, the loop jumps straight to its next timer (as trio's ``MockClock``
with autojump, or a looptime loop, does); otherwise it waits for real, and
the virtual clock stands still. A member's sync runs on its own thread, as
a node's does, and every call it makes into the network (a record read or
store, a stream round, a sleep) begins on the loop: while a thread waits
there it counts as blocked, so the clock may jump. The loop and the threads
take turns (one runs at a time; a thread goes on at the moment its call
ends, inside the loop's callback that ended it, and the loop goes on once
it calls in again; executor jobs run inline), so a scenario plays the same
events every time it runs (but for a member's own threads, :class:`SimThread`,
which compute beside the thread that started them until one calls in). Since
only one of them runs at a time, a simulation runs on one CPU (:func:`one_cpu`):
a hand-over between two threads on one CPU costs a few microseconds (~8 for a
round trip of two batch threads), between two CPUs of a virtual machine ~10
times that.

Faults are rules of the network, never of the sync:

- ``lag``: seconds each message from or to a member takes (a stream's bytes, a record read or store),
  on top of :data:`MIN_LAG_S`.
- ``loss``: the chance that a stream open or a record store from a member fails.
- ``partition``: members in different groups reach nothing of each other; bytes in flight between them
  are dropped, and each group's records stay on its side until ``heal``.
- ``freeze`` (SIGSTOP-like): nothing reaches or leaves the member and its thread's calls stall until
  ``thaw``; its coroutines still see their timers, which is as far as one shared loop can stop it.
- ``crash`` (SIGKILL-like): its streams reset, its handlers are gone, its thread ends at its next call;
  ``revive`` lets a new process of it on the network again (the caller starts its thread).
- ``replica_lag``: stores from other members reach this member's record replica up to that many seconds
  late, each after its own delay, so they land out of order (as a DHT replica out of step does).

Records: each member holds a replica (key -> subkey -> (value, expiry)); a store reaches every replica in
the storer's group, a read answers from the reader's own, as a DHT whose replicas are all in step (but
under ``replica_lag``). A replica keeps, per subkey, the value with the later expiry (a late store does not
overwrite a newer one), as hivemind's DHT does.

Costs that belong to the machine, not to the rules, are seams the sync takes: records are signed by a keyed
hash (:class:`KeyedHash`) instead of Ed25519, and vote journals live in memory (:class:`MemoryJournal`),
so a seeded scenario of a few members and rounds costs milliseconds.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import hashlib
import heapq
import hmac
import os
import random
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from contextvars import Context
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, TypeVarTuple

from protocol.errors import MessageRejected
from protocol.signing import SigningKey
from swarm.sync.transport import Handler, Opened, SyncNet

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

EPOCH = 1_700_000_000.0
"""The wall-clock time (Unix seconds) at virtual time 0."""
MIN_LAG_S = 0.001
"""What every message and record call takes at least: a real one never takes no time, and a loop that
polls until a deadline without sleeping (it does not expect to) would otherwise spin at one instant."""
TIME_SLACK_S = 1e-6
"""What counts as now: asyncio runs a timer up to its clock's resolution early."""
BUSY_POLL_S = 0.05
"""Longest real wait of the loop while a member thread computes (it wakes at once when one calls in)."""
_MIN_SCHEDULED = 100
_MIN_CANCELLED = 0.5
"""asyncio's rule for a heap of timers: past 100 of them, more than half cancelled, it is rebuilt without those."""


class KeyedHash:
    """Signatures of simulated members (:class:`protocol.signing.Signatures`): a BLAKE2b of (kind, body) keyed
    by the signer's seed, 64 bytes as an Ed25519 signature is. For the sync it is the same rule (only the key's
    holder makes a signature that verifies under its peer id, and a changed kind or body breaks it) at about a
    microsecond instead of Ed25519's ~150 for a verify: a verifier knows the seed of each signer that signed,
    as it would know a public key from the peer id."""

    def __init__(self) -> None:
        self._seeds: dict[str, bytes] = {}
        self.signed = 0
        """Signatures made (a test tells the sync used this scheme by it)."""

    @staticmethod
    def _mac(seed: bytes, kind: str, body: bytes) -> bytes:
        return hashlib.blake2b(kind.encode() + b"\0" + body, key=seed, digest_size=64).digest()

    def sign(self, key: SigningKey, kind: str, body: bytes) -> bytes:
        self._seeds[key.peer_id] = key.seed
        self.signed += 1
        return self._mac(key.seed, kind, body)

    def verify(self, peer_id: str, kind: str, body: bytes, sig: bytes) -> None:
        seed = self._seeds.get(peer_id)
        if seed is None or not hmac.compare_digest(sig, self._mac(seed, kind, body)):
            raise MessageRejected(f"{kind}: bad signature for claimed signer {peer_id[-6:]}")


@dataclass
class MemoryJournal:
    """A member's vote journal in memory (:class:`swarm.sync.journal.JournalStore`): the process of a member
    restarted in the same scenario reads what the last one wrote, as from its disk, without an fsync a vote."""

    data: bytes | None = None
    writes: int = 0

    def read(self) -> bytes | None:
        return self.data

    def write(self, data: bytes) -> None:
        self.data = data
        self.writes += 1


class Deadlock(RuntimeError):
    """Nothing can ever happen: no timer, no ready task, no member thread computing."""


class Crashed(BaseException):
    """The member this thread runs for was crashed (a BaseException: the sync's handlers must not catch it)."""


class Reply(Generic[T]):
    """The end of one member thread's call into the loop: the thread blocks on a bare lock until the loop
    settles it (a ``concurrent.futures.Future`` would build a Condition, and wake through it, per call)."""

    __slots__ = ("_error", "_lock", "_value", "ended")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.ended = False
        """Whether the call's outcome is settled (a crash and a late timer may both try: the first wins)."""

    def settle(self, value: T | None, error: BaseException | None) -> None:
        """Take the call's outcome and let the thread go on."""
        self._value, self._error = value, error
        self._lock.release()

    def wait(self) -> T:
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by settle() when there is no error


class _Soon(asyncio.Handle):
    """A callback in the ready queue: asyncio's Handle less what its debug mode needs (a virtual loop never
    runs in it), made in one Python call instead of four."""

    __slots__ = ()

    def __init__(
        self, callback: Callable[..., object], args: Sequence[Any], loop: VirtualLoop, context: Context | None
    ) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop, self._callback, self._args = loop, callback, args
        self._cancelled, self._repr, self._source_traceback = False, None, None


class _Timer(asyncio.TimerHandle):
    """A timer: asyncio's TimerHandle made and cancelled as :class:`_Soon` is made. The loop's heap holds it in
    a (when, sequence, timer) tuple, compared in C, not by ``TimerHandle.__lt__`` (a Python call per step)."""

    __slots__ = ()

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: Sequence[Any],
        loop: VirtualLoop,
        context: Context | None,
    ) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop, self._callback, self._args = loop, callback, args
        self._cancelled, self._repr, self._source_traceback = False, None, None
        self._when, self._scheduled = when, True

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._callback = self._args = None  # type: ignore[assignment]  # as Handle.cancel drops them
            if self._scheduled:
                self._loop._timer_cancelled_count += 1


Start = Callable[[Reply[Any]], None]
"""A member thread's call as it begins on the loop: it arranges for :meth:`VirtualLoop.resume` of its reply."""


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual seconds: idle waits jump, so time costs nothing (see the module docstring).

    Its iteration is asyncio's own, less what a virtual clock never needs: it never waits in its selector
    (an idle wait moves the clock; the loop waits only for member threads, on locks), so there is no I/O to
    poll and no self-pipe byte to write or read; and it never runs in debug mode, so its handles skip that
    mode's checks (:class:`_Soon`, :class:`_Timer`)."""

    # asyncio.BaseEventLoop's own state, which _run_once reads as asyncio's does
    _ready: collections.deque[asyncio.Handle]
    _stopping: bool
    _clock_resolution: float
    _timer_cancelled_count: int

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        """The virtual clock (what :meth:`time` returns), read directly by the network's hot paths."""
        self._timers: list[tuple[float, int, _Timer]] = []
        """The heap of timers (asyncio's ``_scheduled`` stays empty), in order of time, then of scheduling."""
        self._timer_seq = 0
        self._count = threading.Lock()
        self.computing = 0
        """Member threads running outside the loop (under ``_count``)."""
        self._idle = threading.Lock()
        self._idle.acquire()
        """Released when ``computing`` drops to 0: the loop's turn (a bare lock, as :class:`Reply`'s)."""
        self._handed: collections.deque[tuple[Start, Reply[Any]]] = collections.deque()
        """Calls member threads handed over (:meth:`hand`), not yet started on the loop."""

    def time(self) -> float:
        return self.now

    def _write_to_self(self) -> None:
        """Nothing: a thread's ``call_soon_threadsafe`` lands in the ready queue, which the loop reads once the
        threads gave it their turn; it never sleeps in a select that a byte would have to wake."""

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    # -- callbacks and timers: asyncio's, on lean handles
    def call_soon(
        self, callback: Callable[[*Ts], object], *args: *Ts, context: Context | None = None
    ) -> asyncio.Handle:
        handle = _Soon(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def _call_soon(
        self, callback: Callable[..., object], args: Sequence[Any], context: Context | None
    ) -> asyncio.Handle:
        """What ``call_soon_threadsafe`` queues with (a deque's append is safe from any thread)."""
        handle = _Soon(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], *args: *Ts, context: Context | None = None
    ) -> asyncio.TimerHandle:
        timer = _Timer(when, callback, args, self, context)
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, timer))
        return timer

    def call_later(
        self, delay: float, callback: Callable[[*Ts], object], *args: *Ts, context: Context | None = None
    ) -> asyncio.TimerHandle:
        return self.call_at(self.now + delay, callback, *args, context=context)

    def close(self) -> None:
        super().close()
        self._timers.clear()

    # -- turns: the loop and the member threads never run at once, so a seed replays the same events
    def begin(self) -> None:
        """A member thread starts running outside the loop."""
        with self._count:
            self.computing += 1

    def end(self) -> None:
        """That thread waits for the loop (or is done): the loop may go on."""
        with self._count:
            self._ended()

    def _ended(self) -> None:
        self.computing -= 1
        if self.computing == 0 and self._idle.locked():  # the loop may have been let go already (a stale turn)
            self._idle.release()

    def hand(self, start: Start, reply: Reply[Any]) -> None:
        """A member thread's call: ``start(reply)`` runs on the loop once every thread waits, and arranges for
        :meth:`resume` of ``reply`` when the call ends; the thread then waits (the loop's turn)."""
        with self._count:
            self._handed.append((start, reply))
            self._ended()

    def resume(self, reply: Reply[Any], value: Any = None, error: BaseException | None = None) -> None:
        """The call ``reply`` waits on ended: its thread goes on here and now, and the loop goes on once it
        calls in again (or ends), as if the thread's code were this callback's. Once per call: a later
        outcome of the same call (a crash after its end, or a timer after its crash) is dropped."""
        if reply.ended:
            return
        reply.ended = True
        if self.computing or self._handed:  # a thread started meanwhile calls in first: its call begins first
            self._turns()
        self.begin()
        reply.settle(value, error)
        self._turns()

    def _turns(self) -> None:
        """Wait until no member thread computes, then begin the calls they handed over, in their order."""
        if self.computing > 0:  # only the loop raises it: 0 read here means every thread handed its turn back
            self._wait_for_threads()
        self._idle.acquire(blocking=False)  # this turn's release, if any: the next wait blocks (else one spins)
        while self._handed:
            start, reply = self._handed.popleft()
            try:
                start(reply)
            except (Exception, Crashed) as e:  # the thread raises it, at its turn (not inside this one)
                self.call_soon(self.resume, reply, None, e)

    def _wait_for_threads(self) -> None:
        while True:
            with self._count:
                if self.computing == 0:
                    return
            self._idle.acquire(timeout=BUSY_POLL_S)

    def _run_once(self) -> None:
        """One iteration of asyncio's (``BaseEventLoop._run_once``), on the virtual clock: the member threads'
        turns first; then, if nothing is ready, the clock jumps to the next timer; then every timer due and
        everything ready runs, once each, in asyncio's order."""
        if self.computing or self._handed:
            self._turns()
        ready, timers = self._ready, self._timers
        if len(timers) > _MIN_SCHEDULED and self._timer_cancelled_count > _MIN_CANCELLED * len(timers):
            self._drop_cancelled()
        while timers and timers[0][2]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(timers)[2]._scheduled = False
        if not ready and not self._stopping:
            if not timers:
                raise Deadlock("no timer, no task ready and no member computing: the simulation can never go on")
            self.now = max(self.now, timers[0][0])
        end_time = self.now + self._clock_resolution
        while timers and timers[0][0] < end_time:
            timer = heapq.heappop(timers)[2]
            timer._scheduled = False
            if timer._cancelled:
                self._timer_cancelled_count -= 1
            else:
                ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _drop_cancelled(self) -> None:
        """The heap without its cancelled timers, once they are most of it (asyncio's rule)."""
        for _, _, timer in self._timers:
            if timer._cancelled:
                timer._scheduled = False
        self._timers = [t for t in self._timers if not t[2]._cancelled]
        heapq.heapify(self._timers)
        self._timer_cancelled_count = 0

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        """Run ``func`` here and now: the loop would wait for a pool thread running it alone anyway (turns),
        so the same events follow, without two thread hand-offs per job."""
        done: asyncio.Future[T] = self.create_future()
        try:
            done.set_result(func(*args))
        except Exception as e:
            done.set_exception(e)
        return done


@dataclass
class _Member:
    name: str
    lag: float = 0.0
    loss: float = 0.0
    group: int = 0
    frozen: asyncio.Event | None = None
    """Set while the member runs; cleared while it is frozen (None before the loop made it)."""
    crashed: bool = False
    handlers: dict[str, Handler] = field(default_factory=dict)
    replica: dict[str, dict[str, tuple[bytes, float]]] = field(default_factory=dict)
    waits: dict[Reply[Any], Callable[[], object]] = field(default_factory=dict)
    """Its thread's calls in progress, each with what a crash does to it (ends it with :class:`Crashed`)."""
    replica_lag: float = 0.0
    """Most seconds a store of another member takes to reach this member's replica (0: at once)."""


class _Pipe(asyncio.Transport):
    """One direction's sending end of a simulated stream: bytes reach the other end's protocol in order,
    ``lag`` later, unless the link is cut (partition, crash) or an end is frozen (then they wait)."""

    def __init__(self, net: SimNet, src: str, dst: str, protocol: asyncio.StreamReaderProtocol) -> None:
        super().__init__()
        self._net, self.src, self.dst, self._own = net, src, dst, protocol
        self.peer: asyncio.StreamReaderProtocol | None = None
        self._queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self._closing = False
        self._scheduled = False
        self.dead = False

    # -- asyncio.Transport ---------------------------------------------------------------------
    def write(self, data: Any) -> None:
        if self._closing or self.dead:
            return
        self._push(bytes(data))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._push(None)
        self._net.loop.call_soon(self._own.connection_lost, None)

    def abort(self) -> None:
        self._queue.clear()
        self._closing = True
        self.reset()

    def is_closing(self) -> bool:
        return self._closing or self.dead

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    # -- delivery --------------------------------------------------------------------------------
    def _push(self, data: bytes | None) -> None:
        self._queue.append((self._net.loop.now + self._net.link_lag(self.src, self.dst), data))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._queue:
            self._scheduled = True
            self._net.loop.call_at(self._queue[0][0], self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        if self.dead or self.peer is None:
            return
        if not self._net.reaches(self.src, self.dst):
            self._queue.clear()  # cut: what was in flight is lost, the ends notice only by their timeouts
            return
        if self._net.frozen(self.src) or self._net.frozen(self.dst):
            self._net.on_thaw(self._schedule)
            return
        now = self._net.loop.now + TIME_SLACK_S  # a timer may fire a hair before its time (loop resolution)
        while self._queue and self._queue[0][0] <= now:
            _, data = self._queue.popleft()
            if data is None:
                self.peer.eof_received()
                self.peer.connection_lost(None)
                return
            self.peer.data_received(data)
        self._schedule()

    def reset(self) -> None:
        """The connection is gone (a crash): both ends see it reset."""
        if self.dead:
            return
        self.dead = True
        self._queue.clear()
        for proto in (self._own, self.peer):
            if proto is not None:
                with contextlib.suppress(Exception):
                    proto.connection_lost(ConnectionResetError("connection reset"))


class SimNet:
    """The network of every simulated member (build it on a :class:`VirtualLoop`, in that loop's thread)."""

    def __init__(self, loop: VirtualLoop, seed: int = 0) -> None:
        self.loop = loop
        self.rng = random.Random(seed)
        self.members: dict[str, _Member] = {}
        self._pipes: list[_Pipe] = []
        self._thawed: list[Callable[[], None]] = []
        self.trace: list[str] = []
        """What happened, one line per fault and per failed open (printed by a failing scenario)."""
        self.signatures = KeyedHash()
        """What every member signs its records with (one scheme for the network: each verifies the others)."""

    # -- time ------------------------------------------------------------------------------------
    def clock(self) -> float:
        """The members' wall clock: virtual seconds since :data:`EPOCH` (safe from any thread)."""
        return EPOCH + self.loop.now

    def note(self, line: str) -> None:
        self.trace.append(f"t={self.loop.time():9.3f} {line}")

    # -- members and faults (call on the loop's thread) ------------------------------------------
    def add(self, name: str, lag: float = 0.0, loss: float = 0.0) -> SyncNet:
        """A member's network; it reaches every member of group 0 (and gets their records)."""
        member = _Member(name, lag, loss)
        member.frozen = asyncio.Event()
        member.frozen.set()
        for other in self.members.values():
            if not other.crashed and other.group == 0:
                _merge_into(member.replica, other.replica)
                break
        self.members[name] = member
        return SyncNet(SimStreams(self, name), SimRecords(self, name), SimLoop(self, name))

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the members: each of ``groups`` a side (members named in none stay in group 0)."""
        for m in self.members.values():
            m.group = 0
        for k, names in enumerate(groups, start=1):
            for name in names:
                self.members[name].group = k
        self.note(f"partition {[sorted(g) for g in groups]}")

    def heal(self) -> None:
        """One group again (a crashed member's too: its next process starts in it); every live replica takes
        the records of the others (the later expiry wins)."""
        live = [m for m in self.members.values() if not m.crashed]
        merged: dict[str, dict[str, tuple[bytes, float]]] = {}
        for m in self.members.values():
            m.group = 0
        for m in live:
            _merge_into(merged, m.replica)
        for m in live:
            m.replica = {k: dict(v) for k, v in merged.items()}
        self.note("heal")

    def freeze(self, name: str) -> None:
        event = self.members[name].frozen
        assert event is not None
        event.clear()
        self.note(f"freeze {name[-6:]}")

    def thaw(self, name: str) -> None:
        event = self.members[name].frozen
        assert event is not None
        event.set()
        self.note(f"thaw {name[-6:]}")
        waiting, self._thawed = self._thawed, []
        for again in waiting:
            again()

    def crash(self, name: str) -> None:
        member = self.members[name]
        member.crashed = True
        member.handlers.clear()
        for pipe in self._pipes:
            if name in (pipe.src, pipe.dst):
                pipe.reset()
        for cancel in list(member.waits.values()):
            cancel()
        member.waits.clear()
        self.note(f"crash {name[-6:]}")

    def revive(self, name: str) -> None:
        """A crashed member's new process: running, reachable, with the records of its group (as :meth:`add`)."""
        member = self.members[name]
        assert member.crashed, "only a crashed member's process starts again"
        member.crashed, member.replica = False, {}
        assert member.frozen is not None
        member.frozen.set()  # a new process is not stopped, whatever the old one was
        for other in self.members.values():
            if other is not member and not other.crashed and other.group == member.group:
                _merge_into(member.replica, other.replica)
                break
        self.note(f"restart {name[-6:]}")

    def set_replica_lag(self, name: str, seconds: float) -> None:
        self.members[name].replica_lag = seconds
        self.note(f"replica lag {seconds} at {name[-6:]}")

    # -- rules -----------------------------------------------------------------------------------
    def up(self, name: str) -> bool:
        member = self.members.get(name)
        return member is not None and not member.crashed

    def frozen(self, name: str) -> bool:
        event = self.members[name].frozen
        return event is not None and not event.is_set()

    def reaches(self, a: str, b: str) -> bool:
        return self.up(a) and self.up(b) and self.members[a].group == self.members[b].group

    def link_lag(self, a: str, b: str) -> float:
        return MIN_LAG_S + self.members[a].lag + self.members[b].lag

    def record_lag(self, name: str) -> float:
        return MIN_LAG_S + self.members[name].lag

    def on_thaw(self, again: Callable[[], None]) -> None:
        self._thawed.append(again)

    async def until_thawed(self, name: str) -> None:
        event = self.members[name].frozen
        assert event is not None
        await event.wait()

    def lost(self, name: str) -> bool:
        loss = self.members[name].loss
        return loss > 0 and self.rng.random() < loss

    # -- streams ---------------------------------------------------------------------------------
    def _end(self) -> tuple[asyncio.StreamReader, asyncio.StreamReaderProtocol]:
        reader = asyncio.StreamReader(loop=self.loop)
        return reader, asyncio.StreamReaderProtocol(reader, loop=self.loop)

    async def open(self, src: str, dst: str, name: str) -> Opened:
        await self.until_thawed(src)
        await asyncio.sleep(self.link_lag(src, dst))
        if not self.up(src):
            raise Crashed(src)
        handler = self.members[dst].handlers.get(name) if dst in self.members else None
        why = "unreachable" if not self.reaches(src, dst) else "no handler" if handler is None else "lost"
        if why != "lost" or self.lost(src):
            self.note(f"open {src[-6:]} -> {dst[-6:]} failed: {why}")
            raise ConnectionError(f"{dst[-6:]} cannot be reached")
        assert handler is not None
        await self.until_thawed(dst)
        ra, pa = self._end()
        rb, pb = self._end()
        wa, wb = _Pipe(self, src, dst, pa), _Pipe(self, dst, src, pb)
        wa.peer, wb.peer = pb, pa
        pa.connection_made(wa)
        pb.connection_made(wb)
        self._pipes = [p for p in self._pipes if not (p.dead or p.is_closing())] + [wa, wb]
        writer_a = asyncio.StreamWriter(wa, pa, ra, self.loop)
        writer_b = asyncio.StreamWriter(wb, pb, rb, self.loop)
        task = asyncio.ensure_future(handler(src, rb, writer_b))
        task.add_done_callback(lambda f: f.cancelled() or f.exception())
        return Opened(ra, writer_a, None)

    # -- records ---------------------------------------------------------------------------------
    # (a member's calls take their lag first: SimRecords, on SimLoop.after)
    def read(self, name: str, key: str) -> dict[Any, Any]:
        """The live values under ``key`` in ``name``'s replica."""
        now = self.clock()
        return {sk: v for sk, (v, expiry) in self.members[name].replica.get(key, {}).items() if expiry > now}

    def put(self, name: str, key: str, subkey: str, value: bytes, ttl: float) -> bool:
        """A store from ``name``: into every replica of its group, unless lost."""
        if self.lost(name):
            return False
        expiry = self.clock() + ttl
        me = self.members[name]
        for m in self.members.values():
            if m.crashed or m.group != me.group:
                continue
            if m is me or m.replica_lag <= 0:
                _keep_later(m.replica, key, subkey, value, expiry)
            else:  # each store its own delay: two stores may land in either order
                delay = self.rng.uniform(0.0, m.replica_lag)
                self.loop.call_at(self.loop.time() + delay, self._land, m, key, subkey, value, expiry)
        return True

    def _land(self, m: _Member, key: str, subkey: str, value: bytes, expiry: float) -> None:
        """A late store reaches ``m``'s replica (lost if ``m`` crashed meanwhile: a new process starts empty)."""
        if not m.crashed:
            _keep_later(m.replica, key, subkey, value, expiry)


def _keep_later(
    replica: dict[str, dict[str, tuple[bytes, float]]], key: str, sk: str, value: bytes, exp: float
) -> None:
    held = replica.setdefault(key, {})
    if sk not in held or held[sk][1] <= exp:
        held[sk] = (value, exp)


def _merge_into(
    dest: dict[str, dict[str, tuple[bytes, float]]], src: dict[str, dict[str, tuple[bytes, float]]]
) -> None:
    for key, values in src.items():
        held = dest.setdefault(key, {})
        for sk, (value, expiry) in values.items():
            if sk not in held or held[sk][1] < expiry:
                held[sk] = (value, expiry)


class SimStreams:
    """One member's streams on a :class:`SimNet`."""

    def __init__(self, net: SimNet, me: str) -> None:
        self._net, self._me = net, me

    async def serve(self, name: str, handler: Handler) -> None:
        self._net.members[self._me].handlers[name] = handler

    async def unserve(self, name: str) -> None:
        self._net.members[self._me].handlers.pop(name, None)

    async def open(self, peer: str, name: str) -> Opened:
        return await self._net.open(self._me, peer, name)

    async def connect(self, peer: str, addrs: Sequence[str]) -> None:
        if not self._net.reaches(self._me, peer):
            raise ConnectionError(f"{peer[-6:]} cannot be reached")


class SimLoop:
    """One member's calls from its thread into the loop: while one waits, the thread counts as blocked.

    Each call begins on the loop at the thread's turn (:meth:`VirtualLoop.hand`) and ends in
    :meth:`_end`, which resumes the thread at once; a crash of the member ends it with :class:`Crashed`."""

    def __init__(self, net: SimNet, me: str) -> None:
        self._net, self._me = net, me

    def _call(self, start: Start) -> Any:
        """Hand ``start`` to the loop and block until the call it begins ends."""
        if self._net.members[self._me].crashed:
            raise Crashed(self._me)
        reply: Reply[Any] = Reply()
        self._net.loop.hand(start, reply)  # this thread's turn comes back when the call ended (VirtualLoop.resume)
        return reply.wait()

    def _end(self, reply: Reply[Any], value: Any = None, error: BaseException | None = None) -> None:
        self._net.members[self._me].waits.pop(reply, None)
        self._net.loop.resume(reply, value, error)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if self._net.members[self._me].crashed:
            coro.close()
            raise Crashed(self._me)
        result: T = self._call(lambda reply: self._task(reply, coro, timeout))
        return result

    def _task(self, reply: Reply[Any], coro: Coroutine[Any, Any, Any], timeout: float) -> None:
        """``coro`` as a task, at once; its outcome ends the call. As ``asyncio.wait_for`` (without its own
        task, waiter and callbacks): ``timeout`` after this member is thawed, the task is cancelled and, once
        it ended, the call raises TimeoutError (no time left: cancelled before it runs)."""
        net, loop = self._net, self._net.loop
        if net.members[self._me].crashed:
            coro.close()
            raise Crashed(self._me)
        task = loop.create_task(coro)
        expired = False
        timer: asyncio.TimerHandle | None = None

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        def arm() -> None:
            nonlocal timer
            if task.done():
                return
            if timeout <= 0:
                expire()
            else:
                timer = loop.call_at(loop.now + timeout, expire)

        def done(t: asyncio.Task[Any]) -> None:
            if timer is not None:
                timer.cancel()
            if t.cancelled():  # timed out, or cancelled by a crash of the member (SimNet.crash)
                self._end(reply, None, TimeoutError() if expired else Crashed(self._me))
            elif (error := t.exception()) is not None:
                self._end(reply, None, error)
            else:
                self._end(reply, t.result())

        task.add_done_callback(done)
        net.members[self._me].waits[reply] = task.cancel
        if net.frozen(self._me):
            net.on_thaw(arm)
        else:
            arm()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._net.loop)

    def sleep(self, seconds: float) -> None:
        """A timer, not a task: the sleep ends ``seconds`` after it began, or when its member thaws if later."""
        self._call(lambda reply: self._timer(reply, max(0.0, seconds), lambda: None, thawed_first=False))

    def after(self, delay: float, timeout: float, then: Callable[[], T]) -> T:
        """``then()`` on the loop ``delay`` virtual seconds after this member is thawed (a record call's lag),
        its value returned here; TimeoutError (and no ``then``) if ``delay`` is past ``timeout``."""

        def late() -> T:
            raise TimeoutError(f"{self._me[-6:]}: a call of {delay:.3f} s past its timeout {timeout:.3f} s")

        result: T = self._call(
            lambda reply: self._timer(reply, min(delay, timeout), then if delay <= timeout else late, True)
        )
        return result

    def _timer(self, reply: Reply[Any], delay: float, then: Callable[[], Any], thawed_first: bool) -> None:
        """``then()`` run ``delay`` after now (after the thaw, ``thawed_first``), or at the thaw of a member
        frozen when the delay is over, ends the call with its value; a crash of the member ends it first."""
        net, loop = self._net, self._net.loop
        if net.members[self._me].crashed:
            raise Crashed(self._me)
        timer: asyncio.TimerHandle | None = None
        crashed = False

        def fire() -> None:
            if crashed:
                return
            if not thawed_first and net.frozen(self._me):
                net.on_thaw(fire)
                return
            try:
                value = then()
            except Exception as e:
                self._end(reply, None, e)
            else:
                self._end(reply, value)

        def go() -> None:
            nonlocal timer
            if crashed:
                return
            if net.frozen(self._me):
                net.on_thaw(go)
            else:
                timer = loop.call_at(loop.now + delay, fire)

        def crash() -> None:  # the thread raises it at its turn, as it would a call's error
            nonlocal crashed
            crashed = True
            if timer is not None:
                timer.cancel()
            loop.call_soon(loop.resume, reply, None, Crashed(self._me))

        net.members[self._me].waits[reply] = crash
        if thawed_first:
            go()
        else:
            timer = loop.call_at(loop.now + delay, fire)


class SimRecords:
    """One member's record store on a :class:`SimNet` (blocking, as the DHT's is)."""

    def __init__(self, net: SimNet, me: str) -> None:
        self._net, self._me = net, me
        self._loop = SimLoop(net, me)

    def get(self, key: str, timeout: float) -> dict[Any, Any]:
        return self._loop.after(self._net.record_lag(self._me), timeout, lambda: self._net.read(self._me, key))

    def store(self, key: str, subkey: str, value: bytes, ttl: float, timeout: float) -> bool:
        lag = self._net.record_lag(self._me)
        return self._loop.after(lag, timeout, lambda: self._net.put(self._me, key, subkey, value, ttl))

    def addresses(self) -> list[str]:
        return []


def _current_cpu() -> int | None:
    """The CPU this thread runs on now (Linux: field 39 of /proc/thread-self/stat), None if unknown."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def one_cpu() -> Iterator[None]:
    """Keep this thread, and the threads it starts meanwhile, on the CPU it runs on now, as batch threads
    (where the OS allows it).

    The loop and the member threads take turns, so a second CPU buys a simulation nothing, and each turn
    handed across CPUs costs a cross-CPU wake-up; on one CPU a turn costs a fraction of that. A batch thread
    (Linux's SCHED_BATCH) that a turn wakes does not preempt the one that woke it: that one goes on to block
    (dropping the GIL) first, so a turn is one switch instead of three (woken, blocked on the GIL, woken)."""
    with _batch_threads():
        cpu = _current_cpu()
        if not hasattr(os, "sched_setaffinity") or cpu is None or cpu not in os.sched_getaffinity(0):
            yield
            return
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
        try:
            yield
        finally:
            os.sched_setaffinity(0, allowed)


@contextlib.contextmanager
def _batch_threads() -> Iterator[None]:
    """This thread, and the threads it starts meanwhile, under SCHED_BATCH (no change where there is none)."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def start_thread(net: SimNet, name: str, work: Callable[[], None]) -> threading.Thread:
    """Run ``work`` (a member's sync code) on a thread counted as computing until it ends (call on the loop)."""
    net.loop.begin()

    def main() -> None:
        try:
            work()
        except Crashed:
            pass
        finally:
            net.loop.end()

    thread = threading.Thread(target=main, name=f"sim-{name[-6:]}", daemon=True)
    thread.start()
    return thread


async def joined(threads: Sequence[threading.Thread]) -> None:
    """Wait (on the loop) until every thread ended; the clock runs while they block."""
    while any(t.is_alive() for t in threads):
        await asyncio.sleep(0.5)


class SimThread(threading.Thread):
    """A thread that a member's own code starts (a sync runner's sync thread): it counts as computing while it
    runs, as :func:`start_thread`'s do, so the clock stands still until it waits on the network. Started from
    a member thread (counted already): the two compute side by side until one of them calls into the loop,
    so a scenario with such threads is not replayed event for event. A thread of a crashed member ends
    quietly. ``join`` with a timeout from another member thread would block that thread while it counts as
    computing (the loop would wait for it): poll ``is_alive`` across the network's sleeps instead."""

    def __init__(self, loop: VirtualLoop, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sim_loop = loop

    def start(self) -> None:
        self._sim_loop.begin()
        try:
            super().start()
        except BaseException:
            self._sim_loop.end()
            raise

    def run(self) -> None:
        try:
            super().run()
        except Crashed:
            pass
        finally:
            self._sim_loop.end()


@dataclass(frozen=True)
class SimThreading:
    """What a module that starts threads takes of ``threading`` (``Thread``), its threads :class:`SimThread`s:
    patched in as that module's ``threading`` for a simulation on ``loop``."""

    loop: VirtualLoop

    def Thread(self, *args: Any, **kwargs: Any) -> SimThread:  # threading.Thread's name
        return SimThread(self.loop, *args, **kwargs)
