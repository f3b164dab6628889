"""The vote journal (swarm.sync.journal): what it keeps, what it refuses to read, and a write that fails.

The chaos run it answers (a member that voted, died before it learned the outcome and reused that
revision after a restart) plays on the simulated network: tests/swarm/test_sync_sim_rounds.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from swarm.sync.journal import KEPT, VoteJournal, journal_path


def test_the_journal_keeps_the_newest_votes_of_its_own_fingerprint_only(tmp_path: Path) -> None:
    path = journal_path(tmp_path / "identity.key")
    journal = VoteJournal(path, "fp-a")
    assert journal.voted == [] and all(journal.record(r) for r in range(1, KEPT + 11))
    again = VoteJournal(path, "fp-a")  # a restart reads what the last process wrote
    assert again.voted == list(range(11, KEPT + 11))
    assert VoteJournal(path, "fp-b").voted == []  # another model or outer rule: not its revisions
    for junk in (b"\x00garbage", json.dumps({"fingerprint": "fp-a", "voted": "3"}).encode(), b"[1, 2]"):
        path.write_bytes(junk)
        assert VoteJournal(path, "fp-a").voted == []  # unreadable: nothing, never a crash
    path.write_bytes(json.dumps({"fingerprint": "fp-a", "voted": [4, True, "5", -1, 6]}).encode())
    assert VoteJournal(path, "fp-a").voted == [4, 6]
    path.write_bytes(b" " * 20_000 + b"[]")
    assert VoteJournal(path, "fp-a").voted == []  # over its size bound: not read
    assert VoteJournal(None, "fp-a").record(7)  # no file: nothing kept, nothing fails


def test_a_vote_that_cannot_be_journalled_fails_the_write(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    journal = VoteJournal(blocked / "identity.key.votes.json", "fp")
    assert not journal.record(3) and journal.voted == []  # OuterSync then votes abort
