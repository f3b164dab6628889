"""Joining the swarm: a hivemind DHT (first peer or joiner), its P2P replica, and shutdown.

The DHT runs in hivemind's child process; this process gets a *replica* of
its P2P client (same p2pd daemon, same peer id), used for payload streams and
sync traffic, driven from a private :class:`LoopThread`. Right after the DHT
starts, its storage and cache are replaced by byte-budgeted ones
(:mod:`swarm.dht_storage`; bounds in :class:`MembershipConfig`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import hivemind
import torch
from hivemind.dht.validation import RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

from swarm.addressbook import (
    BookEntry,
    book_path,
    bootstrap_peers,
    listen_port,
    load_book,
    merge,
    port_path,
    save_book,
    save_port,
)
from swarm.configs import MembershipConfig as MembershipConfig
from swarm.dht_storage import StorageStats, install_budgets, storage_stats
from swarm.errors import BootstrapFailed, PortInUse
from swarm.identity import Identity
from swarm.loop import LoopThread
from swarm.maddr import parse_peer_multiaddr as parse_peer_multiaddr
from swarm.reach import HANDLER as REACH_HANDLER
from swarm.reach import DialBackServer, Reachability, Verdict, check, ip_of_multiaddr, local_ips, p2p_reachability

logger = logging.getLogger(__name__)


def classify_start_error(message: str) -> str | None:
    """Why the DHT did not start: "port" (in use), "bootstrap" (no initial peer answered) or None.

    p2pd says "failed to connect to bootstrap peers"; hivemind's DHTNode raises
    "DHTNode bootstrap failed" when no initial peer answered its ping.

    >>> classify_start_error("listen tcp4 127.0.0.1:5: bind: address already in use")
    'port'
    >>> classify_start_error("DHTNode bootstrap failed: none of the initial_peers responded")
    'bootstrap'
    """
    if "address already in use" in message:
        return "port"
    if "bootstrap" in message:
        return "bootstrap"
    return None


_PATCHING = threading.Lock()
RELAY_LIMITS: dict[str, int | str] = {
    "relayMaxReservations": 32,  # peers behind NAT that may hold a slot on this node at once
    "relayMaxCircuits": 4,  # relayed connections per peer at once
    "relayBufferSize": 256 * 1024,  # bytes buffered per relayed connection and direction
    "relayDataLimit": 1 << 30,  # bytes one relayed connection carries each way before it is reset
    "relayTimeLimit": "30m",  # how long one relayed connection lives
}
"""What a node that serves as a libp2p relay gives peers behind NAT, at most: p2pd's own flag defaults (128
reservations, 16 circuits each, 16 MiB buffers: up to 64 GiB of buffers for a peer with many keys) are
bounded here to at most 32 x 4 x 2 x 256 KiB = 64 MiB. Only sometimes in force: p2pd also starts a relay
with libp2p's built-in resources (128 reservations, 16 circuits, 2 KiB buffers, 128 KiB and 2 minutes per
circuit), and whichever of the two registers its handler last serves (go-libp2p's relay service starts on
the reachability event, p2pd's own right after start). Both are bounded; the second cuts any circuit past
128 KiB, which is why the outer sync never uses circuits (swarm.sync.pipe)."""


@contextlib.contextmanager
def relay_limits(flags: dict[str, int | str]) -> Iterator[None]:
    """Add ``flags`` to the p2pd command line of a DHT started inside this block.

    hivemind's P2P passes no relay limits to its daemon and takes none; the DHT process is forked from
    this one, so it inherits the wrapped argument builder as it is when it starts. One block at a time in
    a process: two DHTs started at once from two threads would otherwise restore each other's builder.
    """
    if not flags:
        yield
        return
    with _PATCHING:
        original = P2P._make_process_args

        def with_limits(*args: Any, **kwargs: Any) -> list[str]:
            built: list[str] = original(*args, **{**kwargs, **flags})
            return built

        P2P._make_process_args = staticmethod(with_limits)
        try:
            yield
        finally:
            P2P._make_process_args = staticmethod(original)


class Membership:
    """This node's presence in the swarm. Start with :meth:`start`; always :meth:`shutdown`."""

    def __init__(
        self,
        identity: Identity,
        cfg: MembershipConfig,
        record_validators: Iterable[RecordValidatorBase] = (),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.identity = identity
        self.cfg = cfg
        self._validators = list(record_validators)
        self._sleep = sleep
        self.dht: hivemind.DHT | None = None
        self.loop: LoopThread | None = None
        self._p2p: P2P | None = None
        self._port = cfg.port
        self.dial_back = DialBackServer(time.monotonic)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def start(self) -> Membership:
        """Start the DHT, retrying the bootstrap with exponential backoff (from the 2nd try through the book too)."""
        delay = self.cfg.bootstrap_backoff_s
        book = load_book(self.book_path) if self.cfg.address_book else []
        remember = self.cfg.address_book and not self.cfg.announce  # an announced port is the NAT's, not ours
        self._port = listen_port(self._port_path, self.cfg.host, self.cfg.port) if remember else self.cfg.port
        for attempt in range(1, self.cfg.bootstrap_attempts + 1):
            peers = bootstrap_peers(attempt, self.cfg.initial_peers, book)
            try:
                dht = self._start_listening(peers)
                self._install_budgets(dht)
                self.dht = dht
                break
            except (P2PDaemonError, RuntimeError) as e:
                cause = classify_start_error(str(e))
                if cause == "port":
                    raise PortInUse(
                        f"port {self.cfg.port} on {self.cfg.host} is already in use; "
                        "pick another with --host-port or use 0 for a free one"
                    ) from None
                if cause is None:
                    raise
                if attempt == self.cfg.bootstrap_attempts:
                    raise BootstrapFailed(
                        f"none of the initial peers answered after {attempt} tries "
                        f"({', '.join(self.cfg.initial_peers)}) nor any of the {len(book)} peers in the address book; "
                        "check the --peer address and that the node runs"
                    ) from None
                logger.warning(
                    "[%s] no initial peer answered (try %d); retrying in %.1fs", self.peer_id[-6:], attempt, delay
                )
                self._sleep(delay)
                delay *= 2
        self.loop = LoopThread(f"swarm-loop-{self.peer_id[-6:]}")
        assert self.dht is not None
        self._p2p = self.loop.run(self.dht.replicate_p2p(), self.cfg.startup_timeout_s)
        if remember:
            try:
                maddrs = self.loop.run(self._p2p.get_visible_maddrs(), self.cfg.startup_timeout_s)  # cached: no I/O
                save_port(self._port_path, [str(m) for m in maddrs])
            except (OSError, ValueError) as e:
                logger.debug("listen port not remembered: %s", e)
        if self.cfg.address_book:
            asyncio.run_coroutine_threadsafe(self._keep_book(book), self.loop.loop)
        if not self.cfg.client_mode:  # a client-mode node accepts no connection: nobody could dial anything back
            self.loop.run(self._serve_dial_back(), self.cfg.startup_timeout_s)
        return self

    async def _serve_dial_back(self) -> None:
        async def on_stream(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            addr = getattr(info, "addr", None)
            try:
                await self.dial_back.handle(None if addr is None else str(addr), reader, writer)
            except asyncio.CancelledError:  # leaving mid-answer: quietly
                writer.close()

        await self.p2p.add_binary_stream_handler(REACH_HANDLER, on_stream)

    def reachability(self, timeout: float) -> Verdict:
        """Whether peers can dial this node: up to three connected peers (initial peers first) dial it back.

        Bounded by ``timeout`` (the answers that came by then count); never raises.
        """
        visible = self.visible_multiaddrs()
        listen = [ip for ip in map(ip_of_multiaddr, visible) if ip]
        ports = [int(a.split("/tcp/", 1)[1].split("/", 1)[0]) for a in visible if "/tcp/" in a]
        if not ports:
            return Verdict(Reachability.UNKNOWN, None, 0)

        async def open_stream(peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            _, reader, writer = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer), REACH_HANDLER)
            return reader, writer

        async def run() -> Verdict:
            infos = await asyncio.wait_for(self.p2p.list_peers(), timeout)
            initial = {p.rsplit("/p2p/", 1)[-1] for p in self.cfg.initial_peers}
            peers = sorted((i.peer_id.to_base58() for i in infos), key=lambda p: p not in initial)
            return await check(open_stream, peers, ports[0], listen, timeout)

        try:
            verdict: Verdict = self.run(run(), timeout + 1.0)
        except Exception as e:  # the loop or the daemon gone, a timeout: unknown, never a failed start
            logger.debug("[%s] reachability not checked: %s", self.peer_id[-6:], type(e).__name__)
            return Verdict(Reachability.UNKNOWN, None, 0)
        return verdict

    @property
    def book_path(self) -> Path:
        return book_path(self.identity.path)

    @property
    def _port_path(self) -> Path:
        return port_path(self.identity.path)

    async def _keep_book(self, book: list[BookEntry]) -> None:
        """Add the peers connected now to the address book: soon after joining, then at most every N s.

        Runs on the loop until :meth:`shutdown` cancels it; a failure is logged, never raised.
        """
        wait = min(2.0, self.cfg.address_book_every_s)
        while True:
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.cfg.address_book_every_s)
            try:
                infos = await asyncio.wait_for(self.p2p.list_peers(), self.cfg.shutdown_timeout_s)
                now = time.time()
                seen = [BookEntry(i.peer_id.to_base58(), tuple(str(a) for a in i.addrs), now) for i in infos]
                book = merge(book, seen, self.peer_id)
                save_book(self.book_path, book)
            except (OSError, RuntimeError, TimeoutError, P2PDaemonError) as e:
                logger.debug("address book not updated: %s", e)

    def _start_listening(self, peers: tuple[str, ...]) -> hivemind.DHT:
        """Start the DHT on this start's port; a remembered port taken since its check falls back to the asked one."""
        try:
            return self._start_dht(peers, self._port)
        except (P2PDaemonError, RuntimeError) as e:
            if self._port == self.cfg.port or classify_start_error(str(e)) != "port":
                raise
        logger.info("[%s] port %d is taken now; listening on port %d", self.peer_id[-6:], self._port, self.cfg.port)
        self._port = self.cfg.port
        return self._start_dht(peers, self._port)

    def _start_dht(self, initial_peers: tuple[str, ...], port: int) -> hivemind.DHT:
        share_memory_by_fd()
        kwargs: dict[str, Any] = {
            "host_maddrs": [f"/ip4/{self.cfg.host}/tcp/{port}"],
            "identity_path": str(self.identity.path),
            # hivemind's "identity taken" probe crashes on Ed25519 keys (docs/ARCHITECTURE.md, "Ed25519 identity probe")
            "check_if_identity_free": False,
            "startup_timeout": self.cfg.startup_timeout_s,
        }
        if initial_peers:
            kwargs["initial_peers"] = list(initial_peers)
        if self.cfg.announce:
            kwargs["announce_maddrs"] = list(self.cfg.announce)
        if self.cfg.client_mode:
            kwargs["client_mode"] = True
        kwargs["use_relay"] = self.cfg.use_relay
        kwargs["use_auto_relay"] = self.cfg.use_auto_relay
        forced = p2p_reachability(self.cfg.host, self.cfg.announce, self.cfg.client_mode, initial_peers, local_ips())
        if forced is not None and self.cfg.use_relay:
            kwargs["force_reachability"] = forced
        if forced == "private" and self.cfg.use_relay:  # reserve a slot on the peers it joined through
            kwargs["use_auto_relay"] = True
            kwargs["trusted_relays"] = list(initial_peers)
        kwargs["cache_size"] = self.cfg.dht_cache_keys  # hivemind's default cache is unbounded
        kwargs["cache_nearest"] = 0  # others keep only records their owners store (swarm.dht_storage)
        with relay_limits(RELAY_LIMITS if self.cfg.use_relay else {}):
            return hivemind.DHT(start=True, record_validators=self._validators, **kwargs)

    def _install_budgets(self, dht: hivemind.DHT) -> None:
        """Budget the new DHT's storage and cache; a DHT left unbounded is shut down, not used."""
        try:
            install_budgets(dht, self.cfg.storage_budget(), self.cfg.cache_budget(), self.cfg.startup_timeout_s)
        except BaseException:
            dht.shutdown()
            raise

    def dht_storage_stats(self) -> dict[str, StorageStats]:
        """Ledger snapshots of the DHT process's budgeted ``storage`` and ``cache``."""
        if self.dht is None:
            raise RuntimeError("membership is not started")
        return storage_stats(self.dht, self.cfg.startup_timeout_s)

    @property
    def p2p(self) -> P2P:
        if self._p2p is None:
            raise RuntimeError("membership is not started")
        return self._p2p

    def visible_multiaddrs(self, latest: bool = False) -> list[str]:
        """Addresses others can use to join through this node (with /p2p/<id>); ``latest`` asks the daemon again
        (a relayed address appears once a relay reserved a slot)."""
        if self.dht is None:
            return []
        if latest and self._p2p is not None:  # the replica asks the daemon on our loop, within a bound
            try:
                found = self.run(self._p2p.get_visible_maddrs(latest=True), self.cfg.shutdown_timeout_s)
                return [str(m) for m in found]
            except Exception as e:  # the daemon is slow or gone: the addresses known at start
                logger.debug("[%s] addresses not refreshed: %s", self.peer_id[-6:], type(e).__name__)
        return [str(m) for m in self.dht.get_visible_maddrs()]

    def run(self, coro: Any, timeout: float) -> Any:
        """Run a coroutine on this node's P2P loop with a timeout."""
        if self.loop is None:
            raise RuntimeError("membership is not started")
        return self.loop.run(coro, timeout)

    def shutdown(self) -> None:
        """Stop the loop, the P2P replica and the DHT process, each bounded in time.

        A Ctrl-C reaches the whole process group, so p2pd may have stopped first: the DHT process then
        cannot leave gracefully (its shutdown would talk to the gone daemon until hivemind's grace runs
        out and it is terminated anyway), so it is stopped directly.
        """
        daemon_up = self._daemon_answers()
        if self.loop is not None and self._p2p is not None:
            try:
                self.loop.run(self._p2p.shutdown(), self.cfg.shutdown_timeout_s)
            except Exception as e:  # shutting down: log and go on
                logger.debug("p2p replica shutdown: %s", e)
        if self.loop is not None:
            self.loop.stop(self.cfg.shutdown_timeout_s)
        if self.dht is not None and not daemon_up:
            logger.debug("p2pd has stopped already: terminating the DHT process")
            self.dht.terminate()
            self.dht.join(min(1.0, self.cfg.shutdown_timeout_s))
        if self.dht is not None and self.dht.is_alive() and daemon_up:
            try:
                # hivemind's shutdown waits its own grace, then sends SIGTERM; a DHT process still alive a
                # second later is stuck (its p2pd died first, as on Ctrl-C to the process group): kill it
                self.dht.shutdown()
                self.dht.join(min(1.0, self.cfg.shutdown_timeout_s))
            except Exception as e:
                logger.debug("dht shutdown: %s", e)
        if self.dht is not None and self.dht.is_alive():
            self.dht.kill()
        self.dht, self.loop, self._p2p = None, None, None

    def _daemon_answers(self) -> bool:
        """Whether p2pd may still be running: False only when it refuses this process's replica outright.

        A stopped p2pd's socket is gone, which fails at once; a slow answer counts as running (terminating
        the DHT process under a live p2pd would leave that daemon behind).
        """
        if self.loop is None or self._p2p is None:
            return True
        try:
            self.loop.run(self._p2p.list_peers(), min(1.0, self.cfg.shutdown_timeout_s))
        except TimeoutError:
            return True
        except Exception as e:  # refused: nothing listens on the daemon's socket any more
            logger.debug("p2pd does not answer: %s", e)
            return False
        return True

    def connected_peers(self, timeout_s: float = 2.0) -> int | None:
        """How many peers p2pd holds connections to now (of any swarm id), or None if it does not say."""
        if self.loop is None or self._p2p is None:
            return None
        try:
            return len(self.loop.run(self._p2p.list_peers(), timeout_s))
        except Exception as e:  # a question for a warning's wording: never worth failing a round
            logger.debug("connected peers not known: %s", e)
            return None

    def __enter__(self) -> Membership:
        return self.start() if self.dht is None else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def share_memory_by_fd() -> None:
    """Have hivemind share tensors by file descriptor, so no ``torch_shm_manager`` process is started.

    hivemind sets torch's ``file_system`` strategy at import (unless
    ``HIVEMIND_MEMORY_SHARING_STRATEGY`` says otherwise). Its only use here is
    the one byte of state of each future between a node and its DHT process,
    and under ``file_system`` the first one forks a manager process per node
    (~56 MB unique memory measured, about a quarter of a tiny node) that reads
    its address in native code holding the GIL: a Ctrl-C that killed the manager
    before it answered left the node spinning at 100% CPU for good. Passing the
    descriptor needs neither. A strategy the operator set in that variable is
    kept (then the manager starts shielded, see :func:`shield_shm_manager`).
    """
    if "HIVEMIND_MEMORY_SHARING_STRATEGY" not in os.environ:
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
    shield_shm_manager()


def shield_shm_manager() -> None:
    """Start torch's shared-memory manager, if hivemind's sharing strategy needs one, deaf to SIGINT/SIGTERM.

    hivemind shares tensors with the ``file_system`` strategy, whose first use
    forks ``torch_shm_manager`` and reads its address in native code holding
    the GIL. A Ctrl-C reaches the whole process group: if it kills the manager
    before it answered, that read loops forever at 100% CPU and no signal
    handler can run. Started here with the signals blocked, the manager
    inherits the blocked mask and survives; ours is restored right after, so a
    signal that came meanwhile is delivered then, not lost. Idempotent.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # the mask is per thread; a node starts its membership on the main thread
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        torch.empty(1, dtype=torch.uint8).share_memory_()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def peer_id_obj(peer_id: str) -> PeerID:
    """hivemind PeerID from its base58 text."""
    return PeerID.from_base58(peer_id)


def first_maddrs(members: Sequence[Membership]) -> list[str]:
    """The visible multiaddrs of the first member (convenient for tests and `local`)."""
    return members[0].visible_multiaddrs()
