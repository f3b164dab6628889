"""A joiner's only bootstrap peer freezes: the joiners sync on together, on one history.

Each joiner is started with the first peer as its only ``--initial-peer``. The
joiners learn each other while they bootstrap (the DHT's routing through the
bootstrap peer, then direct connections), so freezing that peer (SIGSTOP of its
whole process group: worker, DHT child, p2pd) must not split them into islands
that each grow a history of their own. Frozen after a commit with them, it resumes
merely behind and catches up; frozen before its first commit it trusts no one
(a stranger's claim must not move a founder) and says so. Real hivemind
processes on 127.0.0.1.
"""

from __future__ import annotations

import pytest

from tests.faults import FaultSwarm, final_state, hashes_by_revision

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]


@pytest.mark.parametrize("when", ["after_a_sync", "before_any_sync"])
def test_joiners_sync_on_when_their_only_bootstrap_peer_freezes(fault_swarm: FaultSwarm, when: str) -> None:
    # boot steps longest after a sync with them (it must sync again after it resumes); before, only long
    # enough to read their records once it resumes
    boot = fault_swarm.start("boot", "--steps", "40" if when == "after_a_sync" else "12")
    joiners = [fault_swarm.start(n, "--steps", "24") for n in ("b", "c", "d")]
    for p in [boot, *joiners]:
        p.wait_ready()
    if when == "before_any_sync":
        boot.stop()
    fault_swarm.go()
    if when == "after_a_sync":
        joiners[0].wait_for(lambda r: r.get("committed") is True and r.get("group_size") == 4, 40.0, "a 4-peer commit")
        boot.stop()
    # the joiners commit as a group of three while the bootstrap peer is frozen
    for p in joiners:
        p.wait_for(lambda r: r.get("committed") is True and r.get("group_size") == 3, 60.0, "a commit without boot")
    boot.cont()
    finals = [final_state(p, 90.0) for p in [*joiners, boot]]
    for revision, hashes in hashes_by_revision([*joiners, boot]).items():
        assert len(hashes) == 1, f"revision {revision} has {len(hashes)} different states"
    newest = max(finals[:3], key=lambda f: f["revision"])
    if when == "after_a_sync":
        # boot catches up to its partners' history after it resumes
        assert (finals[3]["revision"], finals[3]["state_hash"]) == (newest["revision"], newest["state_hash"]), finals
    else:
        # boot committed no round, so it trusts no one: strangers' later states do not move it, it starts no
        # history of its own (nobody shares its state), and it says what the operator does about it
        assert finals[3]["revision"] == 0 and not any(r["committed"] for r in boot.syncs()), boot.syncs()
        assert "restart it with --peer" in boot.proc.output(), boot.proc.output()[-2000:]
