"""The default progress line: one every :data:`PROGRESS_EVERY_S` seconds, summing the rounds since the last.

A tiny model runs ~10 rounds a second; a line per round buries the warnings
that matter and says nothing a summary does not. :class:`ProgressWindow`
collects each round's numbers and, once the interval has passed, gives one
line carrying what the per-round line did, over the interval: rounds done,
mean reward, groups used and refused, the pool, peers and syncs, and the
latest held-out score. Pure: the
caller passes the time; ``-v`` still shows a line per round
(:data:`node.observe.logs.ROUNDS`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines: a 2-minute run prints about a dozen, and a round longer than this (a real
model on a CPU) gets a line of its own."""


class RoundNumbers(Protocol):
    """What a progress line reads from one round (:class:`node.core.record.RoundRecord` has these)."""

    @property
    def round(self) -> int: ...
    @property
    def reward_mean(self) -> float: ...
    @property
    def external_reward_mean(self) -> float | None: ...
    @property
    def local_groups(self) -> int: ...
    @property
    def external_groups(self) -> int: ...
    @property
    def external_rejected(self) -> int: ...
    @property
    def dropped_zero_adv(self) -> int: ...
    @property
    def trained_groups(self) -> int: ...
    @property
    def pool(self) -> int: ...
    @property
    def peers_seen(self) -> int: ...


@dataclass
class ProgressWindow:
    """The rounds since the last progress line; :meth:`add` returns the next line when one is due.

    The first round gets a line at once (the user sees training has begun), later ones every ``every_s``.
    """

    every_s: float = PROGRESS_EVERY_S
    last_line: float | None = None
    first: int = 0
    rounds: int = 0
    rewards: float = 0.0
    external: list[float] = field(default_factory=list)
    groups: Counter[str] = field(default_factory=Counter)
    syncs: Counter[str] = field(default_factory=Counter)
    held_out: str = ""
    """The latest held-out score since the last line (evaluations every few rounds would each take a line)."""

    def evaluated(self, accuracy: float, round: int, complete: bool = True) -> None:
        """A held-out evaluation finished at ``round``: the next line shows its accuracy."""
        self.held_out = f"held-out {accuracy:.3f} at round {round}{'' if complete else ' (partial)'}"

    def add(self, r: RoundNumbers, now: float, sync: str = "") -> str | None:
        """Count round ``r`` (and the outcome of a sync that ended in it); the line to print, if due."""
        if self.rounds == 0:
            self.first = r.round
        self.rounds += 1
        self.rewards += r.reward_mean
        if r.external_reward_mean is not None:
            self.external.append(r.external_reward_mean)
        self.groups.update(
            local=r.local_groups, external=r.external_groups, rejected=r.external_rejected,
            no_signal=r.dropped_zero_adv, trained=r.trained_groups,
        )  # fmt: skip
        if sync:
            self.syncs[sync] += 1
        if self.last_line is not None and now - self.last_line < self.every_s:
            return None
        return self.flush(r, now)

    def flush(self, last: RoundNumbers | None, now: float) -> str | None:
        """The line of what is counted so far (the run ends), whether due or not; None if nothing is."""
        if last is None or self.rounds == 0:
            line = self.held_out or None
        else:
            took = 0.0 if self.last_line is None else now - self.last_line
            line = self._line(last, took)
        self._reset(now)
        return line

    def _line(self, last: RoundNumbers, took: float) -> str:
        span = f"round {last.round}" if self.rounds == 1 else f"rounds {self.first}-{last.round}"
        ext = f"{sum(self.external) / len(self.external):.3f}" if self.external else "-"
        g = self.groups
        line = (
            f"{span}{f' in {took:.1f}s' if took else ''} | reward {self.rewards / self.rounds:.3f} (external {ext}) | "
            f"groups {g['local']} local + {g['external']} external, {g['rejected']} rejected, "
            f"{g['no_signal']} no signal, {g['trained']} trained | pool {last.pool} | peers {last.peers_seen}"
        )
        if self.syncs:
            outcomes = ", ".join(f"{n} {what}" for what, n in sorted(self.syncs.items()))
            line += f" | syncs {sum(self.syncs.values())}: {outcomes}"
        return f"{line} | {self.held_out}" if self.held_out else line

    def _reset(self, now: float) -> None:
        self.last_line = now
        self.rounds, self.rewards = 0, 0.0
        self.external.clear()
        self.groups.clear()
        self.syncs.clear()
        self.held_out = ""
