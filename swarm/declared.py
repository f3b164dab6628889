"""The ranges and choices a config field declares, checked from that one declaration.

A field declares its range in its metadata (``min``/``max`` inclusive, ``above``/``below`` exclusive,
``or_zero`` also admitting 0) and the only values it takes in ``choices``. :func:`check_declared` refuses a
config whose value lies outside them, so a config's ``__post_init__`` states only what a declaration cannot
(finiteness, relations between fields); :func:`node.core.options.range_error` words the same rule for a
flag. Standard library only, so the command line reads it before anything heavy is imported.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import fields
from typing import Any

_RULES: tuple[tuple[str, str, Callable[[Any, Any], bool]], ...] = (
    ("above", ">", operator.gt),
    ("min", ">=", operator.ge),
    ("below", "<", operator.lt),
    ("max", "<=", operator.le),
)


def number_text(value: float) -> str:
    """A number as a message shows it: ``0.5``, ``1e-06``, ``4096``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def is_ranged(meta: Mapping[str, Any]) -> bool:
    """Whether a field's metadata declares any bound."""
    return any(meta.get(key) is not None for key, _, _ in _RULES)


def broken_rule(meta: Mapping[str, Any], value: Any) -> str | None:
    """The range of ``meta`` that ``value`` lies outside, as a message words it (``0 or >= 1``, ``>= 1 and <=
    4096``); None where it lies inside, or is not a number (None, a bool, text: a range says nothing of them).

    >>> broken_rule({"min": 1, "or_zero": True}, 0.5), broken_rule({"min": 1, "or_zero": True}, 0)
    ('0 or >= 1', None)
    """
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if meta.get("or_zero") and value == 0:
        return None
    bounds = [(meta[key], word, test) for key, word, test in _RULES if meta.get(key) is not None]
    if all(test(value, bound) for bound, _, test in bounds):  # NaN fails every bound
        return None
    rule = " and ".join(f"{word} {number_text(bound)}" for bound, word, _ in bounds)
    return f"{'0 or ' if meta.get('or_zero') else ''}{rule}"


def declared_problem(config: Any, skip: Collection[str] = ()) -> str | None:
    """The first field of dataclass ``config`` (but those in ``skip``) whose value its declaration refuses, in
    one sentence naming the config, the field and what it takes; None if every one is inside."""
    for f in fields(config):
        value = getattr(config, f.name)
        where = f"{type(config).__name__}.{f.name}={value!r}"
        choices = f.metadata.get("choices")
        if f.name in skip:
            continue
        if choices and value not in choices:
            return f"{where}; use one of {', '.join(map(str, choices))}"
        if not is_ranged(f.metadata):
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{where}; use a number"
        rule = broken_rule(f.metadata, value)
        if rule:
            return f"{where}; use {wanted_text(f.metadata)}"
    return None


def wanted_text(meta: Mapping[str, Any]) -> str:
    """The values a range admits, as a fix words them: ``a value in [0, 1)``, ``0 or a value >= 1``.

    >>> wanted_text({"min": 0, "below": 1}), wanted_text({"min": 1, "or_zero": True})
    ('a value in [0, 1)', '0 or a value >= 1')
    """
    zero = "0 or " if meta.get("or_zero") else ""
    lows = [(mark, meta[key]) for key, mark in (("min", "["), ("above", "(")) if meta.get(key) is not None]
    highs = [(mark, meta[key]) for key, mark in (("max", "]"), ("below", ")")) if meta.get(key) is not None]
    if len(lows) == 1 and len(highs) == 1:
        (opening, low), (closing, high) = lows[0], highs[0]
        return f"{zero}a value in {opening}{number_text(low)}, {number_text(high)}{closing}"
    bounds = [f"{word} {number_text(meta[key])}" for key, word, _ in _RULES if meta.get(key) is not None]
    return f"{zero}a value {' and '.join(bounds)}"


def check_declared(config: Any, skip: Collection[str] = ()) -> None:
    """Raise ValueError with :func:`declared_problem`'s sentence if ``config`` holds a value its fields'
    declarations refuse."""
    problem = declared_problem(config, skip)
    if problem:
        raise ValueError(problem)
