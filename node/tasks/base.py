"""What every task family is: a config, a deterministic item generator and a verifier.

An item is a pure function of (family, config, seed, index): any node can
regenerate it, and its ground truth, from a :class:`protocol.TaskRef`. Each
family draws from a local ``random.Random`` seeded from a hash of that tuple,
never from the global RNG.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from protocol.schema import Scalar, TaskRef, config_digest

MAX_U63 = 2**63
"""Seeds and indices are in [0, MAX_U63) (they travel as msgpack unsigned 63-bit integers)."""


class UnknownTask(ValueError):
    """A task reference this node cannot regenerate: unknown family, bad config or digest mismatch."""


class BadTaskConfig(UnknownTask):
    """A task config with unknown keys, wrong types or out-of-range values."""


class TaskDigestMismatch(UnknownTask):
    """A task reference whose config digest does not match its config."""


@dataclass(frozen=True)
class TaskItem:
    """One question: its reference, the prompt text and the gold answer."""

    ref: TaskRef
    prompt: str
    answer: str


class TaskFamily:
    """Base of a procedural task family.

    Subclasses set ``name``, ``params`` (config key -> (default, min, max), all
    integers) and implement :meth:`generate`. ``config`` is always complete
    (defaults filled in) so that its digest is canonical.
    """

    name: ClassVar[str] = ""
    params: ClassVar[dict[str, tuple[int, int, int]]] = {}

    def __init__(self, config: Mapping[str, Scalar] | None = None) -> None:
        self.config: dict[str, Scalar] = self.validate_config(config or {})
        self.digest = config_digest(self.config)

    @classmethod
    def validate_config(cls, config: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """The complete config (defaults filled in); raises :class:`BadTaskConfig`."""
        unknown = sorted(set(config) - set(cls.params))
        if unknown:
            raise BadTaskConfig(f"task {cls.name!r}: unknown config keys {unknown}; known: {sorted(cls.params)}")
        full: dict[str, Scalar] = {}
        for key, (default, lo, hi) in cls.params.items():
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadTaskConfig(f"task {cls.name!r}: config {key!r} must be an integer")
            if not lo <= value <= hi:
                raise BadTaskConfig(f"task {cls.name!r}: config {key!r}={value} is outside [{lo}, {hi}]")
            full[key] = value
        return full

    def _int(self, key: str) -> int:
        return int(self.config[key])

    def _rng(self, seed: int, index: int) -> random.Random:
        key = f"{self.name}|{self.digest}|{seed}|{index}".encode()
        return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))

    def item(self, seed: int, index: int) -> TaskItem:
        """The item at (seed, index): a pure function of (family, config, seed, index)."""
        if not (0 <= seed < MAX_U63 and 0 <= index < MAX_U63):
            raise ValueError("seed and index must be in [0, 2^63)")
        prompt, answer = self.generate(self._rng(seed, index))
        return TaskItem(TaskRef.make(self.name, self.config, seed, index), prompt, answer)

    def needs_build(self, seed: int) -> bool:
        """Whether regenerating an item of ``seed`` must first build something expensive.

        False here: a built-in item is a sha256 and a few draws (about 20 us with
        its verification). Families that build per-seed state (reasoning-gym
        datasets) say True until it is cached, so that ingest can budget the
        builds a peer's seeds cause.
        """
        return False

    def generate(self, rng: random.Random) -> tuple[str, str]:
        """Draw (prompt, answer) from ``rng``; subclasses implement this."""
        raise NotImplementedError

    def score(self, item: TaskItem, completion: str) -> float:
        """1.0 if the completion, stripped of surrounding whitespace, equals the answer, else 0.0."""
        return 1.0 if completion.strip() == item.answer else 0.0
