"""Sync streams between two peers behind NAT, through a third peer: sealed pipes.

Two nodes in different homes can open nothing to each other. libp2p's circuit relay would carry a stream
between them, but a circuit is a *limited* connection: go-libp2p's relay resets it after 128 KiB each way
(or 2 minutes), and hivemind's p2pd starts one relay service with those defaults beside the one its
``-relayDataLimit`` flags configure; whichever registers its handler last decides, a race the defaults
win about half the time (bench/RESULTS.md, "Two homes and a public peer"). One all-reduce part is ~1 MB.

So the sync never runs a stream over a circuit. A stream that libp2p routes over one, or cannot route at
all, goes through a *pipe* instead: the opener R asks a peer P that the target T is connected to (a relay
in T's published addresses, or a peer R joined through) to open a stream to T; P copies bytes both ways,
and R and T run a handshake through it that P cannot take part in:

- R sends an ephemeral X25519 key, signed with its identity key over (R, T, P, handler name, key);
  T checks it under R's peer id, answers with its own ephemeral key signed over the same and R's key,
  and R checks that under T's peer id;
- both derive two keys (one per direction) from the X25519 secret and the transcript, and every frame
  after that is ChaCha20-Poly1305 with a counter nonce, the last one an end mark.

P sees only sizes and timing: a changed, dropped, reordered, replayed or truncated frame fails the
stream, as a cut connection does; P cannot read, forge or redirect one, nor claim to be R (T's handler
hears the peer id R signed with). Bounded against a peer with many keys: a relay copies at most
:data:`MAX_PIPES` pipes at once, :data:`MAX_PIPES_PER_PEER` per requester, each for at most
:data:`PIPE_MAX_S`, idle at most :data:`IDLE_S`, and at most :data:`MAX_PIPE_BYTES` each way; a target takes
at most :data:`MAX_INBOUND` piped streams at once, :data:`MAX_INBOUND_PER_RELAY` per relay. Refusals and
failures are counted by reason (:class:`PipeFailure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from protocol import SigningKey, codec
from protocol.errors import MessageRejected
from protocol.peer_id import public_key_from_peer_id
from protocol.signing import ED25519, Signatures
from swarm.slots import Slots
from swarm.sync.dialhints import CIRCUIT
from swarm.sync.transport import Handler, Opened, Streams
from swarm.sync.wire import read_header, write_frame

logger = logging.getLogger(__name__)

PIPE_SUFFIX, INBOUND_SUFFIX = ".pipe", ".pipe-in"
HELLO_KIND, ACK_KIND = "sync-pipe-hello", "sync-pipe-ack"
MAX_PIPES = 16
MAX_PIPES_PER_PEER = 4
MAX_INBOUND = 16
MAX_INBOUND_PER_RELAY = 8
PIPE_MAX_S = 900.0
"""How long a relay copies one pipe (a large model's state download included)."""
IDLE_S = 120.0
"""How long a relay keeps a pipe on which no byte moved either way (longer than a round's longest silence: a
part waits for the slowest member up to the all-reduce timeout)."""
MAX_PIPE_BYTES = 1 << 30
"""Bytes a relay copies each way on one pipe."""
STEP_TIMEOUT_S = 10.0
"""Bound on each step of opening a pipe (a dial, a header, the handshake's answer)."""
RELAYS_TRIED = 3
RECENT_DIRECT = 16
"""Peers this one reached directly lately, kept as relay candidates after the target's own relays and the
peers it joined through (members of one round reach each other, so a public one among them holds a
connection to a NATed target; with the bootstrap gone they are what is left)."""
PIPED_FOR_S = 120.0
"""After a peer was reached only through a pipe, streams to it go through one first for this long."""
MAX_REMEMBERED = 1024
FRAME_BYTES = 64 * 1024
MAX_SEALED = FRAME_BYTES + 1 + 16
HIGH_WATER = 256 * 1024
DATA, END = b"\x00", b"\x01"


class PipeFailure(enum.Enum):
    """Why a pipe was refused or broke, counted where it happened."""

    BUSY = "busy"
    BAD_REQUEST = "bad request"
    UNREACHABLE = "target unreachable"
    BAD_HANDSHAKE = "bad handshake"
    NO_HANDLER = "no such handler"
    TOO_MUCH = "byte bound"
    IDLE = "idle"
    NO_RELAY = "no relay reached the peer"


class PipeError(ConnectionError):
    """A stream through a pipe could not be opened; ``reason`` says why."""

    def __init__(self, reason: PipeFailure, detail: str = "") -> None:
        super().__init__(f"{reason.value}{': ' + detail if detail else ''}")
        self.reason = reason


def _body(opener: str, target: str, relay: str, name: str, *keys: bytes) -> bytes:
    return codec.pack({"r": opener, "t": target, "p": relay, "n": name, "k": list(keys)})


def _keys(secret: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """(opener -> target key, target -> opener key) from the X25519 secret and the handshake's transcript."""
    info = b"swarm-node sync pipe v1" + hashlib.sha256(transcript).digest()
    both = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=info).derive(secret)
    return both[:32], both[32:]


def _key_of(value: Any) -> X25519PublicKey:
    if not isinstance(value, bytes) or len(value) != 32:
        raise MessageRejected("not an X25519 key")
    return X25519PublicKey.from_public_bytes(value)


def _raw(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _peer_ok(value: Any) -> TypeGuard[str]:
    try:
        public_key_from_peer_id(value)
    except MessageRejected:
        return False
    return True


class _Sealed(asyncio.Transport):
    """One end of a pipe after its handshake: frames sealed with ChaCha20-Poly1305 over an inner stream."""

    def __init__(self, inner: Opened, send_key: bytes, recv_key: bytes, protocol: asyncio.StreamReaderProtocol):
        super().__init__()
        self._inner, self._protocol = inner, protocol
        self._send, self._recv = ChaCha20Poly1305(send_key), ChaCha20Poly1305(recv_key)
        self._sent = self._received = 0
        self._closing = self._lost_called = self._paused = False
        self._reading = asyncio.Event()
        self._reading.set()
        self._pump = asyncio.ensure_future(self._read_loop())
        self._resumer: asyncio.Future[None] | None = None

    @staticmethod
    def _nonce(n: int) -> bytes:
        return n.to_bytes(12, "big")

    def _seal(self, kind: bytes, data: bytes | memoryview) -> None:
        sealed = self._send.encrypt(self._nonce(self._sent), kind + data, None)
        self._sent += 1
        self._inner.writer.write(len(sealed).to_bytes(4, "big") + sealed)

    def write(self, data: Any) -> None:
        if self._closing:
            return
        view = memoryview(data).cast("B")  # no copy of the caller's 1 MiB chunk
        for start in range(0, len(view), FRAME_BYTES):
            self._seal(DATA, view[start : start + FRAME_BYTES])
        if not self._paused and self.get_write_buffer_size() > HIGH_WATER:
            self._paused = True
            self._protocol.pause_writing()
            self._resumer = asyncio.ensure_future(self._resume())

    async def _resume(self) -> None:
        with contextlib.suppress(Exception):
            await self._inner.writer.drain()
        self._paused = False
        if not self._lost_called:
            self._protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        try:
            return int(self._inner.writer.transport.get_write_buffer_size())
        except (AttributeError, NotImplementedError):  # a transport that keeps no buffer of its own
            return 0

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(Exception):
            self._seal(END, b"")
        self._inner.writer.close()
        self._pump.cancel()

    def abort(self) -> None:
        self._closing = True
        transport = self._inner.writer.transport
        if transport is not None:
            transport.abort()
        self._pump.cancel()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def can_write_eof(self) -> bool:
        return False

    def _lost(self, exc: Exception | None) -> None:
        if not self._lost_called:
            self._lost_called = True
            self._protocol.connection_lost(exc)

    async def _read_loop(self) -> None:
        exc: Exception | None = ConnectionResetError("pipe closed without its end mark")
        try:
            while True:
                await self._reading.wait()
                size = int.from_bytes(await self._inner.reader.readexactly(4), "big")
                if not 17 <= size <= MAX_SEALED:
                    raise MessageRejected(f"sealed frame of {size} bytes")
                plain = self._recv.decrypt(
                    self._nonce(self._received), await self._inner.reader.readexactly(size), None
                )
                self._received += 1
                if plain[:1] == END:
                    self._protocol.eof_received()
                    exc = None
                    return
                self._protocol.data_received(plain[1:])
        except asyncio.CancelledError:
            exc = None if self._closing else exc
        except (InvalidTag, MessageRejected) as e:
            exc = ConnectionResetError(f"pipe frame rejected ({type(e).__name__})")
            self._inner.writer.close()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._lost(exc)


def _sealed(inner: Opened, send_key: bytes, recv_key: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = _Sealed(inner, send_key, recv_key, protocol)
    protocol.connection_made(transport)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class PipedStreams:
    """:class:`~swarm.sync.transport.Streams` that go through a pipe where libp2p has only a circuit or no route.

    ``prefix`` names the pipe handlers (one pair per swarm). A pipe is tried only for a peer ``natted(peer)``
    says sits behind NAT (its record), or that libp2p reaches only over a circuit; the peers that may reach
    it are tried in order, at most :data:`RELAYS_TRIED`: ``published(peer)`` (the relays in its record),
    ``fallback`` (the peers this node joined through), then the peers this one reached directly lately.
    Every peer with a sync serves as a relay within the module's bounds.
    """

    def __init__(
        self,
        inner: Streams,
        key: SigningKey,
        prefix: str,
        published: Callable[[str], Sequence[str]],
        natted: Callable[[str], bool],
        fallback: Sequence[str] = (),
        signatures: Signatures = ED25519,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner, self._key, self._me = inner, key, key.peer_id
        self._pipe, self._inbound = prefix + PIPE_SUFFIX, prefix + INBOUND_SUFFIX
        self._published, self._natted, self._fallback = published, natted, tuple(fallback)
        self._signatures, self._clock = signatures, clock
        self._handlers: dict[str, Handler] = {}
        self._serving = False
        self._piped: OrderedDict[str, float] = OrderedDict()
        self._direct: OrderedDict[str, None] = OrderedDict()
        self._copying, self._taking = Slots(MAX_PIPES, MAX_PIPES_PER_PEER), Slots(MAX_INBOUND, MAX_INBOUND_PER_RELAY)
        self.failures: Counter[PipeFailure] = Counter()
        """Pipes refused or broken here, by reason (as relay, target or opener)."""
        self.relayed_bytes = 0
        self.opened = 0
        """Streams this peer opened through a pipe."""

    # --- Streams ------------------------------------------------------------------------------------

    async def serve(self, name: str, handler: Handler) -> None:
        if not self._serving:
            await self._inner.serve(self._pipe, self._copy)
            await self._inner.serve(self._inbound, self._take)
            self._serving = True
        self._handlers[name] = handler
        await self._inner.serve(name, handler)

    async def unserve(self, name: str) -> None:
        self._handlers.pop(name, None)
        await self._inner.unserve(name)
        if self._serving and not self._handlers:
            self._serving = False
            await self._inner.unserve(self._pipe)
            await self._inner.unserve(self._inbound)

    async def connect(self, peer: str, addrs: Sequence[str]) -> None:
        await self._inner.connect(peer, addrs)

    async def open(self, peer: str, name: str) -> Opened:
        """A direct stream to ``peer`` if libp2p has a direct connection or can make one; else a piped one."""
        if self._piped.get(peer, 0.0) > self._clock():
            return await self._open_piped(peer, name)
        circuit = False
        try:
            opened = await self._inner.open(peer, name)
        except Exception as e:  # no route: a peer behind another NAT, or a peer that is gone
            if not (self._natted(peer) and self._candidates(peer)):
                raise  # a public peer that cannot be dialled is down: a relay would not reach it either
            logger.debug("[%s] %s not reachable (%s): trying a pipe", self._me[-6:], peer[-6:], type(e).__name__)
        else:
            if opened.addr is None or CIRCUIT not in opened.addr:
                self._direct[peer] = None
                self._direct.move_to_end(peer)
                while len(self._direct) > RECENT_DIRECT:
                    self._direct.popitem(last=False)
                return opened
            opened.writer.close()  # a limited connection: it would reset inside the first part
            circuit = True
        piped = await self._open_piped(peer, name)
        # pipes first from now on (for PIPED_FOR_S) only on evidence of a NAT: a piped stream costs a few more
        # round trips, which a liveness ping of a peer that is only restarting would spend in vain
        if not (circuit or self._natted(peer)):
            return piped
        if peer not in self._piped:
            logger.info("[%s] reaching %s through a pipe (no direct route; a libp2p circuit would cut it)",
                        self._me[-6:], peer[-6:])  # fmt: skip
        self._piped[peer] = self._clock() + PIPED_FOR_S
        self._piped.move_to_end(peer)
        while len(self._piped) > MAX_REMEMBERED:
            self._piped.popitem(last=False)
        return piped

    # --- opener ---------------------------------------------------------------------------------------

    def _candidates(self, peer: str) -> list[str]:
        named = [*self._published(peer), *self._fallback, *reversed(self._direct)]
        return [r for r in dict.fromkeys(named) if r not in (peer, self._me)][:RELAYS_TRIED]

    async def _open_piped(self, peer: str, name: str) -> Opened:
        error: Exception = PipeError(PipeFailure.NO_RELAY, peer[-6:])
        for relay in self._candidates(peer):
            try:
                opened = await self._through(relay, peer, name)
            except (ConnectionError, OSError, TimeoutError, MessageRejected, asyncio.IncompleteReadError) as e:
                logger.debug("[%s] pipe to %s via %s failed: %s", self._me[-6:], peer[-6:], relay[-6:], e)
                error = e
                continue
            self.opened += 1
            return opened
        if isinstance(error, PipeError):
            self.failures[error.reason] += 1
        raise error

    async def _through(self, relay: str, peer: str, name: str) -> Opened:
        inner = await asyncio.wait_for(self._inner.open(relay, self._pipe), STEP_TIMEOUT_S)
        try:
            await write_frame(inner.writer, {"to": peer, "name": name}, b"", STEP_TIMEOUT_S)
            mine = X25519PrivateKey.generate()
            hello = _body(self._me, peer, relay, name, _raw(mine))
            sig = self._signatures.sign(self._key, HELLO_KIND, hello)
            await write_frame(inner.writer, {"e": _raw(mine), "sig": sig}, b"", STEP_TIMEOUT_S)
            ack = await read_header(inner.reader, STEP_TIMEOUT_S)
            if "error" in ack:
                raise PipeError(PipeFailure.UNREACHABLE, f"relay {relay[-6:]}: {str(ack['error'])[:100]}")
            theirs = _key_of(ack.get("e"))
            transcript = _body(self._me, peer, relay, name, _raw(mine), ack["e"])
            self._signatures.verify(peer, ACK_KIND, transcript, _sig(ack.get("sig")))
            to_target, to_opener = _keys(mine.exchange(theirs), transcript)
            reader, writer = _sealed(inner, to_target, to_opener)
            return Opened(reader, writer, None)
        except BaseException:
            inner.writer.close()
            raise

    # --- relay ------------------------------------------------------------------------------------------

    async def _copy(self, requester: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve a pipe from ``requester`` to the target its request names (the relay's side)."""
        if not self._copying.take(requester):
            await self._refuse(writer, PipeFailure.BUSY)
            return
        out: Opened | None = None
        try:
            request = await read_header(reader, STEP_TIMEOUT_S)
            target, name = request.get("to"), request.get("name")
            if not (_peer_ok(target) and target not in (requester, self._me) and _name_ok(name)):
                await self._refuse(writer, PipeFailure.BAD_REQUEST)
                return
            try:
                out = await asyncio.wait_for(self._inner.open(target, self._inbound), STEP_TIMEOUT_S)
                if out.addr is not None and CIRCUIT in out.addr:  # limited as well: not a way to the target
                    raise PipeError(PipeFailure.UNREACHABLE, "only a circuit")
                await write_frame(out.writer, {"from": requester, "name": name}, b"", STEP_TIMEOUT_S)
            except Exception:
                await self._refuse(writer, PipeFailure.UNREACHABLE)
                return
            await self._splice(reader, writer, out)
        except Exception as e:  # a malformed request, a reset on either leg
            logger.debug("[%s] pipe for %s ended: %s", self._me[-6:], requester[-6:], type(e).__name__)
        finally:
            self._copying.give(requester)
            writer.close()
            if out is not None:
                out.writer.close()

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, out: Opened) -> None:
        """Copy both ways until either side ends, a bound is reached or ``PIPE_MAX_S`` passed."""
        moved = [asyncio.get_running_loop().time()]  # when a byte last moved, either way
        ways = [
            asyncio.ensure_future(self._pump(reader, out.writer, moved)),
            asyncio.ensure_future(self._pump(out.reader, writer, moved)),
        ]
        try:
            await asyncio.wait(ways, timeout=PIPE_MAX_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for way in ways:
                way.cancel()
            ended = await asyncio.gather(*ways, return_exceptions=True)
            for reason in {r.reason for r in ended if isinstance(r, PipeError)}:  # once per pipe
                self.failures[reason] += 1

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, moved: list[float]) -> None:
        """One way of a pipe. Idle is both ways: a sender waits silently for a reduced slice while the other
        way carries its part, or both wait for the slowest member of the round."""
        loop, total = asyncio.get_running_loop(), 0
        while True:
            try:
                async with asyncio.timeout(IDLE_S):
                    data = await reader.read(FRAME_BYTES + 64)  # a cancelled read leaves the buffer as it was
            except TimeoutError:
                if loop.time() - moved[0] >= IDLE_S:
                    raise PipeError(PipeFailure.IDLE) from None
                continue
            if not data:
                return
            total += len(data)
            if total > MAX_PIPE_BYTES:
                raise PipeError(PipeFailure.TOO_MUCH)
            self.relayed_bytes += len(data)
            moved[0] = loop.time()
            writer.write(data)
            async with asyncio.timeout(IDLE_S):
                await writer.drain()

    async def _refuse(self, writer: asyncio.StreamWriter, reason: PipeFailure) -> None:
        self.failures[reason] += 1
        with contextlib.suppress(Exception):
            await write_frame(writer, {"error": reason.value}, b"", STEP_TIMEOUT_S)
        writer.close()

    # --- target ------------------------------------------------------------------------------------------

    async def _take(self, relay: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer a pipe that ``relay`` opened on behalf of the peer its header names (the target's side)."""
        if not self._taking.take(relay):
            await self._refuse(writer, PipeFailure.BUSY)
            return
        try:
            head = await read_header(reader, STEP_TIMEOUT_S)
            opener, name = head.get("from"), head.get("name")
            if not (_peer_ok(opener) and opener != self._me and isinstance(name, str)):
                await self._refuse(writer, PipeFailure.BAD_REQUEST)
                return
            handler = self._handlers.get(name)
            if handler is None:
                await self._refuse(writer, PipeFailure.NO_HANDLER)
                return
            streams = await self._answer(relay, opener, name, reader, writer)
            if streams is None:
                return
            await handler(opener, *streams)
        except Exception as e:  # a malformed frame or a reset before the handler took the stream
            logger.debug("[%s] piped stream via %s ended: %s", self._me[-6:], relay[-6:], type(e).__name__)
            writer.close()
        finally:
            self._taking.give(relay)

    async def _answer(
        self, relay: str, opener: str, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Check the opener's hello and answer it; the sealed ends, or None (refused, counted)."""
        hello = await read_header(reader, STEP_TIMEOUT_S)
        try:
            theirs_raw = hello.get("e")
            theirs = _key_of(theirs_raw)
            assert isinstance(theirs_raw, bytes)
            self._signatures.verify(opener, HELLO_KIND, _body(opener, self._me, relay, name, theirs_raw),
                                    _sig(hello.get("sig")))  # fmt: skip
        except MessageRejected:
            await self._refuse(writer, PipeFailure.BAD_HANDSHAKE)
            return None
        mine = X25519PrivateKey.generate()
        transcript = _body(opener, self._me, relay, name, theirs_raw, _raw(mine))
        sig = self._signatures.sign(self._key, ACK_KIND, transcript)
        await write_frame(writer, {"e": _raw(mine), "sig": sig}, b"", STEP_TIMEOUT_S)
        to_target, to_opener = _keys(mine.exchange(theirs), transcript)
        return _sealed(Opened(reader, writer), to_opener, to_target)


def _sig(value: Any) -> bytes:
    if not isinstance(value, bytes) or len(value) != 64:
        raise MessageRejected("not a 64-byte signature")
    return value


def _name_ok(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200 and value.isascii() and value.isprintable()
