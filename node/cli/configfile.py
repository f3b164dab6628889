"""TOML config files for ``start``, ``join`` and ``local``; the CLI flags are the one source of truth.

Every key of the file is a long flag without its dashes (``max-threads = 2``
is ``--max-threads 2``; ``_`` works as well as ``-``); :mod:`node.core.optionfile`
reads it, as it reads ``experiment``'s, and checks each value against its flag's kind. The file only changes
the flags' defaults, so a flag given on the command line always wins. Nothing
is read from the environment. ``swarm-node init`` writes a file listing every
key, commented out, with its help and default.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from node.cli.errors import CliError
from node.core.optionfile import FileKey, OptionFileError, load_option_file

NODE_COMMANDS = ("start", "join", "local")
NOT_IN_FILE = {"help", "config"}  # flags that make no sense in a file


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of command ``name`` (argparse keeps them in its subparsers action)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]  # type: ignore[no-any-return]
    raise KeyError(name)


def file_options(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Config key (long flag without ``--``) -> argparse action, for the flags a file may set."""
    out: dict[str, argparse.Action] = {}
    for action in sub._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.help == argparse.SUPPRESS or action.dest in NOT_IN_FILE:
            continue
        out[longs[0][2:]] = action
    return out


def _file_key(action: argparse.Action) -> FileKey:
    """The kind of value a flag's key takes in a file (a switch's is true or false, a repeatable flag's a list)."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return FileKey(action.dest, bool)
    if isinstance(action, argparse._AppendAction):
        return FileKey(action.dest, str, many="repeat")
    if isinstance(action, argparse._CountAction) or action.type is int:
        return FileKey(action.dest, int)
    if action.type is float:
        return FileKey(action.dest, float)
    return FileKey(action.dest, str, choices=tuple(action.choices or ()))


def apply_config_file(parser: argparse.ArgumentParser, command: str, path: str) -> dict[str, list[str]]:
    """Make the file's values the defaults of ``command``'s flags (flags on the command line still win).

    Keys of another node command (e.g. ``nodes`` for ``local``) are accepted and
    ignored; any other key is an error naming it and the valid ones. Returns the
    file's values of repeatable flags (``task``, ``peer``, ``announce``): argparse
    would append command-line values to a default list, so the caller uses
    these only when the command line gave none.
    """
    known = {k for c in NODE_COMMANDS for k in file_options(subcommand_parser(parser, c))}
    mine = file_options(subcommand_parser(parser, command))
    try:
        values = load_option_file(
            path, {k: _file_key(a) for k, a in mine.items()}, ignored=known - set(mine),
            missing_hint=f"create one with: swarm-node init {path}",
        )  # fmt: skip
    except OptionFileError as e:
        raise CliError(str(e)) from None
    defaults: dict[str, Any] = {}
    lists: dict[str, list[str]] = {}
    for action in mine.values():
        if action.dest not in values:
            continue
        value = values[action.dest]
        if isinstance(action, argparse._AppendAction):
            lists[action.dest] = value
        else:  # a store_false switch's key says whether its flag is given, so true turns the option off
            defaults[action.dest] = not value if isinstance(action, argparse._StoreFalseAction) else value
    subcommand_parser(parser, command).set_defaults(**defaults)
    return lists


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def _example(action: argparse.Action) -> str | None:
    """The default as a TOML value, or None for an option that is unset by default (no value means that)."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "false"  # a switch's key says whether its flag is given
    if action.default is None:
        return None
    return _toml_value(action.default)


def _other_defaults(parser: argparse.ArgumentParser, shown_for: str, key: str, example: str | None) -> str:
    """ " (default for swarm-node local: 20)" where another command's default differs from the one shown."""
    notes = []
    for command in NODE_COMMANDS:
        action = file_options(subcommand_parser(parser, command)).get(key)
        if command != shown_for and action is not None and _example(action) != example:
            value = _example(action)
            notes.append(f"swarm-node {command}: {'unset' if value is None else value}")
    return f" (default for {', '.join(notes)})" if notes else ""


def render_default_config(parser: argparse.ArgumentParser) -> str:
    """A commented TOML file listing every key with its help and default (all commented out)."""
    lines = [
        "# swarm-node configuration. Use it with: swarm-node start --config THIS_FILE (or join, local).",
        "# Every key is a long flag without '--'; a flag on the command line overrides the file.",
        "# A commented key line shows that key's default: uncomment it and change the value. A key marked",
        "# 'unset by default' has no default value: write it with a value to set it.",
    ]
    seen: set[str] = set()
    for command in NODE_COMMANDS:
        sub = subcommand_parser(parser, command)
        options = file_options(sub)
        for group in sub._action_groups:
            rows = [(k, a) for k, a in options.items() if a in group._group_actions and k not in seen]
            if not rows:
                continue
            title = group.title if command == "start" else f"{group.title} (swarm-node {command} only)"
            lines += ["", f"# ---- {title} ----"]
            for key, action in rows:
                seen.add(key)
                example = _example(action)
                shown = f"# {key} = {example}" if example is not None else f"# {key}: unset by default"
                one_of = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
                lines += [f"# {action.help}{one_of}{_other_defaults(parser, command, key, example)}", shown]
    return "\n".join(lines) + "\n"
