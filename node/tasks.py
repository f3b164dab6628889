"""Procedural, verifiable task families, and a deterministic task mix.

An item is a pure function of (family, config, seed, index): any node can
regenerate it, and its ground truth, from a :class:`protocol.TaskRef`. Each
family draws from a local ``random.Random`` seeded from a hash of that tuple,
never from the global RNG. Answers are short (mostly one character) so that a
from-scratch character model sometimes succeeds by chance; families differ in
difficulty so that nodes can specialise.

>>> fam = build_task("max")
>>> item = fam.item(seed=7, index=0)
>>> fam.score(item, item.answer), fam.score(item, "x")
(1.0, 0.0)
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from protocol.schema import RolloutGroup, Scalar, TaskRef, config_digest

logger = logging.getLogger(__name__)

_MAX_U63 = 2**63
_INDEX_STRIDE = 2**20  # TaskMix: index = round * stride + position in the round


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
        if not (0 <= seed < _MAX_U63 and 0 <= index < _MAX_U63):
            raise ValueError("seed and index must be in [0, 2^63)")
        prompt, answer = self.generate(self._rng(seed, index))
        return TaskItem(TaskRef.make(self.name, self.config, seed, index), prompt, answer)

    def generate(self, rng: random.Random) -> tuple[str, str]:
        """Draw (prompt, answer) from ``rng``; subclasses implement this."""
        raise NotImplementedError

    def score(self, item: TaskItem, completion: str) -> float:
        """1.0 if the completion, stripped of surrounding whitespace, equals the answer, else 0.0."""
        return 1.0 if completion.strip() == item.answer else 0.0


def _digits(rng: random.Random, k: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(k))


class MaxDigit(TaskFamily):
    """``max 3941=`` -> ``9``: the largest of k digits (easy)."""

    name = "max"
    params = {"digits": (4, 2, 12)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, self._int("digits"))
        return f"max {s}=", max(s)


class MinDigit(TaskFamily):
    """``min 3941=`` -> ``1``: the smallest of k digits (easy)."""

    name = "min"
    params = {"digits": (4, 2, 12)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, self._int("digits"))
        return f"min {s}=", min(s)


class NthDigit(TaskFamily):
    """``pos2 3941=`` -> ``9``: the k-th (1-based) of the digits (medium: copy by position)."""

    name = "pos"
    params = {"digits": (4, 2, 9)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        k = self._int("digits")
        s = _digits(rng, k)
        i = rng.randrange(k)
        return f"pos{i + 1} {s}=", s[i]


class CountDigit(TaskFamily):
    """``count7 3771=`` -> ``2``: how often a digit occurs (medium).

    The target digit is taken from the string half of the time, so the answer
    is not almost always 0.
    """

    name = "count"
    params = {"digits": (5, 2, 9)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, self._int("digits"))
        d = rng.choice(s) if rng.random() < 0.5 else rng.choice("0123456789")
        return f"count{d} {s}=", str(s.count(d))


class SumMod(TaskFamily):
    """``3+8+5%10=`` -> ``6``: the sum of k digits modulo 10 (hard)."""

    name = "summod"
    params = {"terms": (2, 2, 6)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        xs = [rng.randrange(10) for _ in range(self._int("terms"))]
        return "+".join(map(str, xs)) + "%10=", str(sum(xs) % 10)


class Parity(TaskFamily):
    """``par 3941=`` -> ``1``: parity of the digit sum, 0 even / 1 odd (hard: an XOR)."""

    name = "parity"
    params = {"digits": (4, 1, 12)}

    def generate(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, self._int("digits"))
        return f"par {s}=", str(sum(map(int, s)) % 2)


BUILTIN_TASKS: dict[str, type[TaskFamily]] = {
    cls.name: cls for cls in (MaxDigit, MinDigit, NthDigit, CountDigit, SumMod, Parity)
}
"""Family name -> class, for every built-in family."""


def task_names() -> list[str]:
    """Every family name :func:`build_task` accepts: the tiny built-ins, then ``rg:<dataset>``."""
    from node.rg_tasks import RG_TASK_NAMES

    return [*BUILTIN_TASKS, *RG_TASK_NAMES]


def build_task(name: str, config: Mapping[str, Scalar] | None = None) -> TaskFamily:
    """A registered family with ``config`` (defaults for missing keys); raises :class:`UnknownTask`.

    Names are the tiny built-ins (:data:`BUILTIN_TASKS`, exact match on the raw
    completion) and the reasoning-gym families ``rg:<dataset>`` (answer
    extraction, see :mod:`node.rg_tasks`).
    """
    if name in BUILTIN_TASKS:
        return BUILTIN_TASKS[name](config)
    from node.rg_tasks import rg_family_class

    try:
        cls = rg_family_class(name)
    except KeyError:
        raise UnknownTask(f"unknown task family {name!r}; known: {task_names()}") from None
    return cls(config)


def task_from_ref(ref: TaskRef) -> tuple[TaskFamily, TaskItem]:
    """Re-derive (family, item) from a reference; raises :class:`UnknownTask` (or a subclass).

    Rejects an unknown family, a config digest that does not match the config,
    and a config that is incomplete, has unknown keys or is out of range.
    """
    if ref.config_digest != config_digest(ref.config):
        raise TaskDigestMismatch(f"task {ref.family!r}: config digest does not match the config")
    family = build_task(ref.family, ref.config)
    if family.config != ref.config:
        raise BadTaskConfig(f"task {ref.family!r}: config must list every key {sorted(family.config)}")
    try:
        item = family.item(ref.seed, ref.index)
    except ValueError as exc:
        raise UnknownTask(f"task {ref.family!r}: {exc}") from exc
    return family, item


class TaskMix:
    """A deterministic mix of families: which items a node works on in each round."""

    def __init__(self, families: Sequence[TaskFamily], seed: int, weights: Sequence[float] | None = None):
        if not families:
            raise ValueError("a task mix needs at least one family")
        if weights is not None and (len(weights) != len(families) or min(weights) < 0 or sum(weights) <= 0):
            raise ValueError("weights must be one non-negative number per family, not all zero")
        self.families = list(families)
        self.seed = seed
        self.weights = list(weights) if weights is not None else [1.0] * len(families)

    def sample(self, round: int, n: int) -> list[TaskItem]:
        """``n`` items for ``round``: a pure function of (families, weights, seed, round, n)."""
        if not 0 <= n < _INDEX_STRIDE or round < 0:
            raise ValueError(f"need 0 <= n < {_INDEX_STRIDE} and round >= 0")
        rng = random.Random(int.from_bytes(hashlib.sha256(f"mix|{self.seed}|{round}".encode()).digest()[:8], "big"))
        chosen = rng.choices(self.families, weights=self.weights, k=n)
        return [fam.item(self.seed, round * _INDEX_STRIDE + i) for i, fam in enumerate(chosen)]


def rollout_group(item: TaskItem, completions: Sequence[str], rewards: Sequence[float], model_id: str) -> RolloutGroup:
    """The shareable record of one locally generated and scored group."""
    if len(completions) != len(rewards):
        raise ValueError("need one reward per completion")
    return RolloutGroup(item.ref, item.prompt, tuple(completions), tuple(float(r) for r in rewards), model_id)
