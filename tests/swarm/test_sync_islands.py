"""Two islands that meet merge into one history: real hivemind processes on 127.0.0.1.

Two swarms are started apart (each founder without ``--peer``, its joiner through
it), so each grows a history of its own from the same revision-0 state: the
islands of a partition, or of a bootstrap peer frozen before its joiners met.
A fifth peer then joins through the islands' peers, which gives them a path to
each other. The histories' names (origins) differ, every peer ranks them the
same way (most live peers), and the losing island's peers merge into the
winner's history within 60 s of the bridge coming up: after it, one history,
and no revision number with two states.
"""

from __future__ import annotations

import time

import pytest

from tests.faults import FaultSwarm, Peer, Record

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]

MERGE_S = 60.0
"""The bound on a merge once a path exists."""


def _committed(peer: Peer, since: float = 0.0) -> list[Record]:
    return [r for r in peer.syncs() if r["committed"] and float(r["time"]) >= since]


def test_islands_that_meet_merge_into_the_larger_history(fault_swarm: FaultSwarm) -> None:
    halt = fault_swarm.root / "halt"
    # steps of a fine-tuning's scale (0.1% of a weight): islands apart for minutes stay the same model, well
    # within max_state_shift of each other (the worker's default random walk leaves it within ~100 steps)
    run = ("--steps", "100000", "--halt-file", str(halt), "--linger", "5", "--step-scale", "0.001")
    seed = {n: ("--update-seed", str(i + 1)) for i, n in enumerate(["a0", "a1", "b0", "b1", "c"])}  # own steps
    a0 = fault_swarm.start("a0", *run, *seed["a0"])
    a1 = fault_swarm.start("a1", *run, *seed["a1"])
    b0, b0_addr = fault_swarm.founder("b0", *run, *seed["b0"])
    b1 = fault_swarm.start("b1", *run, *seed["b1"], via=[b0_addr])
    islands = [a0, a1, b0, b1]
    for p in islands:
        p.wait_ready()
    fault_swarm.go()
    for p in islands:  # each island commits on its own: two histories
        p.wait_for(lambda r: r.get("committed") is True and r.get("revision", 0) >= 2, 60.0, "two commits")
    origins = {p.name: _committed(p)[-1]["origin"] for p in islands}
    assert origins["a0"] == origins["a1"] != origins["b0"] == origins["b1"], origins

    # the bridge knows every island peer (its address book held them all). Whether the merged peers then
    # commit together depends on the two DHTs' routing: a member whose join records the others' reads
    # miss keeps their groups from agreeing, whichever history they share (seen for over 60 s in about one
    # run in eight; SECURITY.md, "Outer sync"). Judged here: every peer on one history within the bound.
    via = [p.info["maddrs"][0] for p in (a0, a1, b1)] + [b0_addr]
    bridge = fault_swarm.start("c", *run, *seed["c"], via=via)
    bridge.wait_ready()
    met = time.time()
    peers = [*islands, bridge]

    def last_origins() -> dict[str, str | None]:
        """Each peer's history in its latest sync report (None until it has one)."""
        syncs = {p.name: [r for r in p.syncs() if float(r["time"]) >= met and r["origin"]] for p in peers}
        return {name: got[-1]["origin"] if got else None for name, got in syncs.items()}

    while time.time() < met + MERGE_S + 30.0:  # observed past the bound, judged against it below
        finals = last_origins()
        if None not in finals.values() and len(set(finals.values())) == 1:
            break
        time.sleep(0.5)
    took = time.time() - met
    finals = last_origins()
    together: list[Record] = []
    for _ in range(40):  # reported, not judged: whether the five then commit together (see above)
        together = [r for r in _committed(bridge, met) if r["group_size"] == 5]
        if together:
            break
        time.sleep(0.5)
    halt.touch()
    print(f"after the bridge: one history in {took:.1f} s; last origins {finals}; islands {origins}")
    first = f"{float(together[0]['time']) - met:.1f}s" if together else "none"
    print(f"first commit of all five: {first}")
    assert None not in finals.values() and len(set(finals.values())) == 1, finals
    assert took <= MERGE_S, f"the islands took {took:.0f} s to merge"
    winner = next(iter(set(finals.values())))
    losers = [p for p in islands if origins[p.name] != winner]
    assert len(losers) == 2, (winner, origins)  # the bridge joined one island: the other has fewer live peers
    for p in losers:
        merges = [r for r in p.syncs() if r.get("merged")]
        print(p.name, "merged:", [(r["revision"], r["committed"], r.get("weights_kept")) for r in merges])
        assert merges and all(r.get("weights_kept", True) for r in merges), p.syncs()[-5:]
    # once a peer merged, the islands knew of each other: no revision number names two states after it
    first_merge = min(float(r["time"]) for p in losers for r in p.syncs() if r.get("merged"))
    after: dict[int, set[str]] = {}
    for p in peers:
        for r in _committed(p, first_merge):
            after.setdefault(r["revision"], set()).add(r["state_hash"])
    assert all(len(h) == 1 for h in after.values()), after
