"""Message schemas: task references, rollout groups and batches, descriptors.

Each record is a frozen dataclass with ``to_wire()`` (plain msgpack-able
values) and ``from_wire()`` (strict: exact key set, exact types, bounded
sizes). ``from_wire`` raises :class:`MessageRejected` naming the first problem.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol import limits
from protocol.errors import MessageRejected

Scalar = str | int | float | bool
_SCALARS = (str, int, float, bool)


def _fields(
    obj: Any,
    what: str,
    spec: Mapping[str, type | tuple[type, ...]],
    optional: Mapping[str, type | tuple[type, ...]] | None = None,
) -> dict[str, Any]:
    """Check that ``obj`` is a map with exactly ``spec``'s keys (plus any of ``optional``'s) and their types."""
    if not isinstance(obj, dict):
        raise MessageRejected(f"{what}: expected a map, got {type(obj).__name__}")
    optional = optional or {}
    keys = set(obj)
    if not set(spec) <= keys <= set(spec) | set(optional):
        missing, extra = sorted(set(spec) - keys), sorted(map(str, keys - set(spec) - set(optional)))
        raise MessageRejected(f"{what}: missing fields {missing}, unexpected fields {extra}")
    for name, typ in {**spec, **optional}.items():
        if name not in obj:
            continue
        value = obj[name]
        # bool is an int subclass in Python; never accept one for the other.
        bad_bool = isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))
        if bad_bool or not isinstance(value, typ):
            raise MessageRejected(f"{what}.{name}: wrong type {type(value).__name__}")
    return obj


def _text(value: str, what: str, limit: int = limits.MAX_TEXT_CHARS) -> None:
    if len(value) > limit:
        raise MessageRejected(f"{what}: {len(value)} characters exceeds the limit of {limit}")


def _ident(value: str, what: str) -> None:
    if not value or len(value) > limits.MAX_ID_CHARS or not value.isprintable():
        raise MessageRejected(f"{what}: must be 1-{limits.MAX_ID_CHARS} printable characters")


def _time(value: float, what: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise MessageRejected(f"{what}: not a valid timestamp")


def _list_of(values: Any, what: str, limit: int, check: Callable[[Any, str], Any]) -> list[Any]:
    if not isinstance(values, list):
        raise MessageRejected(f"{what}: expected a list")
    if len(values) > limit:
        raise MessageRejected(f"{what}: {len(values)} entries exceeds the limit of {limit}")
    return [check(v, f"{what}[{i}]") for i, v in enumerate(values)]


def config_digest(config: Mapping[str, Scalar]) -> str:
    """Canonical digest of a task config: 16 hex chars of sha256 over sorted msgpack.

    >>> config_digest({"digits": 4}) == config_digest({"digits": 4})
    True
    """
    canonical = msgpack.packb(sorted(config.items()), use_bin_type=True)
    return hashlib.sha256(canonical).hexdigest()[:16]


@dataclass(frozen=True)
class TaskRef:
    """Enough for any node to regenerate a task item and its ground truth."""

    family: str
    config: dict[str, Scalar]
    config_digest: str
    seed: int
    index: int

    @classmethod
    def make(cls, family: str, config: Mapping[str, Scalar], seed: int, index: int) -> TaskRef:
        return cls(family, dict(config), config_digest(config), seed, index)

    def to_wire(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "config": dict(self.config),
            "config_digest": self.config_digest,
            "seed": self.seed,
            "index": self.index,
        }

    @classmethod
    def from_wire(cls, obj: Any, what: str = "task_ref") -> TaskRef:
        spec = {"family": str, "config": dict, "config_digest": str, "seed": int, "index": int}
        d = _fields(obj, what, spec)
        _ident(d["family"], f"{what}.family")
        cfg = d["config"]
        if len(cfg) > limits.MAX_TASK_CONFIG_ENTRIES:
            raise MessageRejected(f"{what}.config: too many entries")
        for k, v in cfg.items():
            if not isinstance(k, str) or not isinstance(v, _SCALARS):
                raise MessageRejected(f"{what}.config: keys must be strings and values scalars")
            _ident(k, f"{what}.config key")
            if isinstance(v, str):
                _text(v, f"{what}.config[{k}]", limits.MAX_ID_CHARS * 4)
        if config_digest(cfg) != d["config_digest"]:
            raise MessageRejected(f"{what}: config digest does not match config")
        if not 0 <= d["seed"] < 2**63 or not 0 <= d["index"] < 2**63:
            raise MessageRejected(f"{what}: seed and index must be in [0, 2^63)")
        return cls(d["family"], dict(cfg), d["config_digest"], d["seed"], d["index"])


@dataclass(frozen=True)
class RolloutGroup:
    """One question with G completions from one policy, and the rewards its sender claims.

    ``logprobs`` (optional) is the sender's claim of each completion's sequence log-probability
    under its own policy, scored on the text (so a receiver with another tokenizer can compare
    its own): the behaviour probability of off-policy corrections. Like the rewards it is only a
    claim; receivers bound what it can do (``node.training.offpolicy``).
    """

    task: TaskRef
    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    model_id: str
    logprobs: tuple[float, ...] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "task": self.task.to_wire(),
            "prompt": self.prompt,
            "completions": list(self.completions),
            "rewards": [float(r) for r in self.rewards],
            "model_id": self.model_id,
        }
        if self.logprobs is not None:
            wire["logprobs"] = [float(x) for x in self.logprobs]
        return wire

    @classmethod
    def from_wire(cls, obj: Any, what: str = "group") -> RolloutGroup:
        spec = {"task": dict, "prompt": str, "completions": list, "rewards": list, "model_id": str}
        d = _fields(obj, what, spec, optional={"logprobs": list})
        task = TaskRef.from_wire(d["task"], f"{what}.task")
        _text(d["prompt"], f"{what}.prompt")
        _ident(d["model_id"], f"{what}.model_id")

        def check_text(v: Any, w: str) -> str:
            if not isinstance(v, str):
                raise MessageRejected(f"{w}: expected text")
            _text(v, w)
            return v

        def check_reward(v: Any, w: str) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise MessageRejected(f"{w}: reward must be a finite number")
            return float(v)

        comps = _list_of(d["completions"], f"{what}.completions", limits.MAX_COMPLETIONS, check_text)
        rewards = _list_of(d["rewards"], f"{what}.rewards", limits.MAX_COMPLETIONS, check_reward)
        if not comps or len(comps) != len(rewards):
            raise MessageRejected(f"{what}: need >= 1 completion and one reward per completion")
        logprobs = None
        if "logprobs" in d:
            found = _list_of(d["logprobs"], f"{what}.logprobs", limits.MAX_COMPLETIONS, _check_logprob)
            if len(found) != len(comps):
                raise MessageRejected(f"{what}: need one log-probability per completion")
            logprobs = tuple(found)
        return cls(task, d["prompt"], tuple(comps), tuple(rewards), d["model_id"], logprobs)


def _check_logprob(v: Any, what: str) -> float:
    """A sequence log-probability: a finite number in [-MAX_NEG_LOGPROB, 0]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise MessageRejected(f"{what}: log-probability must be a finite number")
    if not -limits.MAX_NEG_LOGPROB <= v <= 0:
        raise MessageRejected(f"{what}: log-probability must be in [-{limits.MAX_NEG_LOGPROB:g}, 0]")
    return float(v)


