"""A member that voted and died before it learned the outcome never reuses that revision after a restart.

The 30-minute chaos run of seed 41 forked so: a member voted for revision 38, was frozen and killed
before it recorded the commit its partner made, and restarted from its checkpoint at 37; its partner
died too, and the DHT nodes holding their records with them. 557 s later it committed a second 38
with a newcomer. Here, over real processes on 127.0.0.1: a pair commits up to revision 3, the second
member freezing right after its vote for 3; both are killed, so no record of 1-3 survives anywhere but
in the peers' own files; both restart (at revision 0: the worker keeps no checkpoint, which is the
same knowledge as a checkpoint older than the vote) with other training. Their journals of votes
(``swarm.sync.journal``) make their first commit skip past every revision they voted for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.sync.journal import KEPT, VoteJournal, journal_path
from tests.faults import FaultSwarm, hashes_by_revision


@pytest.mark.network
@pytest.mark.timeout(240)
def test_a_restart_skips_every_revision_its_earlier_process_voted_for(fault_swarm: FaultSwarm) -> None:
    a = fault_swarm.start("a", "--steps", "1000", "--update-seed", "1")
    b = fault_swarm.start("b", "--steps", "1000", "--update-seed", "2", "--fault", "voted:2:stop")
    for p in (a, b):
        p.wait_ready()
    fault_swarm.go()
    a.wait_for(lambda r: r.get("committed") is True and r.get("revision") == 3, 90.0, "a's commit of revision 3")
    b.wait_for(lambda r: r.get("event") == "phase" and r.get("phase") == "voted", 10.0, "b frozen after its vote")
    assert not any(r["committed"] and r["revision"] == 3 for r in b.syncs())  # b never learned of it
    for p in (a, b):
        p.kill()
        p.proc.wait(10.0)
    # both restart with other training; nothing in the swarm remembers revisions 1-3
    a2 = fault_swarm.restart("a", "--steps", "24", "--update-seed", "11")
    b2 = fault_swarm.restart("b", "--steps", "24", "--update-seed", "12")
    first = [p.wait_for(lambda r: r.get("committed") is True, 90.0, "a commit after the restart") for p in (a2, b2)]
    everyone = [a, b, a2, b2]
    for revision, hashes in hashes_by_revision(everyone).items():
        assert len(hashes) == 1, f"revision {revision} has {len(hashes)} states: {hashes_by_revision(everyone)}"
    assert all(f["revision"] > 3 for f in first), first


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
