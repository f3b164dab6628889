"""argparse flags generated from the option dataclasses of :mod:`node.core.options`.

One flag per field: its spelling, help, group and default come from the
field, its kind from the type annotation (``bool``: a switch; ``tuple[str,
...]``: repeatable; ``int | None``: an optional number). The config file keys
(:mod:`node.cli.configfile`) are these flags' long names, so they follow too.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from node.core.options import NodeOptions, flag_of, option_fields, option_types


def _scalar_type(annotation: Any) -> Any:
    """``int`` for ``int`` and ``int | None``; likewise float and str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return inner
    return annotation


def _with_default(helptext: str, default: Any, annotation: Any) -> str:
    """The help with its default appended, unless the help already says what the default is (or a switch)."""
    if annotation is bool or typing.get_origin(annotation) is tuple or "default" in helptext:
        return helptext
    shown = "unset" if default is None or default == "" else str(default)
    return f"{helptext} (default: {shown})"


def add_option_flags(parser: argparse.ArgumentParser, cls: type[NodeOptions]) -> None:
    """Add a flag for every option field of ``cls`` to ``parser``, in argument groups by the field's group."""
    groups: dict[str, Any] = {}
    hints = option_types(cls)
    for f in option_fields(cls):
        meta = f.metadata
        if meta["hidden"]:
            target: Any = parser
            helptext = argparse.SUPPRESS
        else:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            target = groups[meta["group"]]
            helptext = meta["help"]
        names = [n for n in (meta["short"], flag_of(f)) if n]
        annotation = hints[f.name]
        if helptext is not argparse.SUPPRESS and not meta["count"]:
            helptext = _with_default(helptext, f.default, annotation)
        common: dict[str, Any] = {"dest": f.name, "help": helptext}
        if meta["choices"]:
            common["choices"] = meta["choices"]
        if meta["count"]:
            target.add_argument(*names, action="count", default=f.default, **common)
        elif annotation is bool:  # the flag sets the opposite of the default
            action = "store_false" if f.default else "store_true"
            target.add_argument(*names, action=action, default=f.default, **common)
        elif typing.get_origin(annotation) is tuple:
            target.add_argument(*names, action="append", default=[], **common)
        else:
            target.add_argument(*names, type=_scalar_type(annotation), default=f.default, **common)
