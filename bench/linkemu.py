"""A user-space link emulator: delay, order-keeping jitter and loss between pairs of interfaces.

This kernel has no ``netem``, so a WAN link is made in user space. Each emulated link is two
interfaces in one namespace with no addresses (``a``: the host's side, ``b``: the internet's side);
this process reads every Ethernet frame arriving on one with an ``AF_PACKET`` socket and writes it to
the other after the link's delay, or drops it with the link's loss probability. It is a wire, not a
router: ARP, TCP and UDP pass as they are, and the hosts at either end see only a slower, lossier cable.

Jitter never reorders: a frame leaves no earlier than the one before it on the same direction (the
internet's paths reorder rarely, and a reordering emulator would measure TCP's reordering recovery,
not latency). The delay is applied per direction, so a path through two emulated links (a home's and a
public host's) has a round-trip time of four delays.

The frames must be real frames: segmentation, receive coalescing and checksum offloads are switched
off on every interface at either end of an emulated link (``ethtool -K``, by :mod:`bench.wan`), or the
kernel hands this process 64 KiB super-frames with checksums left for hardware that is not there.

Run as ``python bench/linkemu.py --spec FILE`` inside the namespace that holds the interfaces; it
writes its counters (frames passed and dropped, per link and direction) to ``--stats FILE`` every second
and exits on SIGTERM. One process serves every link: on 2 cores, one loop costs less than one per link.
"""

from __future__ import annotations

import argparse
import json
import random
import select
import signal
import socket
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # a frame this host sent on the interface: the socket sees it too, and must skip it
FRAME_MAX = 65_536
SOCKET_BUFFER = 4 << 20  # a burst of a window's worth of frames waits here, not in a dropped queue
QUEUE_MAX = 20_000  # frames in flight per direction (about 30 MB): beyond it the wire drops, as a router would


@dataclass(frozen=True)
class LinkShape:
    """One direction's delay, jitter (uniform +-, order kept) and loss probability."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.delay_ms:
            raise ValueError(f"delay {self.delay_ms} ms with jitter {self.jitter_ms}: need 0 <= jitter <= delay")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss {self.loss} must be in [0, 1)")


@dataclass(frozen=True)
class LinkSpec:
    """An emulated link: the two interfaces it joins and the shape of each direction."""

    name: str
    a: str
    b: str
    up: LinkShape = field(default_factory=LinkShape)  # a -> b: the host's upload
    down: LinkShape = field(default_factory=LinkShape)  # b -> a


@dataclass
class Direction:
    """Frames in flight one way over one link, with their counters."""

    link: str
    way: str
    shape: LinkShape
    out: socket.socket
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    last_due: float = 0.0
    passed: int = 0
    dropped: int = 0
    overflow: int = 0

    def due(self, now: float, rng: random.Random) -> float:
        """When a frame arriving now leaves: its delay plus jitter, never before the previous frame."""
        jitter = rng.uniform(-self.shape.jitter_ms, self.shape.jitter_ms) if self.shape.jitter_ms else 0.0
        at = now + (self.shape.delay_ms + jitter) / 1000.0
        self.last_due = max(self.last_due, at)
        return self.last_due


def open_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


class Emulator:
    """Every link's two directions, served by one loop."""

    def __init__(self, links: list[LinkSpec], seed: int) -> None:
        self.rng = random.Random(seed)
        self.socks: dict[int, tuple[socket.socket, Direction]] = {}
        self.directions: list[Direction] = []
        for spec in links:
            a, b = open_socket(spec.a), open_socket(spec.b)
            up = Direction(spec.name, "up", spec.up, out=b)
            down = Direction(spec.name, "down", spec.down, out=a)
            self.socks[a.fileno()] = (a, up)
            self.socks[b.fileno()] = (b, down)
            self.directions += [up, down]
        self.running = True

    def _receive(self, sock: socket.socket, way: Direction, now: float) -> None:
        for _ in range(256):  # bounded per wake-up: one busy link cannot starve the others
            try:
                frame, addr = sock.recvfrom(FRAME_MAX)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            if way.shape.loss and self.rng.random() < way.shape.loss:
                way.dropped += 1
            elif len(way.queue) >= QUEUE_MAX:
                way.overflow += 1
            else:
                way.queue.append((way.due(now, self.rng), frame))

    def _send_due(self, now: float) -> float:
        """Write every frame whose time has come; returns the earliest time still waiting (inf: none)."""
        wake = float("inf")
        for way in self.directions:
            queue = way.queue
            while queue and queue[0][0] <= now:
                _, frame = queue.popleft()
                try:
                    way.out.send(frame)
                    way.passed += 1
                except (BlockingIOError, OSError):
                    way.overflow += 1  # a full device queue drops, as a real one does
            if queue:
                wake = min(wake, queue[0][0])
        return wake

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            f"{w.link}/{w.way}": {"passed": w.passed, "dropped": w.dropped, "overflow": w.overflow}
            for w in self.directions
        }

    def run(self, stats_path: Path | None) -> None:
        poller = select.epoll()
        for fd in self.socks:
            poller.register(fd, select.EPOLLIN)
        next_stats = time.monotonic()
        while self.running:
            now = time.monotonic()
            wake = self._send_due(now)
            timeout = min(max(wake - now, 0.0), 0.2) if wake != float("inf") else 0.2
            for fd, _ in poller.poll(timeout):
                sock, way = self.socks[fd]
                self._receive(sock, way, time.monotonic())
            if stats_path is not None and now >= next_stats:
                next_stats = now + 1.0
                write_stats(stats_path, self.stats())
        if stats_path is not None:
            write_stats(stats_path, self.stats())


def write_stats(path: Path, stats: dict[str, dict[str, int]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats))
    tmp.replace(path)  # readers never see half a file


def load_specs(path: Path) -> list[LinkSpec]:
    raw = json.loads(path.read_text())
    return [LinkSpec(s["name"], s["a"], s["b"], LinkShape(**s["up"]), LinkShape(**s["down"])) for s in raw["links"]]


def dump_specs(links: list[LinkSpec], path: Path) -> None:
    path.write_text(json.dumps({"links": [asdict(s) for s in links]}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True, help="JSON file of the links (dump_specs)")
    parser.add_argument("--stats", type=Path, default=None, help="where to write counters every second")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    args = parser.parse_args(argv)
    emulator = Emulator(load_specs(args.spec), args.seed)

    def stop(signum: int, frame: FrameType | None) -> None:
        emulator.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    emulator.run(args.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
