"""Configuration and command line of ``swarm-node experiment``.

Flags, or a TOML/JSON file (``--config FILE``) whose keys are the fields of
:class:`ExperimentConfig`; flags given explicitly override the file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from node.core.options import NodeOptions, choices_of
from node.core.pool import SAMPLING_POLICIES
from node.experiments.results import parse_split
from node.training.offpolicy import OBJECTIVES

AGGREGATORS = choices_of(NodeOptions, "aggregator")  # no swarm import: the CLI reads this before torch

logger = logging.getLogger(__name__)


@dataclass
class ExperimentConfig:
    """A sweep: sampling policies x local/external splits x seeds, each a local swarm."""

    nodes: int = field(default=4, metadata={"help": "Node processes per run (127.0.0.1)."})
    splits: tuple[str, ...] = field(
        default=("8/0", "6/2", "4/4", "2/6"),
        metadata={"help": "Local/external splits I/J; I + J must be equal for all (equal compute per node)."},
    )
    seeds: int = field(default=2, metadata={"help": "Repetitions of each configuration with different seeds."})
    seed_base: int = field(default=0, metadata={"help": "Run k uses seed seed_base + 100 k (node i adds i)."})
    rounds: int = field(default=150, metadata={"help": "Rounds per node in every run."})
    sampling: tuple[str, ...] = field(
        default=("advantage",),  # a node's own default (node.core.options)
        metadata={"help": "External sampling policies to compare: " + ", ".join(SAMPLING_POLICIES) + "."},
    )
    objectives: tuple[str, ...] = field(
        default=("plain",),
        metadata={"help": "How peers' completions enter the loss, compared as an axis: " + ", ".join(OBJECTIVES)
                  + " (see node.training.offpolicy)."},
    )  # fmt: skip
    sync_every: tuple[int, ...] = field(
        default=(0,),
        metadata={"help": "Outer sync settings to compare as an axis: rounds between syncs (H), 0 for none. "
                  "Synced runs need nodes of one model (--models tiny-m)."},
    )  # fmt: skip
    outer_lr: float | None = field(
        default=None, metadata={"help": "Outer learning rate of synced runs (default: the node's)."}
    )
    outer_momentum: float | None = field(
        default=None, metadata={"help": "Outer momentum of synced runs (default: the node's)."}
    )
    sync_aggregator: str = field(
        default="", metadata={"help": "Aggregator of synced runs' outer step (default: the node's)."}
    )
    warm_start: int = field(
        default=0,
        metadata={"help": "Supervised warm-start steps every node takes before its first round (one shared prior, "
                  "SAPO's same-model regime); 0: off."},
    )  # fmt: skip
    eval_every: int = field(
        default=20, metadata={"help": "Rounds between held-out evaluations of every node (0: off)."}
    )
    eval_items: int = field(default=64, metadata={"help": "Held-out questions per task family."})
    eval_samples: int = field(
        default=4, metadata={"help": "Sampled completions per held-out question (0: greedy accuracy only)."}
    )
    primary: str = field(
        default="",
        metadata={"help": "The one comparison declared before the sweep, as LABEL:SPLIT (e.g. advantage+sync10:4/4); "
                  "the tables mark it."},
    )  # fmt: skip
    reference_splits: tuple[str, ...] = field(
        default=(),
        metadata={"help": "No-sharing splits with more local groups (e.g. 16/0: twice the local data), shown for "
                  "reference and marked as not equal compute."},
    )  # fmt: skip
    diagnose: bool = field(
        default=True, metadata={"help": "Nodes record per-source log-probs, weights and gradient shares."}
    )
    tasks: tuple[str, ...] = field(default=(), metadata={"help": "Task families (empty: all built-in families)."})
    models: tuple[str, ...] = field(
        default=(), metadata={"help": "Models assigned round-robin to nodes (empty: swarm-node local's mix)."}
    )
    generations: int = field(default=8, metadata={"help": "G: completions per question."})
    lr: float | None = field(default=None, metadata={"help": "Learning rate (default: GRPOConfig's)."})
    max_new_tokens: int = field(default=0, metadata={"help": "Tokens per completion (0: the node's default)."})
    round_timeout: float = field(default=300.0, metadata={"help": "Fail a run if no node progresses this long (s)."})
    min_generate: float = field(
        default=0.0,
        metadata={
            "help": "Shortest a round's generation lasts (s): tiny models then keep a real model's round length, "
            "so the network has the time it would have in a real swarm (0: off)."
        },
    )
    out: str = field(default="runs/experiment", metadata={"help": "Results folder (reused to resume)."})
    progress: bool = field(default=True, metadata={"help": "Show a progress display."})

    def __post_init__(self) -> None:
        self.splits = tuple(self.splits)
        self.sampling = tuple(self.sampling)
        self.objectives = tuple(self.objectives)
        self.reference_splits = tuple(self.reference_splits)
        self.tasks = tuple(self.tasks)
        self.models = tuple(self.models)
        try:
            self.sync_every = tuple(int(x) for x in self.sync_every)
        except ValueError:
            raise ValueError(
                f"sync_every={','.join(map(str, self.sync_every))}; use whole numbers of rounds, e.g. 0,10"
            ) from None
        checks = [
            (1 <= self.nodes <= 64, f"nodes={self.nodes}; use 1-64"),
            (self.seeds >= 1, f"seeds={self.seeds}; use at least 1"),
            (self.seed_base >= 0, f"seed_base={self.seed_base}; use 0 or more"),
            (self.rounds >= 1, f"rounds={self.rounds}; use at least 1"),
            (bool(self.splits), "splits is empty; give at least one, e.g. 8/0,4/4"),
            (bool(self.sampling), "sampling is empty; use uniform, advantage or both"),
            (2 <= self.generations <= 64, f"generations={self.generations}; GRPO needs 2-64"),
            (self.lr is None or 0 < self.lr < 1, f"lr={self.lr}; use a value in (0, 1)"),
            (self.max_new_tokens >= 0, f"max_new_tokens={self.max_new_tokens}; use 0 (default) or more"),
            (self.round_timeout > 0, f"round_timeout={self.round_timeout}; use a positive number of seconds"),
            (0 <= self.min_generate <= 3600, f"min_generate={self.min_generate}; use seconds in [0, 3600] (0: off)"),
            (bool(self.sync_every) and min(self.sync_every) >= 0, "sync_every needs values >= 0, e.g. 0,10"),
            (len(set(self.sync_every)) == len(self.sync_every), "sync_every has duplicates; e.g. 0,10"),
            (self.outer_lr is None or 0 < self.outer_lr <= 10, f"outer_lr={self.outer_lr}; use a value in (0, 10]"),
            (
                self.outer_momentum is None or 0 <= self.outer_momentum < 1,
                f"outer_momentum={self.outer_momentum}; use a value in [0, 1)",
            ),
            (
                self.sync_aggregator in ("", *AGGREGATORS),
                f"sync_aggregator={self.sync_aggregator!r}; use one of {', '.join(AGGREGATORS)}",
            ),
            (0 <= self.warm_start <= 100_000, f"warm_start={self.warm_start}; use 0 (off) to 100000 steps"),
            (self.eval_every >= 0, f"eval_every={self.eval_every}; use 0 (off) or a number of rounds"),
            (1 <= self.eval_items <= 4096, f"eval_items={self.eval_items}; use 1-4096"),
            (0 <= self.eval_samples <= 64, f"eval_samples={self.eval_samples}; use 0-64"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        for s in self.sampling:
            if s not in SAMPLING_POLICIES:
                raise ValueError(f"sampling {s!r}; use one of {SAMPLING_POLICIES}")
        for o in self.objectives:
            if o not in OBJECTIVES:
                raise ValueError(f"objective {o!r}; use one of {', '.join(OBJECTIVES)}")
        if not self.objectives or len(set(self.objectives)) != len(self.objectives):
            raise ValueError("objectives is empty or has duplicates; e.g. plain,tis")
        self._check_splits()

    def _check_splits(self) -> None:
        pairs = self.split_pairs()  # raises on a malformed split
        if any(i < 1 for i, _ in pairs):
            raise ValueError("every split needs at least 1 local group (I >= 1)")
        if len({i + j for i, j in pairs}) != 1:
            raise ValueError(f"splits {','.join(self.splits)} differ in I + J; equal compute needs one total")
        if len(set(pairs)) != len(pairs):
            raise ValueError("splits has duplicates")
        for text in self.reference_splits:
            i, j = parse_split(text)
            if j != 0 or i < 1 or (i, j) in pairs:
                raise ValueError(f"reference split {text}: use a no-sharing split not in splits, e.g. 16/0")

    @property
    def baseline_split(self) -> str | None:
        """The equal-compute no-sharing split (J = 0) among ``splits``, if any: every ratio is to it."""
        return next((f"{i}/{j}" for i, j in self.split_pairs() if j == 0), None)

    def split_pairs(self) -> list[tuple[int, int]]:
        """The splits as (I, J) pairs."""
        return [parse_split(s) for s in self.splits]

    def seed_values(self) -> list[int]:
        """The base seed of each repetition (spaced so nodes' seeds never overlap across runs)."""
        return [self.seed_base + 100 * k for k in range(self.seeds)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


LIST_FIELDS = {"splits", "sampling", "tasks", "models", "objectives", "reference_splits", "sync_every"}
"""Fields given as comma-separated lists on the command line."""


def load_config_file(path: Path) -> dict[str, Any]:
    """Fields from a TOML (``.toml``) or JSON file; unknown keys are an error."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read --config {path}: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            import tomllib  # Python >= 3.11

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise ValueError("TOML config files need Python 3.11+; use a .json file") from None
    except ValueError as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"--config {path} does not parse: {e}") from None
    known = {f.name for f in fields(ExperimentConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown keys {unknown}; known: {sorted(known)}")
    return {k: tuple(v) if k in LIST_FIELDS and isinstance(v, list) else v for k, v in data.items()}
