"""Members that keep aborting rounds the others would commit: counted, then left out of later groups.

Any member can end a round with an "abort" vote, and an honest one has reasons
to: its average failed a check, a partner stopped answering, another group
extended the parent first, it is leaving. None of these repeats round after
round while the same partners keep voting one digest. So this peer keeps, for
each member it shared a round with, whether that member aborted a round in
which this peer voted a digest and no vote disagreed with it (a *veto*), over
the last ``span`` such rounds; a member with ``limit`` vetoes among them is left
out of this peer's groups for the suspect ban (``OuterSyncConfig.suspect_ban_s``).

An abort ends the round for every member that reads it, and each member counts
its own vote as seen (``SyncRecords`` adds it when a read misses it), so the
honest members of a group count the same vetoes and leave the vetoer out
together, whichever of their reads or pings ended the round. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping

from swarm.sync.records import ABORT_DIGEST

MAX_TRACKED = 1024
"""Members remembered (the least recently seen forgotten first): keys are free, memory is not."""


def vetoers(votes: Mapping[str, str], members: Iterable[str], me: str) -> tuple[str, ...]:
    """The members whose abort vote ended a round in which every other vote seen, ``me``'s included, agreed.

    A round that also shows two different digests is not anyone's veto (the average itself was in doubt).

    >>> vetoers({"me": "x", "v": "abort"}, ["me", "v", "b"], "me")
    ('v',)
    >>> vetoers({"me": "x", "b": "y", "v": "abort"}, ["me", "v", "b"], "me")
    ()
    """
    seen = {p: d for p, d in votes.items() if p in set(members)}
    digests = {d for d in seen.values() if d != ABORT_DIGEST}
    if seen.get(me) in (None, ABORT_DIGEST) or len(digests) != 1:
        return ()
    return tuple(sorted(p for p, d in seen.items() if d == ABORT_DIGEST))


class VetoTally:
    """Per member, whether it vetoed each of the last ``span`` decided rounds it shared with this peer."""

    def __init__(self, limit: int = 3, span: int = 5) -> None:
        if not 1 <= limit <= span:
            raise ValueError(f"veto limit {limit} of {span} rounds; use 1 <= limit <= span")
        self.limit, self.span = limit, span
        self._history: OrderedDict[str, deque[bool]] = OrderedDict()

    def observe(self, members: Iterable[str], me: str, vetoed: Iterable[str]) -> list[str]:
        """Count one decided round this peer voted a digest in; return the members now at the limit."""
        out = set(vetoed)
        over = []
        for peer in members:
            if peer == me:
                continue
            history = self._history.pop(peer, None) or deque(maxlen=self.span)
            history.append(peer in out)
            self._history[peer] = history  # most recently seen last
            if sum(history) >= self.limit:
                over.append(peer)
                history.clear()  # a second ban needs new vetoes after this one ends
        while len(self._history) > MAX_TRACKED:
            self._history.popitem(last=False)
        return over

    def count(self, peer: str) -> int:
        """Vetoes ``peer`` has among the rounds remembered."""
        return sum(self._history.get(peer, ()))
