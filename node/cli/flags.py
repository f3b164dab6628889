"""argparse flags generated from option dataclasses: the node's (:mod:`node.core.options`) and ``experiment``'s.

One flag per field: its spelling, help, group, choices and default come from
the field, its kind from the type annotation (``bool``: a switch;
``tuple[str, ...]``: repeatable, or one comma-separated flag; ``int | None``:
an optional number). The config file keys (:mod:`node.cli.configfile`) are
these flags' long names, so they follow too.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from node.core.options import flag_of, negated, option_fields, option_types


def comma_list(text: str) -> tuple[str, ...]:
    """A comma-separated flag's values (``8/0, 4/4`` -> ``("8/0", "4/4")``); empty items are dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _scalar_type(annotation: Any) -> Any:
    """``int`` for ``int`` and ``int | None``; likewise float and str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return inner
    return annotation


def _shown(default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    return "unset" if default is None or default == "" else str(default)


def _help(f: Any, annotation: Any) -> str:
    """The field's help: a default-on switch's says it turns it off; a value's ends with its default, unless the
    help already says what the default is (a repeatable flag's is none)."""
    meta = f.metadata
    if meta["hidden"]:
        return argparse.SUPPRESS
    if meta["csv"]:
        return f"{meta['help']} (comma-separated; default: {_shown(f.default)})"
    if annotation is bool:
        return f"off: {meta['help']}" if negated(f) else str(meta["help"])
    if meta["count"] or typing.get_origin(annotation) is tuple or "default" in meta["help"]:
        return str(meta["help"])
    return f"{meta['help']} (default: {_shown(f.default)})"


def _kind(f: Any, annotation: Any, overlay: bool) -> dict[str, Any]:
    """``add_argument``'s action, type, choices and default for field ``f`` (default None with ``overlay``)."""
    meta = f.metadata
    default = None if overlay else f.default
    if meta["count"]:
        return {"action": "count", "default": default}
    if annotation is bool:  # the flag sets the opposite of the default
        return {"action": "store_false" if f.default else "store_true", "default": default}
    if meta["csv"]:
        return {"type": comma_list, "default": default}  # the dataclass checks each value
    if typing.get_origin(annotation) is tuple:
        return {"action": "append", "default": None if overlay else []}
    choices = {"choices": meta["choices"]} if meta["choices"] else {}
    return {"type": _scalar_type(annotation), "default": default, **choices}


def _group(
    parser: argparse.ArgumentParser, groups: dict[str, argparse._ArgumentGroup], title: str
) -> argparse._ArgumentGroup:
    if title not in groups:
        groups[title] = parser.add_argument_group(title)
    return groups[title]


def add_option_flags(parser: argparse.ArgumentParser, cls: type[Any], *, overlay: bool = False) -> None:
    """Add a flag for every option field of ``cls`` to ``parser``, in argument groups by the field's group.

    With ``overlay`` every flag defaults to None, so only the flags given have a value: ``experiment`` lays
    them over its ``--config`` file's (the help still shows the field's own default).
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    hints = option_types(cls)
    for f in option_fields(cls):
        meta = f.metadata
        target = parser if meta["hidden"] else _group(parser, groups, meta["group"])
        names = [n for n in (meta["short"], flag_of(f)) if n]
        target.add_argument(*names, dest=f.name, help=_help(f, hints[f.name]), **_kind(f, hints[f.name], overlay))
