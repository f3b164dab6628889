"""The one loader of option files: a node's ``--config`` (``start``, ``join``, ``local``) and ``experiment``'s.

A file is TOML (JSON where its name ends in ``.json``) whose keys name options, ``_`` and ``-`` alike. Each
command says which keys it takes and of what kind (:class:`FileKey`); the loader checks every value against
its key and returns them by option name. Every problem is an :class:`OptionFileError` of one sentence naming
the file and the fix. Standard library only, so a bad file is refused before anything heavy is imported.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Many = Literal["", "repeat", "csv"]
"""How many values a key takes: one; a list or one string (a repeatable flag); a list or a comma-separated
string (a comma-separated flag)."""

_TOML_WHERE = re.compile(r"^(?P<reason>.*) \(at (?:line (?P<line>\d+), column \d+|end of document)\)$", re.S)


class OptionFileError(ValueError):
    """An option file that cannot be read or parsed, or that holds a key or value its command does not take."""


@dataclass(frozen=True)
class FileKey:
    """What one key of an option file sets: the option ``dest``, of ``kind`` (bool, int, float or str)."""

    dest: str
    kind: type
    many: Many = ""
    optional: bool = False  # None (a JSON null) leaves the option unset
    choices: tuple[str, ...] = ()


def field_file_key(dest: str, annotation: Any, *, csv: bool = False, choices: tuple[str, ...] = ()) -> FileKey:
    """The key of an option dataclass field from its type: ``int | None`` is optional, ``tuple[X, ...]`` many X
    (comma-separated with ``csv``, else repeatable)."""
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(None) in args
    if optional:
        (annotation,) = [a for a in args if a is not type(None)]
    many: Many = ""
    if typing.get_origin(annotation) is tuple:
        many, annotation = ("csv" if csv else "repeat"), typing.get_args(annotation)[0]
    return FileKey(dest, annotation, many, optional, choices)


def normal_key(key: str) -> str:
    """A key as the loader compares it: ``max_threads`` and ``max-threads`` are one key."""
    return key.replace("_", "-")


def read_option_file(path: str | Path, missing_hint: str) -> dict[str, Any]:
    """The file's table; a missing, unreadable or malformed file is one sentence (``missing_hint``: how to make
    one)."""
    where = Path(path).expanduser()
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OptionFileError(f"config file {path} does not exist; {missing_hint}") from None
    except IsADirectoryError:
        raise OptionFileError(
            f"config file {path} is a directory; pass a TOML file, e.g. {path}/swarm-node.toml"
        ) from None
    except OSError as e:
        raise OptionFileError(f"config file {path} cannot be read ({e.strerror}); check its permissions") from None
    except UnicodeDecodeError:
        raise OptionFileError(f"config file {path} is not UTF-8 text; save it as UTF-8 TOML") from None
    data = _parse_json(path, text) if where.suffix == ".json" else _parse_toml(path, text)
    if not isinstance(data, dict):
        raise OptionFileError(f'config file {path} must be one JSON object of keys and values, e.g. {{"rounds": 20}}')
    return data


def _parse_toml(path: str | Path, text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        match = _TOML_WHERE.match(str(e))
        reason, line = (match["reason"], match["line"]) if match else (str(e), None)
        at = f"line {line}" if line else "its end"
        raise OptionFileError(
            f"config file {path} is not valid TOML at {at} ({reason[:1].lower()}{reason[1:]}); write one "
            'key = value a line, text in quotes, e.g. rounds = 20 or model = "tiny-s"'
        ) from None


def _parse_json(path: str | Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionFileError(
            f"config file {path} is not valid JSON at line {e.lineno} ({e.msg.lower()}); write one object, e.g. "
            '{"rounds": 20, "model": "tiny-s"}'
        ) from None


def load_option_file(
    path: str | Path, keys: Mapping[str, FileKey], *, ignored: Collection[str] = (), missing_hint: str
) -> dict[str, Any]:
    """Option ``dest`` -> value for every key of the file at ``path``, each checked against its :class:`FileKey`.

    A key of ``ignored`` (another command's, say) is accepted and dropped; any other unknown key is refused
    with the closest known one and the list of all.
    """
    data = read_option_file(path, missing_hint)
    known = {normal_key(k): k for k in (*keys, *ignored)}
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for raw, value in data.items():
        key = normal_key(raw)
        if key not in known:
            raise OptionFileError(f"config file {path}: {_unknown(raw, known)}")
        if key in seen:
            raise OptionFileError(f"config file {path}: {seen[key]!r} and {raw!r} are one key; keep one of them")
        seen[key] = raw
        spec = keys.get(known[key])
        if spec is not None:
            out[spec.dest] = file_value(f"config file {path}: {raw}", value, spec)
    return out


def _unknown(raw: str, known: Mapping[str, str]) -> str:
    close = difflib.get_close_matches(normal_key(raw), known, n=1)
    guess = f" (did you mean {known[close[0]]!r}?)" if close else ""
    return f"unknown key {raw!r}{guess}; valid keys are: {', '.join(sorted(set(known.values())))}"


def file_value(where: str, value: Any, spec: FileKey) -> Any:
    """``value`` as its key's kind (a tuple for a comma-separated key, a list for a repeatable one); ``where``
    (file and key) starts the sentence that refuses it."""
    if value is None and spec.optional:
        return None
    if isinstance(value, dict):
        raise OptionFileError(f"{where} must be a single value, not a table")
    if not spec.many:
        return _scalar(where, value, spec)
    if spec.many == "csv" and isinstance(value, str):  # the flag's own spelling: "8/0,4/4"
        value = [_from_text(where, v.strip(), spec) for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        value = [value]
    if spec.kind is str and not all(isinstance(v, str) for v in value):
        raise OptionFileError(f"{where} must be a string or a list of strings")
    items = [_scalar(where, v, spec) for v in value]
    return tuple(items) if spec.many == "csv" else items


def _from_text(where: str, text: str, spec: FileKey) -> Any:
    """One item of a comma-separated string, as its key's kind."""
    try:
        return spec.kind(text) if spec.kind in (int, float) else text
    except ValueError:
        raise OptionFileError(f"{where}: {text!r} must be {_WANTED[spec.kind]}") from None


_WANTED: dict[type, str] = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def _scalar(where: str, value: Any, spec: FileKey) -> Any:
    kind = spec.kind
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str | int | float) and not isinstance(value, bool),  # host-port = 31337 is text
    }.get(kind, False)
    if not ok:
        raise OptionFileError(f"{where} = {value!r} must be {_WANTED.get(kind, kind.__name__)}")
    value = kind(value)
    if spec.choices and value not in spec.choices:
        raise OptionFileError(f"{where} = {value!r} must be one of {', '.join(spec.choices)}")
    return value
