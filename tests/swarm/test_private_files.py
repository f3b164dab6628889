"""A node's own state files (vote journal, address book, last port) are readable by its user alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm.addressbook import BookEntry, book_path, load_book, port_path, save_book, save_port
from swarm.private_files import write_private
from swarm.sync.journal import VoteJournal, journal_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> object:
    old = os.umask(0o022)  # the usual default, under which plain writes come out 0644
    yield
    os.umask(old)


def test_journal_book_and_port_are_written_0600(tmp_path: Path, open_umask: object) -> None:
    identity = tmp_path / "node.key"
    journal = VoteJournal(journal_path(identity), "0" * 16)
    assert journal.record(7)
    book = book_path(identity)
    save_book(book, [BookEntry("12D3KooWA", ("/ip4/127.0.0.1/tcp/4001",), 1.0)])
    save_port(port_path(identity), ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWA"])
    for path in (journal_path(identity), book, port_path(identity)):
        assert _mode(path) == 0o600, (path.name, oct(_mode(path)))
    assert [e.peer for e in load_book(book)] == ["12D3KooWA"]
    assert VoteJournal(journal_path(identity), "0" * 16).voted == [7]


def test_a_replaced_file_gets_0600_whatever_it_had(tmp_path: Path, open_umask: object) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    path.chmod(0o644)
    stale = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a temporary left by a crash of this pid
    stale.write_bytes(b"")
    stale.chmod(0o666)
    write_private(path, b"new", fsync=True)
    assert path.read_bytes() == b"new" and _mode(path) == 0o600 and not stale.exists()
