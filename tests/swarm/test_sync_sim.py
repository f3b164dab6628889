"""The real outer sync, whole rounds of it, on the simulated network (tests/simnet.py): no daemons.

Each member is a real :class:`OuterSync` on its own thread with its own
identity, records and journal; only the network is simulated, on one
virtual clock, so a round of a few virtual seconds takes milliseconds and a
fault lands exactly where the scenario puts it (at a point the round passes,
:mod:`swarm.sync.points`, or at a virtual time). Records are signed by the
simulation's keyed hash and journals kept in memory (tests/simnet.py) but
with ``ed25519=True``: then Ed25519 and a journal file each, as a node has.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from protocol import SigningKey, codec
from protocol.errors import MessageRejected
from protocol.signing import ED25519, Signatures, seal
from swarm.identity import Identity
from swarm.membership import Membership, MembershipConfig
from swarm.sync import AbortCause, OuterSync, OuterSyncConfig, SyncReport
from swarm.sync.points import RoundPoint
from swarm.sync.records import MAX_RECORD_BYTES, STATE_KIND, StateRecord, open_record, seal_record
from swarm.sync.tensors import flatten, load_flat
from swarm.sync.transport import SyncNet
from tests.simnet import EPOCH, KeyedHash, MemoryJournal, SimNet, VirtualLoop, joined, one_cpu, start_thread

CFG = OuterSyncConfig(
    matchmaking_timeout_s=1.5,
    allreduce_timeout_s=4.0,
    chunk_timeout_s=2.0,
    commit_timeout_s=2.0,
    dht_timeout_s=4.0,
    state_timeout_s=6.0,
    poll_s=0.05,
    ping_timeout_s=1.0,
    direct_payloads=False,  # payloads on the simulated streams: no sockets
)
"""tests/sync_worker.py's timings (the daemon tests'): every wait is virtual here."""
WALL_S = 3.0
"""Wall-time bound on one small scenario (it takes ~0.2 s alone): a simulated round costs milliseconds, not
its virtual seconds; the bound is loose because the machine is shared."""


def _key(name: str) -> SigningKey:
    return SigningKey(hashlib.sha256(name.encode()).digest())


@dataclass(frozen=True)
class Restart:
    """A member's process started again: when, after how many of its reports, and what its journal held."""

    at: float
    reports: int
    journalled: tuple[int, ...]


@dataclass
class Member:
    """One simulated peer: its identity, its sync's reports, and what it holds after each."""

    name: str
    key: SigningKey
    via: str = ""
    """The member it joined through (its ``--peer``: trusted for catch-up), "" for a founder."""
    reports: list[SyncReport] = field(default_factory=list)
    states: list[tuple[int, str]] = field(default_factory=list)
    """(revision, state hash) after each round."""
    journal: MemoryJournal | None = field(default_factory=MemoryJournal)
    """Its vote journal, kept across its restarts (None: a file beside its identity, as a node's)."""
    checkpoint: tuple[dict[str, Any], torch.Tensor, int] | None = None
    """Its outer state, weights and inner step after its last round: what a restarted process loads."""
    restarts: list[Restart] = field(default_factory=list)
    restart: Callable[[], None] | None = None
    """Starts its process again after a crash (call on the loop's thread; set by :func:`simulate`)."""

    @property
    def peer(self) -> str:
        return self.key.peer_id


def _model(shape: tuple[int, int] = (6, 4)) -> torch.nn.Module:
    """The same weights on every member of one ``shape`` (revision 0 is shared), drawn from a generator of
    its own: the members build theirs on threads at once, and the global generator would interleave their
    draws."""
    model = torch.nn.Linear(*shape)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def _model_size() -> int:
    """The parameters of every member's model (:func:`_model`): what the sync's time bound grows with."""
    return sum(p.numel() for p in _model().parameters())


