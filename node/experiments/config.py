"""Configuration and command line of ``swarm-node experiment``.

Flags, or a TOML/JSON file (``--config FILE``, read by :mod:`node.core.optionfile` as a node's is) whose keys
are the fields of :class:`ExperimentConfig`; flags given explicitly override the file.
"""

from __future__ import annotations

import logging
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from node.core.optionfile import FileKey, field_file_key, load_option_file
from node.core.options import (
    EVAL,
    SYNC,
    LocalOptions,
    NodeOptions,
    default_of,
    first_option_error,
    option,
    option_fields,
    option_types,
    report_to_problem,
)
from node.core.pool import SAMPLING_POLICIES
from node.experiments.results import parse_split
from node.training.offpolicy import OBJECTIVES, default_objective

logger = logging.getLogger(__name__)


def node_option(name: str, default: Any = MISSING, note: str = "") -> Any:
    """A field that is the node option ``name``: its flag, help, range and choices, and its default unless the
    sweep states its own (``note`` then says why, in the help)."""
    f = next(f for f in fields(LocalOptions) if f.name == name)
    meta = dict(f.metadata)
    if note:
        meta["help"] = f"{meta['help']}; {note}"
    return field(default=f.default if default is MISSING else default, metadata=meta)


SWEEP = "sweep (local swarms per split and seed)"


