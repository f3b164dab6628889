"""The address book: peers this node has been connected to, kept next to its identity, for rejoining.

Next to it, the port this identity last listened on (:func:`listen_port`). The
multiaddr a node prints is what its operator hands to joiners and what peers'
books keep; a restart on another free port would void both. So a node asked
for any port (0) takes its previous one again when it is free.

A joiner whose ``--peer``s are all gone (the bootstrap node crashed, a
volunteer left) would otherwise be locked out of a swarm that still runs. The
book holds the most recently seen peers (at most :data:`BOOK_PEERS`, a few
addresses each), is written atomically and read with a size bound; a file that
cannot be read is ignored (it only ever helps). Bootstrap tries the given
``--peer``s first and adds the book from the second try on
(:func:`bootstrap_peers`).
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarm.private_files import write_private

logger = logging.getLogger(__name__)

BOOK_PEERS = 64
ADDRS_PER_PEER = 4
MAX_BOOK_BYTES = 256 * 1024


@dataclass(frozen=True)
class BookEntry:
    """One peer: its id, the multiaddrs it was reached at (without ``/p2p/``), when it was last seen."""

    peer: str
    addrs: tuple[str, ...]
    seen: float

    def multiaddrs(self) -> list[str]:
        return [f"{a}/p2p/{self.peer}" for a in self.addrs]


def book_path(identity_path: Path) -> Path:
    """``<identity>.peers.json``: one book per identity, so two nodes on one machine keep their own."""
    return identity_path.with_name(identity_path.name + ".peers.json")


def dialable(addr: str) -> bool:
    """A direct TCP address worth keeping (relayed and non-TCP ones are not dialed back)."""
    return "/tcp/" in addr and "/p2p-circuit" not in addr and "/p2p/" not in addr


def merge(
    book: Sequence[BookEntry], seen: Iterable[BookEntry], own_peer: str, size: int = BOOK_PEERS
) -> list[BookEntry]:
    """``seen`` added to ``book``: one entry per peer (the newest), most recent first, at most ``size``."""
    newest: dict[str, BookEntry] = {}
    for e in [*book, *seen]:
        addrs = tuple(a for a in e.addrs if dialable(a))[:ADDRS_PER_PEER]
        if e.peer == own_peer or not addrs:
            continue
        if e.peer not in newest or e.seen >= newest[e.peer].seen:
            newest[e.peer] = BookEntry(e.peer, addrs, e.seen)
    return sorted(newest.values(), key=lambda e: -e.seen)[:size]


def bootstrap_peers(attempt: int, given: Sequence[str], book: Sequence[BookEntry]) -> tuple[str, ...]:
    """Initial peers for bootstrap try ``attempt`` (from 1): the given ones, then also the book's.

    A node started without ``--peer`` founds a swarm and never uses the book.

    >>> e = BookEntry("Qm1", ("/ip4/10.0.0.2/tcp/5",), 1.0)
    >>> bootstrap_peers(1, ["/ip4/10.0.0.1/tcp/4/p2p/Qm0"], [e])
    ('/ip4/10.0.0.1/tcp/4/p2p/Qm0',)
    >>> bootstrap_peers(2, ["/ip4/10.0.0.1/tcp/4/p2p/Qm0"], [e])
    ('/ip4/10.0.0.1/tcp/4/p2p/Qm0', '/ip4/10.0.0.2/tcp/5/p2p/Qm1')
    >>> bootstrap_peers(2, [], [e])
    ()
    """
    if not given:
        return ()
    if attempt <= 1:
        return tuple(given)
    extra = [m for e in book for m in e.multiaddrs() if m not in given]
    return (*given, *extra)


def load_book(path: Path) -> list[BookEntry]:
    """The book at ``path``; [] if there is none or it cannot be read (logged)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BOOK_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as e:
        logger.warning("address book %s not read: %s", path, e)
        return []
    try:
        if len(raw) > MAX_BOOK_BYTES:
            raise ValueError(f"larger than {MAX_BOOK_BYTES} bytes")
        items = json.loads(raw)
        entries = [BookEntry(str(i["peer"]), tuple(str(a) for a in i["addrs"]), float(i["seen"])) for i in items]
    except (ValueError, TypeError, KeyError) as e:
        logger.warning("address book %s ignored: %s", path, e)
        return []
    return merge([], entries, own_peer="")


def save_book(path: Path, book: Sequence[BookEntry]) -> None:
    """Write the book atomically (a crash leaves the old one or the new one)."""
    data = json.dumps([{"peer": e.peer, "addrs": list(e.addrs), "seen": e.seen} for e in book])
    write_private(path, data.encode())


def port_path(identity_path: Path) -> Path:
    """``<identity>.port``: the port this identity last listened on."""
    return identity_path.with_name(identity_path.name + ".port")


def listen_port(path: Path, host: str, asked: int) -> int:
    """The port to listen on: ``asked``, or for 0 the one in ``path`` if it is free on ``host`` now (else 0)."""
    if asked != 0:
        return asked
    try:
        with open(path, "rb") as f:
            last = int(f.read(16).strip())
    except (OSError, ValueError):
        return 0
    return last if 0 < last < 65536 and port_free(host, last) else 0


def port_free(host: str, port: int) -> bool:
    """Whether a TCP listener can bind ``host:port`` now (SO_REUSEADDR, as the daemon binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def save_port(path: Path, maddrs: Sequence[str]) -> None:
    """Remember the TCP port of the first of this node's listen addresses (nothing if none has one)."""
    ports = [p for a in maddrs for kind, p in itertools.pairwise(str(a).split("/")) if kind == "tcp" and p.isdigit()]
    if ports:
        write_private(path, ports[0].encode())
