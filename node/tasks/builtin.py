"""The built-in procedural families: tiny digit puzzles for from-scratch character models.

Answers are short (mostly one character) so that a from-scratch character
model sometimes succeeds by chance; families differ in difficulty so that
nodes can specialise.
"""

from __future__ import annotations

import random

from node.tasks.base import TaskFamily


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
