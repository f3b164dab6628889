"""One peer of a raw TCP mesh on ``--host``: the floor for moving an all-reduce's bytes (bench/bench_sync.py).

``--peers`` processes each hold a vector of ``--numel`` elements at 4, 2 or 1
byte(s) per element (encoding none, fp16, int8), cut into one slice per peer.
A round is the butterfly all-reduce's byte pattern without its arithmetic:
every peer sends slice j of its vector to its owner j (reduce-scatter); once an
owner has every part of its slice, it sends its slice back to every other peer
(all-gather). Plain blocking sockets, one connection per pair, ``sendall`` and
``recv_into`` preallocated buffers, one sending and one receiving thread per
connection. A round starts after an in-band barrier (a byte to and from every
peer); its ``seconds`` run from there until this peer has received everything.

Peers find each other through address files ``mesh.port.RANK`` (host and port) in ``--dir``.
JSON lines to ``--report``: ``ready``, one ``round`` per round (``seconds``,
``bytes_sent``, or ``error``), ``done`` (``peak_rss_mb``). Started by
bench/bench_sync.py; no side effects at import.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.procs import Reporter

REPO = Path(__file__).resolve().parents[1]


def _parse(argv: list[str]) -> argparse.Namespace:
    from bench.peer_common import group_parser

    p = group_parser(__doc__ or "")
    p.add_argument("--numel", type=int, required=True, help="elements per peer vector")
    p.add_argument("--dir", required=True, help="folder of the port files")
    p.add_argument("--timeout", type=float, default=120.0, help="bound on connecting and on every socket call, s")
    return p.parse_args(argv)


def _publish_port(folder: Path, rank: int, host: str, port: int) -> None:
    tmp = folder / f"mesh.port.{rank}.tmp"
    tmp.write_text(f"{host} {port}")
    os.replace(tmp, folder / f"mesh.port.{rank}")  # atomic: a reader never sees a half-written port


def _read_ports(folder: Path, peers: int, timeout: float) -> list[tuple[str, int]]:
    end = time.monotonic() + timeout
    paths = [folder / f"mesh.port.{i}" for i in range(peers)]
    while not all(p.exists() for p in paths):
        if time.monotonic() > end:
            raise TimeoutError(f"port files of {peers} peers not all in {folder} after {timeout:.0f} s")
        time.sleep(0.02)
    return [(host, int(port)) for host, port in (p.read_text().split() for p in paths)]


def _connect_all(args: argparse.Namespace, listener: socket.socket) -> dict[int, socket.socket]:
    """One connection per pair: this peer dials every higher rank, then accepts every lower one.

    Dialling first cannot deadlock: a dial completes in the listener's backlog before the other side accepts.
    """
    addresses = _read_ports(Path(args.dir), args.peers, args.timeout)
    conns: dict[int, socket.socket] = {}
    for j in range(args.rank + 1, args.peers):
        conn = socket.create_connection(addresses[j], timeout=args.timeout)
        conn.sendall(struct.pack("!I", args.rank))
        conns[j] = conn
    listener.settimeout(args.timeout)
    for _ in range(args.rank):
        conn, _addr = listener.accept()
        conn.settimeout(args.timeout)
        conns[struct.unpack("!I", _recv_exact(conn, memoryview(bytearray(4))))[0]] = conn
    for conn in conns.values():
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the barrier's single bytes go out at once
    return conns


def _recv_exact(conn: socket.socket, into: memoryview) -> memoryview:
    got = 0
    while got < len(into):
        n = conn.recv_into(into[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection mid-round")
        got += n
    return into


def _barrier(conns: dict[int, socket.socket]) -> None:
    for conn in conns.values():
        conn.sendall(b"b")
    one = memoryview(bytearray(1))
    for conn in conns.values():
        _recv_exact(conn, one)


class _Buffers:
    """One encoding's preallocated memory: own vector, the parts of own slice from the others, the gathered output."""

    def __init__(self, total: int, rank: int, peers: int) -> None:
        self.bounds = [total * i // peers for i in range(peers + 1)]
        self.rank = rank
        own = self.bounds[rank + 1] - self.bounds[rank]
        self.vec = memoryview(bytearray(b"\x01") * total)  # filled: untouched pages would cost no memory
        self.parts = memoryview(bytearray(own * (peers - 1)))
        self.out = memoryview(bytearray(total))
        self.own = own

    def slice_of(self, buf: memoryview, j: int) -> memoryview:
        return buf[self.bounds[j] : self.bounds[j + 1]]

    def bytes_sent(self, peers: int) -> int:
        return len(self.vec) - self.own + self.own * (peers - 1)


def _exchange(conns: dict[int, socket.socket], bufs: _Buffers, timeout: float) -> float:
    """One round (reduce-scatter bytes, then all-gather bytes); seconds until everything has arrived."""
    reduced = threading.Event()  # every part of own slice is in: the owner may send its slice back
    left = [len(conns)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def send(j: int) -> None:
        conns[j].sendall(bufs.slice_of(bufs.vec, j))
        if not reduced.wait(timeout):
            raise TimeoutError("own slice's parts did not all arrive")
        conns[j].sendall(bufs.slice_of(bufs.vec, bufs.rank))

    def receive(k: int, j: int) -> None:
        _recv_exact(conns[j], bufs.parts[k * bufs.own : (k + 1) * bufs.own])
        with lock:
            left[0] -= 1
            if left[0] == 0:
                reduced.set()
        _recv_exact(conns[j], bufs.slice_of(bufs.out, j))

    start = time.perf_counter()
    receivers = [_thread(receive, errors, k, j) for k, j in enumerate(conns)]
    senders = [_thread(send, errors, j) for j in conns]
    for t in receivers:
        t.join(timeout)
    elapsed = time.perf_counter() - start
    for t in senders:
        t.join(timeout)
    if errors or any(t.is_alive() for t in receivers + senders):
        raise RuntimeError(f"round failed: {errors[:1] or 'a thread did not finish in time'}")
    return elapsed


def _thread(target: Callable[..., None], errors: list[BaseException], *args: Any) -> threading.Thread:
    def run() -> None:
        try:
            target(*args)
        except BaseException as e:  # surfaced by _exchange: a thread's exception is otherwise only printed
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _run(args: argparse.Namespace, conns: dict[int, socket.socket], out: Reporter) -> None:
    from bench.peer_common import BYTES_PER_ELEMENT

    for encoding in args.encodings.split(","):
        bufs = _Buffers(args.numel * BYTES_PER_ELEMENT[encoding], args.rank, args.peers)
        for rnd in range(args.rounds_per):
            record: dict[str, Any] = {"event": "round", "encoding": encoding, "round": rnd}
            _barrier(conns)
            try:
                record["seconds"] = _exchange(conns, bufs, args.timeout)
            except (RuntimeError, OSError) as e:
                out.write(**record, error=str(e), time=time.time())
                return  # the byte streams are out of step now: no later round could be read right
            out.write(**record, bytes_sent=bufs.bytes_sent(args.peers), time=time.time())
        del bufs  # before the next encoding's buffers: the peak is the largest encoding's, not a sum


def main(argv: list[str]) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # run as a script: bench/ is importable from the repository root
    args = _parse(argv)
    from bench.peer_common import self_peak_rss_mb
    from tests.procs import Reporter

    out = Reporter(args.report)
    listener = socket.create_server((args.host, 0))
    _publish_port(Path(args.dir), args.rank, args.host, listener.getsockname()[1])
    conns = _connect_all(args, listener)
    out.write(event="ready", rank=args.rank, time=time.time())
    try:
        _run(args, conns, out)
    finally:
        out.write(event="done", peak_rss_mb=self_peak_rss_mb(), time=time.time())
        for conn in conns.values():
            conn.close()
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