@dataclass
class ExperimentConfig:
    """A sweep: sampling policies x local/external splits x seeds, each a local swarm.

    Every field is an :func:`~node.core.options.option`, so ``experiment``'s flags come from the generator of
    the node's (:func:`node.cli.flags.add_option_flags`); a list is one comma-separated flag (``csv``).
    """

    nodes: int = option(4, "Node processes per run (127.0.0.1).", group=SWEEP, min=1, max=64)
    splits: tuple[str, ...] = option(
        ("8/0", "6/2", "4/4", "2/6"), "Local/external splits I/J; I + J must be equal for all (equal compute per "
        "node).", group=SWEEP, csv=True,
    )  # fmt: skip
    seeds: int = option(2, "Repetitions of each configuration with different seeds.", group=SWEEP, min=1)
    seed_base: int = option(0, "Run k uses seed seed_base + 100 k (node i adds i).", group=SWEEP, min=0)
    rounds: int = option(
        150, "Rounds per node in every run (a node's `local` runs 20; a sweep compares whole learning curves).",
        group=SWEEP, min=1,
    )  # fmt: skip
    sampling: tuple[str, ...] = option(
        (default_of(NodeOptions, "sampling"),),  # what a node runs by default
        "External sampling policies to compare: " + ", ".join(SAMPLING_POLICIES) + ".", group=SWEEP, csv=True,
    )  # fmt: skip
    objectives: tuple[str, ...] = option(
        (default_objective(),), "How peers' completions enter the loss, compared as an axis: "
        + ", ".join(OBJECTIVES) + f" (see node.training.offpolicy; a node's default is {default_objective()}).",
        group=SWEEP, csv=True,
    )  # fmt: skip
    sync_every: tuple[int, ...] = option(
        (0,), "Outer sync settings to compare as an axis: rounds between syncs (H), 0 for none. Synced runs need "
        "nodes of one model (--models tiny-m).", group=SYNC, csv=True,
    )  # fmt: skip
    sync_period_s: int = option(
        0, "Synced runs sync on a shared clock every this many seconds instead of every H rounds, so nodes whose "
        "rounds drift apart still meet (labels say +sync60s; give one H > 0 in --sync-every; 0: every H rounds).",
        group=SYNC, flag="--sync-period", min=1, or_zero=True,
    )  # fmt: skip
    matchmaking_timeout_s: float = node_option("matchmaking_timeout_s", note="synced runs only")
    outer_lr: float | None = option(
        None, "Outer learning rate of synced runs (default: the node's).", group=SYNC, above=0, max=10
    )
    outer_momentum: float | None = option(
        None, "Outer momentum of synced runs (default: the node's).", group=SYNC, min=0, below=1
    )
    aggregator: str = node_option("aggregator")
    warm_start_steps: int = node_option("warm_start_steps")
    eval_every: int = option(
        20, "Rounds between held-out evaluations of every node (0: off; a sweep's tables compare held-out accuracy, "
        "so it evaluates more often than a node's default).", group=EVAL, min=0,
    )  # fmt: skip
    eval_items: int = node_option("eval_items")
    eval_samples: int = option(
        4,
        "Sampled completions per held-out question (0: greedy accuracy only; a node's default is 8, a sweep "
        "evaluates every node of every run).",
        group=EVAL,
        min=0,
        max=64,
    )
    primary: str = option(
        "", "The one comparison declared before the sweep, as LABEL:SPLIT (e.g. advantage+sync10:4/4); the "
        "tables mark it.", group=SWEEP,
    )  # fmt: skip
    reference_splits: tuple[str, ...] = option(
        (), "No-sharing splits with more local groups (e.g. 16/0: twice the local data), shown for reference and "
        "marked as not equal compute.", group=SWEEP, csv=True,
    )  # fmt: skip
    diagnose_groups: bool = node_option(
        "diagnose_groups", True, "on in a sweep (off in a node's default): its tables read them"
    )
    tasks: tuple[str, ...] = option((), "Task families (empty: all built-in families).", group=SWEEP, csv=True)
    models: tuple[str, ...] = option(
        (), "Models assigned round-robin to nodes (empty: swarm-node local's mix).", group=SWEEP, csv=True
    )
    num_generations: int = node_option("num_generations")
    learning_rate: float | None = node_option("learning_rate")
    lr_scheduler_type: str = node_option("lr_scheduler_type")
    lr_decay_rounds: int = node_option("lr_decay_rounds")
    min_lr_rate: float = node_option("min_lr_rate")
    max_new_tokens: int = node_option("max_new_tokens")
    round_timeout: float = option(
        300.0, "Fail a run if no node progresses this long (s; a node's `local` gives up after 120 s, a sweep's "
        "swarms start beside a finishing one).", group=SWEEP, above=0,
    )  # fmt: skip
    min_generate_s: float = node_option("min_generate_s")
    # a real LM's sweep (e.g. --models smollm2-135m --adapter lora --gradient-checkpointing --micro-batch 2)
    adapter: str = node_option("adapter")
    lora_rank: int = node_option("lora_rank")
    gradient_checkpointing: bool = node_option("gradient_checkpointing")
    micro_batch_size: int = node_option("micro_batch_size")
    device: str = node_option("device")
    eval_timeout_s: float = node_option("eval_timeout_s")
    checkpoint_every: int = node_option(
        "checkpoint_every",
        10,
        "10 in a sweep (a node's default is 50): a stopped run goes on from its nodes' checkpoints",
    )
    out: str = option(
        "runs/experiment", "Results folder; the same command resumes in it (finished runs are kept, a stopped one "
        "goes on from its nodes' checkpoints).", group=SWEEP,
    )  # fmt: skip
    progress: bool = option(True, "Show a progress display.", group=SWEEP)
    report_to: str = node_option(
        "report_to", note="every node of every run logs its own (tensorboard --logdir on the results folder shows all)"
    )

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
        problem = first_option_error(self, option_fields(type(self))) or report_to_problem(self.report_to)
        if problem:
            raise ValueError(problem)
        checks = [
            (bool(self.splits), "splits is empty; give at least one, e.g. 8/0,4/4"),
            (bool(self.sampling), "sampling is empty; use uniform, advantage or both"),
            (bool(self.sync_every) and min(self.sync_every) >= 0, "sync_every needs values >= 0, e.g. 0,10"),
            (len(set(self.sync_every)) == len(self.sync_every), "sync_every has duplicates; e.g. 0,10"),
            (
                not self.sync_period_s or sum(h > 0 for h in self.sync_every) == 1,
                f"sync_period_s={self.sync_period_s} sets when every synced run syncs, so sync_every needs exactly "
                "one value above 0 to mark them, e.g. 0,1",
            ),
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


def config_file_keys() -> dict[str, FileKey]:
    """The keys an experiment's config file takes: each field's name, and a node option's flag spelling too
    (``generations`` for ``num_generations``, as in a node's config file)."""
    hints = option_types(ExperimentConfig)
    keys: dict[str, FileKey] = {}
    for f in option_fields(ExperimentConfig):
        meta = f.metadata
        key = field_file_key(f.name, hints[f.name], csv=meta["csv"], choices=tuple(meta["choices"]))
        keys[f.name] = key
        if meta["flag"]:
            keys[meta["flag"][2:].replace("-", "_")] = key
    return keys


def load_config_file(path: Path) -> dict[str, Any]:
    """Fields from a TOML (JSON where the name ends in ``.json``) file; an unknown key or a value of the wrong
    kind is an :class:`~node.core.optionfile.OptionFileError` (a ValueError)."""
    hint = "write one whose keys are the fields of ExperimentConfig (the flags of swarm-node experiment --help)"
    return load_option_file(path, config_file_keys(), missing_hint=hint)