def _run_member(
    member: Member,
    net: SyncNet,
    clock: Callable[[], float],
    root: Path,
    plan: Plan,
    observe: Callable[[RoundPoint, int], None] | None = None,
    signatures: Signatures = ED25519,
    cfg: OuterSyncConfig = CFG,
    setup: Callable[[OuterSync], None] | None = None,
    shape: tuple[int, int] = (6, 4),
) -> None:
    """Train a little and sync, round after round, as long as ``plan`` says; ``setup`` sees each process's
    sync before its first round (a hostile member's code, say)."""
    identity = Identity(member.key, root / f"{member.name}.key")
    peers = (f"/ip4/127.0.0.1/tcp/4001/p2p/{member.via}",) if member.via else ()
    membership = Membership(identity, MembershipConfig(swarm_id="sim", address_book=False, initial_peers=peers))
    model = _model(shape)
    sync = OuterSync(membership, model, cfg, clock, observe, net, signatures, member.journal)
    gen = torch.Generator().manual_seed(int.from_bytes(member.key.seed[:4], "big") + len(member.restarts))
    step, until = 0, EPOCH + plan.for_s  # a restarted process ends when the first would have
    if member.restarts and member.checkpoint is not None:  # as a node restarts: from its last checkpoint
        state, weights, step = member.checkpoint
        load_flat(model, weights)
        sync.load_state_dict(state)
    if setup is not None:
        setup(sync)
    try:
        while step < plan.rounds:
            pause = plan.pause(clock())
            if clock() + pause > until:
                break  # none begun after for_s (a period's round would begin past it)
            net.loop.sleep(pause)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
            step += 1
            member.reports.append(sync.sync_now(step))
            member.states.append((sync.revision, sync.state_hash))
            member.checkpoint = (sync.state_dict(), flatten(model), step)
    finally:
        sync.close()


@dataclass(frozen=True)
class Plan:
    """How long each member goes on: ``rounds`` syncs at most, none begun after ``for_s`` virtual seconds,
    each after ``train_s`` virtual seconds of training, or at the next multiple of ``period_s`` (as nodes
    with ``sync_period_s`` do)."""

    rounds: int = 1_000_000
    for_s: float = 3600.0
    train_s: float = 0.0
    period_s: float = 0.0

    def pause(self, now: float) -> float:
        """How long a member trains before its next sync, at wall time ``now``."""
        if self.period_s <= 0:
            return self.train_s
        return self.period_s - (now - EPOCH) % self.period_s