@dataclass(frozen=True)
class RolloutBatch:
    """What one publisher shares in one round: its groups, stamped with who and when."""

    publisher: str
    round: int
    created: float
    groups: tuple[RolloutGroup, ...]
    version: int = limits.PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "publisher": self.publisher,
            "round": self.round,
            "created": self.created,
            "groups": [g.to_wire() for g in self.groups],
        }

    @classmethod
    def from_wire(cls, obj: Any, what: str = "batch") -> RolloutBatch:
        spec = {"version": int, "publisher": str, "round": int, "created": float, "groups": list}
        d = _fields(obj, what, spec)
        _check_version(d["version"], what)
        _ident(d["publisher"], f"{what}.publisher")
        _time(d["created"], f"{what}.created")
        if d["round"] < 0:
            raise MessageRejected(f"{what}.round: must be >= 0")
        groups = _list_of(d["groups"], f"{what}.groups", limits.MAX_GROUPS_PER_BATCH, RolloutGroup.from_wire)
        return cls(d["publisher"], d["round"], d["created"], tuple(groups), d["version"])


@dataclass(frozen=True)
class Descriptor:
    """Small DHT record announcing a payload that its publisher serves over P2P."""

    publisher: str
    round: int
    payload_digest: str
    payload_size: int
    task_families: tuple[str, ...]
    created: float
    expires: float
    version: int = limits.PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "publisher": self.publisher,
            "round": self.round,
            "payload_digest": self.payload_digest,
            "payload_size": self.payload_size,
            "task_families": list(self.task_families),
            "created": self.created,
            "expires": self.expires,
        }

    @classmethod
    def from_wire(cls, obj: Any, what: str = "descriptor") -> Descriptor:
        spec = {
            "version": int,
            "publisher": str,
            "round": int,
            "payload_digest": str,
            "payload_size": int,
            "task_families": list,
            "created": float,
            "expires": float,
        }
        d = _fields(obj, what, spec)
        _check_version(d["version"], what)
        _ident(d["publisher"], f"{what}.publisher")
        digest = d["payload_digest"]
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise MessageRejected(f"{what}.payload_digest: expected 64 lowercase hex characters")
        if not 0 < d["payload_size"] <= limits.MAX_PAYLOAD_BYTES:
            raise MessageRejected(f"{what}.payload_size: must be in (0, {limits.MAX_PAYLOAD_BYTES}]")
        if d["round"] < 0:
            raise MessageRejected(f"{what}.round: must be >= 0")

        def fam(v: Any, w: str) -> str:
            if not isinstance(v, str):
                raise MessageRejected(f"{w}: expected text")
            _ident(v, w)
            return v

        families = _list_of(d["task_families"], f"{what}.task_families", limits.MAX_TASK_FAMILIES, fam)
        _time(d["created"], f"{what}.created")
        _time(d["expires"], f"{what}.expires")
        if not d["created"] < d["expires"] <= d["created"] + limits.MAX_DESCRIPTOR_TTL_S:
            raise MessageRejected(f"{what}: expiry must be after creation and within the maximum TTL")
        return cls(
            d["publisher"],
            d["round"],
            digest,
            d["payload_size"],
            tuple(families),
            d["created"],
            d["expires"],
            d["version"],
        )


def _check_version(version: int, what: str) -> None:
    if version != limits.PROTOCOL_VERSION:
        raise MessageRejected(f"{what}: unsupported protocol version {version}")
