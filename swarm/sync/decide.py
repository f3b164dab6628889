"""Pure decisions of outer sync: who forms a group, whether a round commits, whom to catch up from.

Every function takes its inputs (records already verified, the current time,
the config) as arguments and does no I/O, so each rule is unit-tested
without a network.

Gather window. A peer that wants to sync reads the join key of its
(fingerprint, revision, state hash). If some window opened at ``w`` is still
open to joiners (``now < w + JOIN_FRACTION * M``, M = matchmaking_timeout_s)
it joins the earliest such window, otherwise it opens its own at ``now``.
While gathering it keeps switching to the earliest open window it sees. At
``w + M`` every member reads the key once more; the group is every peer whose
record names window ``w``, sorted by peer id. The last ``(1 - JOIN_FRACTION) * M``
of the window lets the last joins propagate; a member that still sees a
different set computes a different group id and is refused by the others.

Early close. A member that sees every peer it expects (:func:`expected_members`)
joined its window marks its record closed (:func:`should_close`); once every
record naming the window is closed (*sealed*, :func:`window_sealed`) the
group is decided at once, before ``w + M``. A sealed window takes no more
joiners. One open record (a late joiner, a key that never closes) only
keeps the window running to its normal end; a closed record alone never
turns anyone away. Members that decide on different views compute different
group ids: the round aborts, as at the normal end, and no two overlapping
groups commit.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from swarm.configs import MAX_WINDOW_FACTOR
from swarm.sync.config import OuterSyncConfig
from swarm.sync.records import ABORT_DIGEST, JoinRecord, StateRecord

JOIN_FRACTION = 0.75
"""Share of the gather window during which peers may still join it."""

LATE_FACTOR = 3.0
"""A window opened by a peer lasts this x the median of its recent all-reduces' seconds, when that is longer
than the configured window. A member of a competing group at the same parent learns at its vote that
another group committed first; it then downloads the state (about an all-reduce's bytes, over the same
links) before it can join the next window, and must still find it open (``JOIN_FRACTION`` of it). Votes
take about as long on loopback as at 100 ms round trips (2.0 and 2.3 s, bench/RESULTS.md "WAN"), the
all-reduce does not (0.45 and 5.5 s)."""


def window_for(base_s: float, allreduce_s: Sequence[float]) -> float:
    """The length a peer asks for when it opens a window: ``LATE_FACTOR`` x the median of its recent
    all-reduces' seconds, at least ``base_s`` and at most ``MAX_WINDOW_FACTOR`` x it.

    >>> window_for(5.0, []), window_for(5.0, [0.45, 1.2]), window_for(5.0, [2.9, 3.0, 3.1])
    (5.0, 5.0, 9.0)
    >>> window_for(5.0, [5.5, 60.0])
    15.0
    """
    if not allreduce_s:
        return base_s
    median = sorted(allreduce_s)[len(allreduce_s) // 2]
    return round(min(max(base_s, LATE_FACTOR * median), MAX_WINDOW_FACTOR * base_s), 3)


def window_length(records: Mapping[str, JoinRecord], window: float, base_s: float) -> float:
    """How long window ``window`` lasts: the shortest length its records ask for, clamped to
    [``base_s``, ``MAX_WINDOW_FACTOR`` x ``base_s``].

    Honest joiners copy the length of the window they join, so its members agree; a record asking for
    less only brings the configured window back, one asking for more costs at most the clamp.

    >>> r = JoinRecord("p", "0" * 16, 0, "0" * 64, 10.0, 10.0, window_s=9.0)
    >>> window_length({"p": r}, 10.0, 5.0), window_length({"p": r}, 10.0, 2.0), window_length({}, 10.0, 5.0)
    (9.0, 6.0, 5.0)
    """
    asked = [r.window_s for r in records.values() if r.window_start == window]
    return min(max(min(asked, default=base_s), base_s), MAX_WINDOW_FACTOR * base_s)


def earliest_open_window(records: Mapping[str, JoinRecord], now: float, window_s: float) -> float | None:
    """The start of the earliest window still open to joiners, or None if none is (``window_s``: the
    configured window; each window's own length is :func:`window_length`).

    A sealed window (every record of it closed) is not open: its members may
    have decided their group already.

    >>> r = JoinRecord("p", "0" * 16, 0, "0" * 64, 10.0, 10.0)
    >>> earliest_open_window({"p": r}, now=12.0, window_s=4.0), earliest_open_window({"p": r}, 13.5, 4.0)
    (10.0, None)
    """
    starts = {r.window_start for r in records.values() if r.window_start <= now}
    open_ = [
        w
        for w in starts
        if now < w + JOIN_FRACTION * window_length(records, w, window_s) and not window_sealed(records, w)
    ]
    return min(open_) if open_ else None


def running_window(
    records: Mapping[str, JoinRecord], now: float, base_s: float, me: str, trusted: Collection[str], min_size: int
) -> float | None:
    """The start of a window at this key whose group is under way without ``me``, or None.

    Such a window is closed to joiners (sealed, or past ``JOIN_FRACTION`` of its length), names at least
    ``min_size`` members, one of them a peer ``me`` trusts (a partner of its history: a minted key's window
    counts for nothing), not ``me``, and is younger than twice its length. Its group will most likely commit
    the next revision from this parent first; a group ``me`` opened now would then be superseded at its
    vote, and at 100 ms round trips one that lost once lost every round after (it caught up only after the
    winners' next window had closed). So ``me`` waits for that commit and catches up instead.

    >>> r = {p: JoinRecord(p, "0" * 16, 0, "0" * 64, 10.0, 10.0) for p in "ab"}
    >>> running_window(r, 13.9, 4.0, "c", {"a"}, 2), running_window(r, 12.0, 4.0, "c", {"a"}, 2)
    (10.0, None)
    >>> running_window(r, 13.9, 4.0, "c", set(), 2), running_window(r, 18.0, 4.0, "c", {"a"}, 2)
    (None, None)
    """
    for w in sorted({r.window_start for r in records.values()}):
        members = {p for p, r in records.items() if r.window_start == w}
        length = window_length(records, w, base_s)
        closed = window_sealed(records, w) or now >= w + JOIN_FRACTION * length
        young = now < w + 2 * length
        if closed and young and me not in members and len(members) >= min_size and members & set(trusted):
            return w
    return None


def window_sealed(records: Mapping[str, JoinRecord], window: float) -> bool:
    """Whether some record names ``window`` and every record naming it is closed.

    One open record keeps the window unsealed, so a key that joins and never
    closes only cancels the early close; a closed record cannot seal a window
    that an open member is in.
    """
    named = [r for r in records.values() if r.window_start == window]
    return bool(named) and all(r.closed for r in named)


def expected_members(last_round: Collection[str], me: str, nearby: Collection[str] = ()) -> frozenset[str]:
    """Whom this peer expects in its window: last round's joiners of its key, and ``nearby`` peers.

    ``nearby``: peers whose state record moved to this peer's state, or to the
    one it left last, since its last matchmaking (``SyncRecords._nearby``).
    They want to sync with this history: the last group's members moved on
    with this peer, and a peer left out (a slower one that arrived after the
    window was sealed: it was never in the sealed view, so not among last
    round's joiners) or one that just caught up comes next. Expecting them keeps the window
    open for them, or a slow peer would be sealed out every round. One that is
    expected and never joins (gone, or a key that only published a record) only
    keeps the window running to its normal end. Empty (no early close) on a
    first round with no one nearby.

    >>> sorted(expected_members(["me", "a"], "me", ["me", "slow"]))
    ['a', 'slow']
    """
    return frozenset(p for p in (*last_round, *nearby) if p != me)


def should_close(join_records: Mapping[str, JoinRecord], me: str, expected: Collection[str]) -> bool:
    """Whether ``me`` marks its record closed: every expected peer joined ``me``'s window (and some is expected).

    >>> r = {p: JoinRecord(p, "0" * 16, 0, "0" * 64, 10.0, 10.0) for p in "ab"}
    >>> should_close(r, "a", {"b"}), should_close(r, "a", {"b", "c"}), should_close(r, "a", ())
    (True, False, False)
    """
    mine = join_records.get(me)
    if mine is None or mine.closed or not expected:
        return False
    joined = {p for p, r in join_records.items() if r.window_start == mine.window_start}
    return set(expected) <= joined


def group_id(
    fingerprint: str, revision: int, state_hash: str, window_start: float, members: Sequence[str], skip: int = 0
) -> str:
    """32 hex chars naming one group of one round; every message of the round carries it.

    ``skip`` is in it, so members that would commit at different revisions never form one group.
    """
    text = f"{fingerprint}|{revision}|{state_hash}|{window_start!r}|{','.join(members)}|{skip}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class GroupDecision:
    """``status`` is "gather" (window still open), "ready", "no partner", "not in group" or "yielded" (another
    group at this parent is under way: :func:`running_window`)."""

    status: str
    window_start: float
    members: tuple[str, ...] = ()
    group_id: str = ""
    skip: int = 0
    """The commit takes revision ``revision + 1 + skip``: the largest skip among the members' records."""
    window_s: float = 0.0
    """The window's length (:func:`window_length`): the all-reduce's deadline counts from its end."""


def decide_group(join_records: Mapping[str, JoinRecord], now: float, cfg: OuterSyncConfig, me: str) -> GroupDecision:
    """Decide this peer's group from the (verified) join records of its key.

    The window is the one ``me``'s own record names; before it closes
    (at ``w + M``, or earlier once :func:`window_sealed`) the answer is
    "gather". Members are the peers whose records name the same window,
    sorted; at most ``max_group_size`` (lowest ids first) are taken. The
    members and group id do not depend on when the window closed.
    """
    mine = join_records.get(me)
    if mine is None:
        return GroupDecision("no partner", now)
    w = mine.window_start
    length = window_length(join_records, w, cfg.matchmaking_timeout_s)
    if now < w + length and not window_sealed(join_records, w):
        return GroupDecision("gather", w, window_s=length)
    members = tuple(sorted(p for p, r in join_records.items() if r.window_start == w))
    members = members[: cfg.max_group_size]
    if me not in members:
        return GroupDecision("not in group", w)
    if len(members) < cfg.min_group_size:
        return GroupDecision("no partner", w, members)
    skip = max(join_records[p].skip for p in members)
    gid = group_id(mine.fingerprint, mine.revision, mine.state_hash, w, members, skip)
    return GroupDecision("ready", w, members, gid, skip, length)


def live_records(join_records: Mapping[str, JoinRecord], answered: Collection[str], me: str) -> dict[str, JoinRecord]:
    """The join records whose signer answered a ping this round (``me``'s own is always kept).

    Applied before :func:`decide_group`, so keys that never come online
    neither join a group nor fill its lowest-ids-first ``max_group_size``.

    >>> r = JoinRecord("p", "0" * 16, 0, "0" * 64, 10.0, 10.0)
    >>> sorted(live_records({"me": r, "a": r, "ghost": r}, {"a"}, "me"))
    ['a', 'me']
    """
    return {p: r for p, r in join_records.items() if p == me or p in answered}


def missing_votes(digests_by_peer: Mapping[str, str], members: Sequence[str], me: str) -> tuple[str, ...]:
    """The other members whose vote this member has not seen yet (whom to probe while waiting).

    >>> missing_votes({"a": "x" * 64}, ["a", "b", "c"], "a")
    ('b', 'c')
    """
    return tuple(p for p in members if p != me and p not in digests_by_peer)


class CommitDecision(NamedTuple):
    """``commit`` is True (apply), False (discard) or None (not decided yet: keep polling).

    ``vetoers``: the members whose abort vote alone ended the round (see :mod:`swarm.sync.vetoes`).
    """

    commit: bool | None
    reason: str
    vetoers: tuple[str, ...] = ()


def decide_commit(
    digests_by_peer: Mapping[str, str], members: Sequence[str], now: float, deadline: float
) -> CommitDecision:
    """Apply only if every member voted the same digest, seen by a read that began by ``deadline``.

    ``now`` is when the read that returned ``digests_by_peer`` *started*. Any
    "abort" vote or two different digests end the round at once. Every member
    does its last read at the same ``deadline``, so a vote visible to one
    member's committing read is visible to every other member's last read.

    >>> decide_commit({"a": "x" * 64, "b": "x" * 64}, ["a", "b"], now=1.0, deadline=2.0)
    CommitDecision(commit=True, reason='committed', vetoers=())
    >>> decide_commit({"a": "x" * 64}, ["a", "b"], now=2.5, deadline=2.0)
    CommitDecision(commit=False, reason='commit timeout', vetoers=())
    """
    votes = {p: d for p, d in digests_by_peer.items() if p in members}
    if ABORT_DIGEST in votes.values():
        return CommitDecision(False, "aborted by a member")
    if len(set(votes.values())) > 1:
        return CommitDecision(False, "digest mismatch")
    if now > deadline:
        return CommitDecision(False, "commit timeout")
    if len(votes) == len(set(members)):
        return CommitDecision(True, "committed")
    return CommitDecision(None, "pending")


class CatchUpRefusal(enum.Enum):
    """Why a reported or downloaded state was not adopted; the value is the logged text."""

    UNVOUCHED = "claimed by no trusted peer"
    OUTVOTED = "trusted peers hold another state"
    OFF_TARGET = "donor served another state"
    NOT_FINITE = "state not finite"
    TOO_FAR = "state too far from own anchor"
    CONTESTED_STEP = "contested next state moved more than this peer's own steps allow"
    OUT_OF_REACH = "a state ahead on one trusted word moved on further than one word may reach"


@dataclass(frozen=True)
class CatchUp:
    """Download the state at (revision, state_hash) from one of ``donors`` (freshest first)."""

    revision: int
    state_hash: str
    donors: tuple[str, ...]
    contested: bool = False
    """Followed though as many trusted peers still report this peer's own state: only one revision ahead,
    and adopted only if it moved the anchor by no more than this peer's own recent outer steps allow."""
    lone: bool = False
    """Ahead on the word of one trusted peer alone (nobody else trusted reports any later state): bounded
    like a contested target, by this peer's own recent outer steps, since one member's word is a claim."""


class CatchUpDecision(NamedTuple):
    """``target`` to download (or None), and every other peer's claim that was not followed, by peer."""

    target: CatchUp | None
    refused: dict[str, CatchUpRefusal]


MAX_CONTESTED_AHEAD = 8
"""Most revisions ahead a state may be to be followed on fewer trusted vouchers than trusted peers at this
peer's own state (each still bounded by this peer's own outer steps: :func:`check_contested_step`)."""


def _beats(state: tuple[int, str], vouchers: int, mine: tuple[int, str], stay: int) -> bool:
    """Whether ``vouchers`` trusted peers at ``state`` outweigh the ``stay`` trusted peers at ``mine``."""
    if state[0] > mine[0]:
        return vouchers > stay or _contested(state, vouchers, mine)
    # same revision, another hash: this peer's own state counts too; ties go to the smaller hash
    return vouchers > stay + 1 or (vouchers == stay + 1 and state[1] < mine[1])


def _contested(state: tuple[int, str], vouchers: int, mine: tuple[int, str]) -> bool:
    """A trusted peer reports a state a few revisions ahead while others still report this peer's state.

    A peer at ``mine`` says only that it has not seen the later commits yet, not
    that none happened: trusted peers that merely lag must not keep this peer
    on a state another group already moved on from, or two groups extend it
    and the history forks (a restarted node a few revisions behind is the usual
    case). A few revisions only
    (:data:`MAX_CONTESTED_AHEAD`): a liar's claim of a far revision still needs
    a majority.
    """
    return 0 < state[0] - mine[0] <= MAX_CONTESTED_AHEAD and vouchers >= 1


def decide_catch_up(
    state_records: Mapping[str, StateRecord],
    my_revision: int,
    my_hash: str,
    me: str,
    trusted: Collection[str],
    leaders: Collection[str] = (),
    ignored: Collection[tuple[int, str]] = (),
    stay_alive: Collection[str] | None = None,
    own_claim: tuple[int, str] | None = None,
) -> CatchUpDecision:
    """Whether this peer must download another state before its next sync, and which.

    Only ``trusted`` peers (partners of a committed round, ``--peer``s: SECURITY.md, "Outer sync")
    vouch (:func:`count_vouchers`), so keys minted to claim states move nothing. Which vouched
    states may be followed against the trusted peers staying at this peer's state (only those in
    ``stay_alive``, if given: a dead partner's record says nothing) is :func:`followable_states`.
    The most vouched wins, then the *lowest* revision: a peer never jumps further than its trusted
    peers agree. The target is ``contested`` when vouchers ahead do not outnumber those staying: its
    shift is then bounded by this peer's own recent steps (:func:`check_contested_step`), and so is a
    ``lone`` target's, ahead on one trusted word alone.

    ``leaders``' states at this revision are followed while nobody trusted stays: a newcomer joins the
    swarm it was pointed at (two nodes started apart would never agree on a revision 0 otherwise).
    ``own_claim``, a later state this peer signed before restarting from an older checkpoint, is
    followed as its own: syncing from an earlier state would fork its own history. States in
    ``ignored`` (unserved or refused targets) are passed over. Donors are every other peer
    reporting the target; the bytes are checked against the hash anyway.
    """
    others = {p: r for p, r in state_records.items() if p != me and (r.revision, r.state_hash) not in ignored}
    mine = (my_revision, my_hash)
    staying = staying_peers(others, my_revision, my_hash, trusted)
    stay = len(staying if stay_alive is None else [p for p in staying if p in stay_alive])
    claim = own_claim if own_claim is not None and own_claim[0] > my_revision and own_claim not in ignored else None
    vouchers = count_vouchers(others, mine, trusted, claim)
    led = {(r.revision, r.state_hash) for p, r in others.items() if p in leaders and r.revision == my_revision}
    followable = followable_states(vouchers, mine, stay, led, claim)
    best = min(followable, key=lambda s: (-vouchers[s], s), default=None)
    refused = {
        p: CatchUpRefusal.OUTVOTED if p in trusted else CatchUpRefusal.UNVOUCHED
        for p, r in others.items()
        if r.revision >= my_revision and (r.revision, r.state_hash) not in (mine, best)
    }
    if best is None:
        return CatchUpDecision(None, refused)
    donors = sorted(
        (p for p, r in others.items() if (r.revision, r.state_hash) == best), key=lambda p: (-others[p].created, p)
    )
    ahead = _ahead(vouchers, mine)
    contested, lone = ahead <= stay and best[0] > my_revision, ahead < 2 and best[0] > my_revision
    return CatchUpDecision(CatchUp(best[0], best[1], tuple(donors), contested, lone), refused)


State = tuple[int, str]
"""(revision, state hash)."""


def count_vouchers(
    others: Mapping[str, StateRecord], mine: State, trusted: Collection[str], own_claim: State | None = None
) -> dict[State, int]:
    """Trusted peers reporting each state other than ``mine`` at its revision or later, plus this peer's own claim.

    >>> r = lambda p, rev, h: StateRecord(p, "0" * 16, rev, h * 64, 1.0)
    >>> v = count_vouchers({"b": r("b", 4, "a"), "c": r("c", 4, "a"), "x": r("x", 9, "b")}, (3, "c" * 64), {"b", "c"})
    >>> [(rev, n) for (rev, _), n in v.items()]
    [(4, 2)]
    """
    vouchers: dict[State, int] = {}
    for p, r in others.items():
        state = (r.revision, r.state_hash)
        if p in trusted and state != mine and r.revision >= mine[0]:
            vouchers[state] = vouchers.get(state, 0) + 1
    if own_claim is not None:
        vouchers[own_claim] = vouchers.get(own_claim, 0) + 1
    return vouchers


def _ahead(vouchers: Mapping[State, int], mine: State) -> int:
    """Trusted vouchers for any state ahead of ``mine``: they agree this peer is behind, whichever revision."""
    return sum(n for s, n in vouchers.items() if s[0] > mine[0])


def followable_states(
    vouchers: Mapping[State, int], mine: State, stay: int, led: Collection[State] = (), own_claim: State | None = None
) -> list[State]:
    """The vouched states this peer may move to, against ``stay`` trusted peers at its own state.

    A state wins on its own vouchers (:func:`_beats`); a leader's state at this
    peer's revision wins while nobody trusted stays; any state ahead wins when
    all trusted vouchers ahead together outnumber those staying (a fast group's
    records name different revisions); this peer's own earlier claim always.

    >>> a, b = (4, "a" * 64), (5, "b" * 64)
    >>> [r for r, _ in followable_states({a: 1, b: 1}, (3, "c" * 64), stay=1)]  # together, two ahead outvote one
    [4, 5]
    >>> followable_states({(30, "a" * 64): 1}, (3, "c" * 64), stay=2)  # one far claim against two staying
    []
    """
    ahead = _ahead(vouchers, mine)
    out = [
        s
        for s, n in vouchers.items()
        if _beats(s, n, mine, stay) or (s in led and stay == 0) or (s[0] > mine[0] and ahead > stay)
    ]
    return out + ([own_claim] if own_claim is not None and own_claim in vouchers and own_claim not in out else [])


def staying_peers(
    state_records: Mapping[str, StateRecord], my_revision: int, my_hash: str, trusted: Collection[str]
) -> list[str]:
    """The trusted peers whose records report exactly this peer's state (whom a catch-up may ping).

    >>> staying_peers({"b": StateRecord("b", "0" * 16, 3, "a" * 64, 1.0)}, 3, "a" * 64, {"b"})
    ['b']
    """
    mine = (my_revision, my_hash)
    return sorted(p for p, r in state_records.items() if p in trusted and (r.revision, r.state_hash) == mine)


def peers_named_in(multiaddrs: Iterable[str]) -> frozenset[str]:
    """The peer ids (``/p2p/<id>``) of the multiaddrs an operator told this node to join through.

    >>> sorted(peers_named_in(["/ip4/1.2.3.4/tcp/5/p2p/12D3KooWA", "/ip4/1.2.3.4/tcp/6"]))
    ['12D3KooWA']
    """
    out: set[str] = set()
    for addr in multiaddrs:
        parts = addr.split("/")
        for i, part in enumerate(parts[:-1]):
            if part == "p2p" and parts[i + 1]:
                out.add(parts[i + 1])
    return frozenset(out)


MIN_PACE_S = 0.05
"""Shortest interval between two of its own commits a peer takes as its pace (rounds are never faster)."""


def plausible_ahead(claimed: int, step_times: Sequence[float], now: float) -> int:
    """Outer steps a catch-up's distance bound allows for: the claimed revision gap, but never more than
    this peer's own evidence allows, however far a peer claims to be.

    Revision numbers are a peer's claim (one signed record names any revision, and skips move them by up
    to MAX_SKIP per commit), so they alone must not scale a bound: a trusted liar claiming revision
    +1,000,000 would get a bound a million steps wide. What this peer knows itself is when it last
    committed and how fast its own rounds went: since its last commit its group can have taken at most
    one step per its fastest recent interval, plus one. With fewer than two of its own commits it has no
    pace: one step. A node restarted from an old checkpoint has a last commit long ago, so it may still
    rejoin a group that trained on without it (``step_times`` are wall-clock times, kept in checkpoints).

    >>> plausible_ahead(1_000_000, [100.0, 101.0, 103.0], now=104.5)  # 1.5 s since its last: two 1 s rounds
    2
    >>> plausible_ahead(40, [100.0, 101.0], now=1900.0), plausible_ahead(40, [], now=1900.0)
    (40, 1)
    """
    times = sorted(t for t in step_times if math.isfinite(t))
    intervals = [b - a for a, b in itertools.pairwise(times)]
    if not intervals or claimed <= 1:
        return 1
    pace = max(min(intervals), MIN_PACE_S)
    cap = 1 + int(max(0.0, now - times[-1]) / pace)
    return max(1, min(claimed, cap))


def check_contested_step(
    shift_norm: float, own_steps: Sequence[float], factor: float, ahead: int = 1
) -> CatchUpRefusal | None:
    """Whether a contested state ``ahead`` revisions on moved the anchor plausibly.

    At most ``factor`` x ``ahead`` x this peer's largest recent step.

    An honest later revision is a few outer steps of the same group dynamics as
    this peer's own recent commits; a liar's made-up state must stay within
    that, as a clipped poisoner must within a round. A peer with no committed
    step to compare with does not follow a contested claim.

    >>> check_contested_step(0.3, [0.1, 0.2], 4.0) is None, check_contested_step(1.5, [0.1, 0.2], 4.0, ahead=2) is None
    (True, True)
    >>> too_far, no_scale = check_contested_step(0.9, [0.1, 0.2], 4.0), check_contested_step(0.1, [], 4.0)
    >>> too_far is no_scale is CatchUpRefusal.CONTESTED_STEP
    True
    """
    if not own_steps or not shift_norm <= factor * max(1, ahead) * max(own_steps):
        return CatchUpRefusal.CONTESTED_STEP
    return None


def check_downloaded_state(
    own_anchor_norm: float, shift_norm: float, momentum_norm: float, finite: bool, max_shift: float, momentum: float
) -> CatchUpRefusal | None:
    """Whether a downloaded (hash-verified) state is plausible for this peer to adopt.

    It must be finite, its anchor within ``max_shift`` x this peer's own anchor
    norm of that anchor (a relative bound: a late joiner of the same model
    moves a fraction of its weights, a made-up model moves all of them), and
    its outer momentum, which accumulates steps to about 1 / (1 - momentum)
    of one, within that bound scaled the same way.

    >>> check_downloaded_state(10.0, 2.0, 1.0, True, 1.0, 0.9) is None
    True
    >>> check_downloaded_state(10.0, 14.0, 1.0, True, 1.0, 0.9)
    <CatchUpRefusal.TOO_FAR: 'state too far from own anchor'>
    """
    if not (finite and math.isfinite(shift_norm) and math.isfinite(momentum_norm)):
        return CatchUpRefusal.NOT_FINITE
    bound = max_shift * (own_anchor_norm + 1e-6)
    if shift_norm > bound or momentum_norm > bound / (1.0 - momentum):
        return CatchUpRefusal.TOO_FAR
    return None