def simulate(
    root: Path,
    names: list[str],
    plan: Plan,
    faults: Callable[[SimNet, dict[str, Member]], Coroutine[Any, Any, None]] | None = None,
    observers: dict[str, Callable[[SimNet, Member], Callable[[RoundPoint, int], None]]] | None = None,
    ed25519: bool = False,
    cfg: OuterSyncConfig = CFG,
    setups: Mapping[str, Callable[[SimNet, Member], Callable[[OuterSync], None]]] | None = None,
    cfgs: Mapping[str, OuterSyncConfig] | None = None,
    shapes: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[dict[str, Member], SimNet, float]:
    """Run ``names`` syncing as ``plan`` says with ``faults`` playing beside them; the members, the network
    and the wall seconds it took. A name ``x<y`` joins through ``y``; others through the first name.
    ``ed25519``: records signed with it and journals in files under ``root``, as nodes do. ``cfg``: every
    member's sync configuration (``cfgs``: another for the members named); ``setups``: per member name, what
    sees each of its processes' syncs before their first round (a hostile member's code, say); ``shapes``:
    the model of the members named, as (inputs, outputs) of its linear layer (6, 4 unless named)."""
    loop = VirtualLoop()
    members: dict[str, Member] = {}
    for spec in names:
        name, _, via = spec.partition("<")
        via = via if via or spec == names[0] else names[0]
        members[name] = Member(name, _key(name), _key(via).peer_id if via and via != "-" else "")
        if ed25519:
            members[name].journal = None
    observers, setups, cfgs, shapes = observers or {}, setups or {}, cfgs or {}, shapes or {}
    t0 = time.perf_counter()

    async def main() -> SimNet:
        net = SimNet(loop)
        threads: list[threading.Thread] = []  # a restart adds one: joined() waits for it too
        for n, m in members.items():
            sim = net.add(m.peer)
            make, prepare = observers.get(n), setups.get(n)
            observe = make(net, m) if make is not None else None
            setup = prepare(net, m) if prepare is not None else None

            signatures = ED25519 if ed25519 else net.signatures

            def work(
                m: Member = m,
                sim: SyncNet = sim,
                observe: Any = observe,
                sig: Signatures = signatures,
                setup: Any = setup,
                own: OuterSyncConfig = cfgs.get(n, cfg),
                shape: tuple[int, int] = shapes.get(n, (6, 4)),
            ) -> None:
                _run_member(m, sim, net.clock, root, plan, observe, sig, own, setup, shape)

            def restart(m: Member = m, work: Callable[[], None] = work) -> None:
                net.revive(m.peer)
                m.restarts.append(Restart(net.loop.time(), len(m.reports), _journalled(m)))
                threads.append(start_thread(net, m.peer, work))

            m.restart = restart
            threads.append(start_thread(net, m.peer, work))
        if faults is not None:
            await faults(net, members)
        await joined(threads)
        return net

    try:
        with one_cpu():
            net = loop.run_until_complete(asyncio.wait_for(main(), 3600.0))
    finally:
        loop.close()
    return members, net, time.perf_counter() - t0


def _journalled(m: Member) -> tuple[int, ...]:
    """The revisions ``m``'s journal holds (what its next process reads)."""
    data = m.journal.data if m.journal is not None else None
    return tuple(json.loads(data)["voted"]) if data else ()


def _histories(members: list[Member]) -> dict[int, set[str]]:
    """Every state hash held at each revision, across ``members``."""
    out: dict[int, set[str]] = {}
    for m in members:
        for rev, h in m.states:
            out.setdefault(rev, set()).add(h)
    return out


@pytest.mark.parametrize("ed25519", [False, True], ids=["keyed-hash", "ed25519"])
def test_three_members_commit_rounds_with_bit_identical_states(tmp_path: Path, ed25519: bool) -> None:
    """Either way the records are signed and the votes journalled, the same rounds commit."""
    members, net, wall = simulate(tmp_path, ["a", "b", "c"], Plan(rounds=3), ed25519=ed25519)
    print(f"3 members, 3 rounds: {wall:.3f} s wall")
    journals = [m.journal for m in members.values()]
    if ed25519:  # nodes' defaults: nothing through the simulation's seams, a journal file per identity
        assert net.signatures.signed == 0 and all((tmp_path / f"{n}.key.votes.json").is_file() for n in "abc")
    else:  # the seams carried it all: no file, every vote journalled in memory
        assert net.signatures.signed > 0 and not list(tmp_path.glob("*.votes.json"))
        assert all(j is not None and j.writes >= 3 for j in journals), journals
    for m in members.values():
        print(m.name, [(r.revision, r.committed, r.group_size, r.cause, round(r.time - 1.7e9, 2)) for r in m.reports])
    for m in members.values():
        assert m.reports and all(r.committed and r.group_size == 3 for r in m.reports), m.reports
    assert min(m.states[-1][0] for m in members.values()) >= 2
    histories = _histories(list(members.values()))
    assert all(len(h) == 1 for h in histories.values()), histories  # one state per revision: bit-identical
    assert wall < WALL_S


@pytest.mark.parametrize("revision", [0, 1], ids=["first-round", "after-a-commit"])
def test_a_member_crashed_before_voting_costs_the_survivors_one_round_not_the_vote_deadline(
    tmp_path: Path, revision: int
) -> None:
    """c dies right after the all-reduce of the round at ``revision`` (its first, or the one after a commit
    of all three): a and b see no vote from it, ping it, vote abort and end the round at once (within
    seconds, far before the vote deadline 18.5 s into it); their next rounds commit as two, on one state."""

    def crash_c(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        def observe(point: RoundPoint, at: int) -> None:
            if point is RoundPoint.ALLREDUCED and at == revision:
                net.loop.call_soon_threadsafe(net.crash, m.peer)

        return observe

    cfg = replace(CFG, allreduce_timeout_s=15.0)  # the vote deadline: w + 1.5 + 15 + 2
    members, net, wall = simulate(tmp_path, ["a", "b", "c"], Plan(rounds=4), observers={"c": crash_c}, cfg=cfg)
    a, b, c = members["a"], members["b"], members["c"]
    print(f"crash before voting: {wall:.3f} s wall\n" + "\n".join(net.trace))
    assert len(c.reports) == revision  # crashed inside that round
    # one finds c gone and votes abort; the other ends on that vote, or on finding c gone itself
    causes = {m.reports[revision].cause for m in (a, b)}
    assert AbortCause.MEMBER_LOST in causes and causes <= {AbortCause.MEMBER_LOST, AbortCause.ABORTED_BY_MEMBER}
    for m in (a, b):
        before, failed, later = m.reports[:revision], m.reports[revision], m.reports[revision + 1 :]
        assert all(r.committed and r.group_size == 3 for r in before), before
        assert not failed.committed, failed
        assert failed.sync_s < cfg.commit_timeout_s + 5.0, failed.sync_s
        assert later and all(r.committed and r.group_size == 2 for r in later), later
    assert all(len(h) == 1 for h in _histories([a, b]).values())
    assert a.states[-1] == b.states[-1]
    assert wall < WALL_S


@pytest.mark.parametrize("revision", [0, 1], ids=["first-round", "after-a-commit"])
def test_a_member_crashed_mid_allreduce_fails_the_round_for_all_and_the_rest_go_on(
    tmp_path: Path, revision: int
) -> None:
    """c dies once its own slice of the round at ``revision`` is reduced (in the first round, or after a
    commit of all three): the all-reduce fails on a and b (nobody commits a round with a missing slice),
    each within the sync's time bound, and their next rounds commit as two; they end on one state."""

    def crash_c(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        def observe(point: RoundPoint, at: int) -> None:
            if point is RoundPoint.REDUCED and at == revision:
                net.crash(m.peer)  # the reduction runs on the loop: crash it there and then

        return observe

    members, net, wall = simulate(tmp_path, ["a", "b", "c"], Plan(rounds=4), observers={"c": crash_c})
    a, b = members["a"], members["b"]
    print(f"crash mid all-reduce: {wall:.3f} s wall\n" + "\n".join(net.trace))
    bound = CFG.max_sync_seconds(_model_size())
    for m in (a, b):
        before, failed, later = m.reports[:revision], m.reports[revision], m.reports[revision + 1 :]
        assert all(r.committed and r.group_size == 3 for r in before), before
        assert not failed.committed and failed.revision == revision, failed
        assert later and all(r.committed and r.group_size == 2 for r in later), later
        assert all(r.sync_s <= bound for r in m.reports), (bound, m.reports)
    assert all(len(h) == 1 for h in _histories([a, b]).values())
    assert a.states[-1] == b.states[-1]
    assert wall < WALL_S


def test_islands_of_a_partition_that_heals_merge_into_the_larger_history(tmp_path: Path) -> None:
    """{a, b, c} and {d, e} cannot reach each other for 20 virtual s: each island commits a history of its
    own. Once the partition heals, d and e merge into the larger one; from then on one history, and every
    member of it holds the same state at every revision it reaches."""
    names = ["a", "b", "c", "d<-", "e<d"]  # d founds the second island
    heal_at = 20.0

    async def split_then_heal(net: SimNet, members: dict[str, Member]) -> None:
        net.partition([members[n].peer for n in "abc"], [members[n].peer for n in "de"])
        await asyncio.sleep(heal_at)
        net.heal()

    members, net, wall = simulate(tmp_path, names, Plan(for_s=heal_at + 60.0, train_s=2.0), split_then_heal)
    print(f"partition healing: {wall:.3f} s wall\n" + "\n".join(net.trace))
    big, small = [members[n] for n in "abc"], [members[n] for n in "de"]
    origins_before = {m.reports[0].origin for m in big} | {m.reports[0].origin for m in small}
    assert all(m.reports[0].committed for m in big + small)
    assert len(origins_before) == 2  # two islands, two histories
    finals = {m.name: (m.reports[-1].origin, m.states[-1]) for m in big + small}
    assert len({o for o, _ in finals.values()}) == 1, finals  # one history at the end
    assert any(r.merged for m in small for r in m.reports), "d and e merged"
    assert not any(r.merged for m in big for r in m.reports)
    final_origin = next(iter(finals.values()))[0]
    same = [m for m in big + small]
    by_rev: dict[int, set[str]] = {}
    for m in same:
        for r in m.reports:
            if r.origin == final_origin:
                by_rev.setdefault(r.revision, set()).add(r.state_hash)
    assert all(len(h) == 1 for h in by_rev.values()), by_rev
    assert wall < 5 * WALL_S  # 5 members, 80 virtual s


def test_a_member_alone_finds_no_partner(tmp_path: Path) -> None:
    members, _, _ = simulate(tmp_path, ["solo"], Plan(for_s=3.0))
    assert all(not r.committed for r in members["solo"].reports)


@pytest.mark.parametrize("at", [RoundPoint.MATCHMADE, RoundPoint.SENT], ids=["matchmade", "parts-sent"])
def test_a_member_frozen_mid_round_is_left_behind_and_catches_up_after_it_resumes(
    tmp_path: Path, at: RoundPoint
) -> None:
    """c stops (SIGSTOP-like) in its second round, once its group is decided or once it sent a part, for 10
    virtual s: a and b give that round up (nobody commits a round c may not apply) within the sync's time
    bound and commit on as two; c resumes behind, catches up to a state their group committed and syncs
    with them again, on their history, ending on their newest state."""

    def freeze_c(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        frozen: list[bool] = []

        def observe(point: RoundPoint, revision: int) -> None:
            if point is at and revision == 1 and not frozen:  # a part is sent per slice: the first one
                frozen.append(True)
                net.loop.call_soon_threadsafe(net.freeze, m.peer)
                net.loop.call_soon_threadsafe(net.loop.call_later, 10.0, net.thaw, m.peer)

        return observe

    plan = Plan(for_s=40.0, period_s=3.0)
    members, net, wall = simulate(tmp_path, ["a", "b", "c"], plan, observers={"c": freeze_c})
    a, b, c = members["a"], members["b"], members["c"]
    print(f"freeze mid round: {wall:.3f} s wall\n" + "\n".join(net.trace))
    frozen_round = next(r for r in a.reports if not r.committed)  # a report names the revision it ended at
    assert frozen_round.revision == 1 and frozen_round.group_size == 3, a.reports
    assert any(r.committed and r.group_size == 2 for r in a.reports), a.reports
    bound = CFG.max_sync_seconds(_model_size())
    assert all(r.sync_s <= bound for m in (a, b) for r in m.reports), bound
    caught = next((r for r in c.reports if r.caught_up), None)
    assert caught is not None, c.reports
    assert caught.state_hash in _histories([a, b]).get(caught.revision, set()), caught  # a state they committed
    assert c.reports[-1].committed and c.reports[-1].group_size == 3, c.reports
    assert c.states[-1] == a.states[-1] == b.states[-1]  # c ends at the survivors' newest state
    assert all(len(h) == 1 for h in _histories([a, b, c]).values())  # never a second state at one revision
    assert wall < 2 * WALL_S


def test_the_simulations_signatures_refuse_what_ed25519_refuses() -> None:
    """The keyed hash stands in for Ed25519 only if it keeps the rule: a record opens under the peer that
    signed it, and a forged signer, a changed body or a signature of the other scheme does not."""
    keyed, a, b = KeyedHash(), _key("a"), _key("b")
    record = StateRecord(a.peer_id, "0" * 16, 1, "1" * 64, EPOCH)
    sealed = seal_record(STATE_KIND, record, a, keyed)
    assert open_record(sealed, STATE_KIND, StateRecord.from_wire, keyed) == record
    env = codec.unpack(sealed, MAX_RECORD_BYTES)
    changed = codec.pack({**env, "body": codec.pack(replace(record, revision=2).to_wire())})
    refused = {
        "another signer": seal(STATE_KIND, record, b, keyed),  # b names a (seal_record itself refuses that)
        "a changed body": changed,
        "an Ed25519 signature": seal_record(STATE_KIND, record, a),
    }
    for what, data in refused.items():
        with pytest.raises(MessageRejected):
            open_record(data, STATE_KIND, StateRecord.from_wire, keyed)
            pytest.fail(f"{what} opened")
    with pytest.raises(MessageRejected):
        open_record(sealed, STATE_KIND, StateRecord.from_wire, ED25519)  # and the other way round


def test_a_member_restarted_after_its_vote_resumes_from_its_checkpoint_and_journal(tmp_path: Path) -> None:
    """c is killed right after it voted for revision 2 (before it learned the outcome); its process starts
    again 4 virtual s later from its last checkpoint (revision 1) and its journal (which holds that vote). It
    catches up to the state its partners committed at 2 meanwhile, never making one of its own, and commits
    with them again."""

    def kill_c_after_its_vote(net: SimNet, m: Member) -> Callable[[RoundPoint, int], None]:
        def observe(point: RoundPoint, revision: int) -> None:
            if point is RoundPoint.VOTED and revision == 1 and not m.restarts:
                assert m.restart is not None
                net.loop.call_soon_threadsafe(net.crash, m.peer)
                net.loop.call_soon_threadsafe(net.loop.call_later, 4.0, m.restart)

        return observe

    plan = Plan(for_s=30.0, period_s=3.0)
    members, net, wall = simulate(tmp_path, ["a", "b", "c"], plan, observers={"c": kill_c_after_its_vote})
    a, b, c = members["a"], members["b"], members["c"]
    print(f"restart after a vote: {wall:.3f} s wall\n" + "\n".join(net.trace))
    assert len(c.restarts) == 1 and c.restarts[0].journalled[-1] == 2, c.restarts  # its new process reads the vote
    before, after = c.reports[: c.restarts[0].reports], c.reports[c.restarts[0].reports :]
    assert before[-1].revision == 1 and all(r.committed for r in before), before  # killed inside round 2
    assert any(r.committed and r.revision == 2 for r in a.reports), a.reports  # a and b did commit 2 meanwhile
    assert any(r.caught_up for r in after) and after[-1].committed and after[-1].group_size == 3, after
    assert all(len(h) == 1 for h in _histories([a, b, c]).values())  # never a second state at one revision
    assert wall < 2 * WALL_S


def test_a_lagging_replica_takes_stores_late_and_out_of_order_but_never_back_to_an_older_value() -> None:
    """What the campaign's replica-lag fault does to one replica: a's stores reach b's replica up to a second
    late, each after its own delay (so not in the order stored), while a's own replica has them at once; of
    two stores of one subkey, the later-expiring one stays, whichever lands last."""
    loop = VirtualLoop()
    subkeys = [f"s{i}" for i in range(8)]

    async def main() -> list[str]:
        net = SimNet(loop, seed=1)
        net.add("a")
        net.add("b")
        net.set_replica_lag("b", 1.0)
        for sk in subkeys:
            net.put("a", "k", sk, b"old", 60.0)
        await asyncio.sleep(0.05)
        for sk in subkeys:  # each lands after its own delay too: some before the old value of its subkey
            net.put("a", "k", sk, b"new", 60.0)
        assert set(net.read("a", "k")) == set(subkeys) and net.read("b", "k") == {}
        landed: list[str] = []
        while len(landed) < len(subkeys):
            await asyncio.sleep(0.01)
            landed += [sk for sk in net.read("b", "k") if sk not in landed]
        await asyncio.sleep(1.0)
        assert all(v == b"new" for v in net.read("b", "k").values()), net.read("b", "k")
        return landed

    try:
        landed = loop.run_until_complete(main())
    finally:
        loop.close()
    assert sorted(landed) == subkeys and landed != subkeys, landed  # all of them, not in the order stored
