"""Histories that meet: every state names its history (its *origin*), and the smaller of two histories merges.

Two parts of a swarm that cannot reach each other (a partition, two founders
started apart, a bootstrap peer frozen before its joiners met) each grow a
history of their own. Catch-up cannot join them: it follows trusted peers only
(partners of committed rounds, ``--peer``s), and the members of two such
islands never synced together. So each state carries the name of its history:

- the **origin** of a state is the hash of the first state committed in its
  history (``""`` at revision 0: nothing committed yet); every later commit
  keeps it (:func:`next_origin`). It is hashed into the state hash, so a donor
  cannot serve a state under another history's name, and two islands grown
  from one revision-0 state still have two origins.
- once the records show live peers of another origin, every peer ranks the
  histories the same way (:func:`decide_merge`): most live peers, then the
  smaller origin. The peers of a losing history **merge**: each downloads the
  winner's newest state and takes it as its anchor while keeping its own
  weights, so everything its island trained since the fork enters the
  winner's next average as its pseudo-gradient (:meth:`swarm.sync.job.SyncJob.rebased`).
  No work is lost, and no weights are overwritten by a stranger's. The
  winner's peers that answered the check become the merged peer's partners
  (trusted for catch-up and the superseded check): a merged peer that
  trusted none of them would extend a state they had already extended.
- catch-up, the superseded check and the orphan check look only at states of
  this peer's own origin: across histories only a merge moves a peer, so a
  merged peer is not pulled back by partners that have not merged yet.
- revision numbers: the skip past every reported revision (``CatchUpper.skip``)
  counts every history's records, so two histories never reuse a number once
  they have met.

What a peer with many keys can do. Only live peers count (each answers a ping
through its own libp2p host), so to pull an island into a made-up history an
attacker must run more live hosts than the island has members. Even then the
island keeps its weights; its new anchor must pass catch-up's plausibility
check (finite, within ``max_state_shift`` of its own anchor); and a peer
merges at most once per :data:`MERGE_COOLDOWN_S`, so one pull is all such a
history gets for minutes; its hosts become the merged peer's partners, which
costs the island no more than the attacker's majority in its groups does already.
Peers that never committed (origin ``""``) neither
count nor merge: a stranger's claim must not move a swarm's founder (see
``CatchUpper._alone_behind``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from swarm.sync.decide import CatchUp
from swarm.sync.records import StateRecord

MERGE_CHECK_S = 10.0
"""Seconds between two merge checks (each pings up to :data:`MAX_PINGED` peers): records naming other
origins cost a peer at most one ping round this often, however many there are."""

MERGE_COOLDOWN_S = 300.0
"""Seconds after a merge during which this peer merges no more: a made-up history wins a pull at most
this often, and a peer whose view of a merge differed from its island's is not bounced between two."""

MAX_PINGED = 64
"""Peers pinged per merge check, the freshest records first: half of this peer's own history, half others'."""


def next_origin(parent_origin: str, anchor_hash: str) -> str:
    """The origin of a state committed on a parent of ``parent_origin`` whose anchor and momentum hash to
    ``anchor_hash`` (:func:`swarm.sync.tensors.state_hash` without an origin): the parent's, or, for the
    first commit of a history, that state itself.

    >>> next_origin("", "ab" * 32) == "ab" * 32, next_origin("cd" * 32, "ab" * 32) == "cd" * 32
    (True, True)
    """
    return parent_origin or anchor_hash


def to_ping(states: Mapping[str, StateRecord], me: str, my_origin: str) -> list[str]:
    """The peers a merge check pings: those of this peer's history and those of others, freshest first.

    >>> r = lambda p, o, t: StateRecord(p, "0" * 16, 3, "a" * 64, t, o)
    >>> to_ping({"b": r("b", "1" * 64, 1.0), "c": r("c", "2" * 64, 2.0), "d": r("d", "", 3.0)}, "a", "1" * 64)
    ['b', 'c']
    """
    fresh = sorted((r for p, r in states.items() if p != me and r.origin), key=lambda r: (-r.created, r.peer))
    half = MAX_PINGED // 2
    mine = [r.peer for r in fresh if r.origin == my_origin][:half]
    others = [r.peer for r in fresh if r.origin != my_origin][: MAX_PINGED - len(mine)]
    return mine + others


def live_histories(
    states: Mapping[str, StateRecord], me: str, my_origin: str, alive: Collection[str]
) -> dict[str, list[str]]:
    """Origin -> the live peers reporting a state of it (this peer counted in its own)."""
    out: dict[str, list[str]] = {my_origin: [me]} if my_origin else {}
    for peer, r in sorted(states.items()):
        if peer != me and r.origin and peer in alive:
            out.setdefault(r.origin, []).append(peer)
    return out


def decide_merge(
    states: Mapping[str, StateRecord],
    me: str,
    my_origin: str,
    alive: Collection[str],
    ignored: Collection[tuple[int, str]] = (),
) -> CatchUp | None:
    """The state to merge into, or None while this peer's history wins (or it has none yet).

    The winning history has the most live peers, then the smaller origin: every
    peer that sees the same live records picks the same one. Its state to move
    to is the one most of its live peers report, then the newest; donors are
    those peers. A state in ``ignored`` (refused or never served) is passed over.

    >>> r = lambda p, o, rev: StateRecord(p, "0" * 16, rev, o[0] * 64, 1.0, o)
    >>> a, b = "a" * 64, "b" * 64
    >>> states = {"x": r("x", b, 7), "y": r("y", b, 7), "z": r("z", a, 5)}
    >>> decide_merge(states, "me", a, alive={"x", "y", "z"}) is None  # x and y against me and z: a's smaller
    True
    >>> got = decide_merge(states, "z", a, alive={"x", "y"})  # z alone against x and y
    >>> (got.revision, got.donors)
    (7, ('x', 'y'))
    """
    if not my_origin:
        return None
    histories = live_histories(states, me, my_origin, alive)
    winner = min(histories, key=lambda o: (-len(histories[o]), o))
    if winner == my_origin:
        return None
    counts: dict[tuple[int, str], list[str]] = {}
    for peer in histories[winner]:
        r = states[peer]
        if (r.revision, r.state_hash) not in ignored:
            counts.setdefault((r.revision, r.state_hash), []).append(peer)
    if not counts:
        return None
    target = min(counts, key=lambda s: (-len(counts[s]), -s[0], s[1]))
    return CatchUp(target[0], target[1], tuple(counts[target]))
