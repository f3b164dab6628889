"""Trouble a node cannot fix itself, said once when it starts and once when it ends.

A node that trains alone still works, so nothing fails when its peers are
missing: without these lines a joiner with another ``--swarm-id``, a node whose
last peer died, or an outer sync that never meets a partner would look the
same as a healthy node. Each condition is a :class:`Latch`: it raises one line
when the condition has held long enough and one line when it clears, never a
line per round. Everything here is pure: time and observations are passed in
(the node feeds it its rounds; tests a fake clock).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

ALONE_AFTER_S = 60.0
"""How long a node may hear no peer of its swarm before it says so, unless told otherwise (``--alone-after``,
:class:`swarm.membership.MembershipConfig`)."""
QUIET_ROUNDS = 4
"""A peer counts as gone once it was not heard for this many of this node's rounds, if that is longer than
:data:`ALONE_AFTER_S`: a model whose round takes minutes publishes once a round, and must not flap."""
NO_PARTNER_SYNCS = 3
"""Outer syncs in a row without a partner before the node says why: the first one or two may simply come
before a peer's own first sync is due."""
YIELDED_SYNCS = 8
"""Outer syncs in a row that waited for another group of this model (swarm.sync.decide.running_window) before
the node says it keeps arriving late: one or two are a race lost now and then."""
HEARD_CAPACITY = 4096
"""Peers remembered at most (the least recently heard is forgotten): keys cost nothing, a flood of them
must not grow the node's memory."""


class Edge(Enum):
    """What a :class:`Latch` update did."""

    RAISED = "raised"
    CLEARED = "cleared"


@dataclass
class Latch:
    """A condition that raises once it has held ``grace_s`` and clears the first time it no longer holds."""

    grace_s: float = 0.0
    since: float | None = None
    raised: bool = False

    def update(self, holds: bool, now: float) -> Edge | None:
        """The edge this observation crosses, if any (None while nothing changes)."""
        if not holds:
            self.since = None
            if self.raised:
                self.raised = False
                return Edge.CLEARED
            return None
        if self.since is None:
            self.since = now
        if not self.raised and now - self.since >= self.grace_s:
            self.raised = True
            return Edge.RAISED
        return None


class NoPartnerWhy(Enum):
    """Why outer syncs find no partner, as far as the peers this node hears tell."""

    NO_PEER = "no peer of this swarm is heard"
    OTHER_MODEL = "the peers heard run another model"
    OTHER_SETTINGS = "peers of this model are heard, but none syncs under this node's outer settings"


def no_partner_why(own_model: str, peer_models: Iterable[str]) -> NoPartnerWhy:
    """The likeliest reason, from the model ids of the peers heard recently.

    >>> no_partner_why("tiny-s", [])
    <NoPartnerWhy.NO_PEER: 'no peer of this swarm is heard'>
    >>> no_partner_why("tiny-s", ["tiny-m"])
    <NoPartnerWhy.OTHER_MODEL: 'the peers heard run another model'>
    >>> no_partner_why("tiny-s", ["tiny-m", "tiny-s"]).name
    'OTHER_SETTINGS'
    """
    models = set(peer_models) - {""}
    if not models:
        return NoPartnerWhy.NO_PEER
    return NoPartnerWhy.OTHER_SETTINGS if own_model in models else NoPartnerWhy.OTHER_MODEL


@dataclass(frozen=True)
class Alert:
    """One line to log: its level and its text."""

    level: int
    text: str


@dataclass
class PeerWatch:
    """Whether this node hears peers of its swarm, and whether its outer syncs meet one.

    ``hear`` is told every peer whose batch a collect brought (the exchange reads only this swarm id's
    keys, so a peer heard is a peer of this swarm), with its model id; ``check`` after every round;
    ``synced`` after every outer sync. ``joined_through`` is how many ``--peer`` addresses the node was
    given: a first node alone is waiting for joiners, not in trouble, and is told so at INFO. Trouble
    that clears is said at INFO (the default shows it: it is logged on the progress logger).
    """

    swarm_id: str
    model_id: str
    started: float
    joined_through: int = 0
    alone_after_s: float = ALONE_AFTER_S
    hears: bool = True
    """False for a node that collects nothing (``--external 0``): it hears no one by choice, so it is never
    called alone, and it cannot tell why a sync finds no partner."""
    heard: OrderedDict[str, tuple[float, str]] = field(default_factory=OrderedDict)
    quiet: Latch = field(default_factory=Latch)
    partnerless: Latch = field(default_factory=Latch)
    _no_partner_run: int = 0
    late: Latch = field(default_factory=Latch)
    _yielded_run: int = 0
    _no_partner_why: NoPartnerWhy | None = None
    _last_heard: str = ""
    round_s: float = 0.0
    """The node's last round length (:meth:`check`): slow rounds widen the window a peer may stay silent."""

    def hear(self, peer: str, model: str, now: float) -> None:
        """``peer`` (running ``model``) published a batch this node collected at ``now``."""
        self.heard[peer] = (now, model)
        self.heard.move_to_end(peer)
        self._last_heard = peer
        while len(self.heard) > HEARD_CAPACITY:
            self.heard.popitem(last=False)

    def window_s(self) -> float:
        """How long without a batch makes a peer gone: :data:`ALONE_AFTER_S`, longer for slow rounds."""
        return max(self.alone_after_s, QUIET_ROUNDS * self.round_s)

    def recent(self, now: float) -> dict[str, str]:
        """The peers heard within :meth:`window_s`, with their model ids."""
        cut = now - self.window_s()
        return {p: m for p, (t, m) in self.heard.items() if t >= cut}

    def check(self, now: float, round_s: float = 0.0, connected: int | None = None) -> Alert | None:
        """After a round of ``round_s`` seconds: the line to log if hearing no peer began or ended.

        ``connected`` is how many peers p2p is connected to, if known (see :meth:`due_alone`).
        """
        self.round_s = round_s
        if not self.hears:
            return None
        window = self.window_s()
        recent = self.recent(now)
        edge = self.quiet.update(not recent and now - self.started >= window, now)
        if edge is Edge.CLEARED:
            return Alert(logging.INFO, f"hearing {len(recent)} peer(s) of swarm {self.swarm_id!r} now")
        if edge is not Edge.RAISED:
            return None
        return self._quiet_alert(window, connected)

    def _quiet_alert(self, window: float, connected: int | None) -> Alert:
        if self.heard:
            gone = self._last_heard[-6:]
            return Alert(
                logging.WARNING,
                f"the last peer of swarm {self.swarm_id!r} ({gone}) has not been heard for {window:.0f}s; "
                "this node trains alone until a peer comes back",
            )
        return self._alone(window, connected)

    def _alone(self, window: float, connected: int | None) -> Alert:
        if connected:
            return Alert(
                logging.WARNING,
                f"connected to {connected} peer(s) but none publishes in swarm {self.swarm_id!r} after "
                f"{window:.0f}s: they run another --swarm-id (or share nothing); pass the --swarm-id they use",
            )
        if self.joined_through:
            return Alert(
                logging.WARNING,
                f"no peer of swarm {self.swarm_id!r} heard after {window:.0f}s, and no peer connected; "
                "this node trains alone: check that the --peer node runs and uses this --swarm-id",
            )
        return Alert(
            logging.INFO,
            f"no peer has joined swarm {self.swarm_id!r} in {window:.0f}s; training alone until one does",
        )

    def due_alone(self, now: float, round_s: float = 0.0) -> bool:
        """Whether the next ``check`` raises the alone line (worth asking p2p how many peers are connected)."""
        window = max(self.alone_after_s, QUIET_ROUNDS * round_s)
        return not self.quiet.raised and not self.heard and now - self.started >= window

    def synced(self, partner: bool, now: float) -> Alert | None:
        """After an outer sync: the line if syncs stopped (or started again) meeting a partner."""
        self._no_partner_run = 0 if partner else self._no_partner_run + 1
        edge = self.partnerless.update(self._no_partner_run >= NO_PARTNER_SYNCS, now)
        if edge is Edge.CLEARED:
            self._no_partner_why = None
            return Alert(logging.INFO, "outer sync found a partner again")
        models = self.recent(now)
        why = no_partner_why(self.model_id, models.values())
        # said again only when the reason changes (a peer of another model joined a node that was alone)
        if not self.partnerless.raised or why is self._no_partner_why:
            return None
        self._no_partner_why = why
        fix = (
            _fix(why, models)
            if self.hears
            else "this node collects no peer's batches (--external 0), so it cannot tell why"
        )
        return Alert(logging.WARNING, f"outer sync found no partner {NO_PARTNER_SYNCS} times in a row: {fix}")

    def yielded(self, waited: bool, now: float) -> Alert | None:
        """After an outer sync: a warning once syncs keep waiting for other groups (this node always arrives
        after its peers' window closed), a line when it takes part again."""
        self._yielded_run = self._yielded_run + 1 if waited else 0
        edge = self.late.update(self._yielded_run >= YIELDED_SYNCS, now)
        if edge is Edge.RAISED:
            return Alert(
                logging.WARNING,
                f"outer sync waited for another group of this model {YIELDED_SYNCS} times in a row: this node "
                "reaches each state after its peers' gather window closed (slow rounds or links), so it catches "
                "up but averages nothing of its own; a longer --sync-window on every peer lets it in",
            )
        return Alert(logging.INFO, "outer sync takes part in a group again") if edge is Edge.CLEARED else None


def _fix(why: NoPartnerWhy, models: dict[str, str]) -> str:
    """The reason in words, and what to change."""
    if why is NoPartnerWhy.NO_PEER:
        return f"{why.value}; it syncs once a peer of the same model and outer settings joins"
    if why is NoPartnerWhy.OTHER_MODEL:
        others = ", ".join(sorted(set(models.values()) - {""})[:3])
        return f"{why.value} ({others}); only peers of the same --model (and --adapter) sync weights"
    return (
        f"{why.value}: use the same --outer-lr, --outer-momentum, --sync-compression and --adapter settings as "
        "they do, and check that they sync (--sync-every or --sync-period)"
    )
