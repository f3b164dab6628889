"""Task families from reasoning-gym (pinned 0.1.25), addressed by reference.

Each family is registered as ``rg:<dataset>`` (the prefix keeps them apart
from the tiny built-in families). An item is regenerated from its
:class:`protocol.TaskRef` exactly as reasoning-gym defines it::

    create_dataset(dataset, seed=ref.seed, size=2**63 - 1, **fixed, **ref.config)[ref.index]

so any node with the same reasoning-gym version re-derives the question and
its gold answer. The config is a few bounded integers per family (defaults
chosen so that a 135M instruct model sometimes succeeds: two 1-digit terms for
``basic_arithmetic`` and ``chain_sum``, where SmolLM2-135M's success per
completion is 0.17 and 0.06 against 0.05 and 0.03 one level harder, measured
with bench/bench_signal.py); options that are not
integers are fixed per family and not configurable, which also keeps a peer
from pointing reasoning-gym at arbitrary files or huge sizes.

The prompt is the reasoning-gym question followed by :data:`INSTRUCTION`.
Scoring extracts the answer from the completion (``<answer>`` tag,
``\\boxed{}``, ``Answer: x`` or the final non-empty line; see
:mod:`node.tasks.answers`) and compares it exactly with the gold answer: 1.0 or 0.0,
no partial credit (reasoning-gym's own ``score_answer`` gives partial credit
for some families and raises on malformed input for others).

=====================  ==========================================  =============
family                 example question (default config)           gold answer
=====================  ==========================================  =============
rg:basic_arithmetic    Calculate 5 - 9.                            -4
rg:chain_sum           ... arithmetic problem: 4 + 3 =             7
rg:leg_counting        ... if you have 2 cows, 1 spider?           16
rg:gcd                 GCD of these numbers: 12, 18 ...            6
rg:lcm                 LCM of these numbers: 4, 6                  12
rg:count_bits          How many 1 bits ... the number 13?          3
rg:letter_counting     How many times does the letter "e" ...      2
rg:products            Solve the following multiplication: 7 * 8.  56
rg:spell_backward      Spell this word backward ...: cat           tac
=====================  ==========================================  =============
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar

from node.tasks.answers import exact_match
from node.tasks.base import MAX_U63, BadTaskConfig, TaskFamily, TaskItem
from protocol.schema import Scalar, TaskRef

logger = logging.getLogger(__name__)

RG_PREFIX = "rg:"
INSTRUCTION = "\n\nGive only the final answer, in the form <answer>...</answer>."
"""Appended to every reasoning-gym question: asks for the tag format that extraction reads first."""

_SIZE = 2**63 - 1  # reasoning-gym items depend on (seed + index) only; size is just the dataset's length

# dataset -> (configurable integer params: key -> (default, min, max), fixed options)
RG_SPECS: dict[str, tuple[dict[str, tuple[int, int, int]], dict[str, Any]]] = {
    "basic_arithmetic": (
        {"min_terms": (2, 2, 6), "max_terms": (2, 2, 6), "min_digits": (1, 1, 4), "max_digits": (1, 1, 4)},
        {"operators": ("+", "-"), "allow_parentheses": False, "allow_negation": False},
    ),
    "chain_sum": (
        {"min_terms": (2, 2, 6), "max_terms": (2, 2, 6), "min_digits": (1, 1, 4), "max_digits": (1, 1, 4)},
        {},
    ),
    "leg_counting": (
        {
            "min_animals": (1, 1, 10),
            "max_animals": (2, 1, 10),
            "min_instances": (1, 1, 15),
            "max_instances": (3, 1, 15),
        },
        {},
    ),
    "gcd": ({"min_value": (1, 1, 10_000), "max_value": (50, 1, 10_000)}, {"min_numbers": 2, "max_numbers": 2}),
    "lcm": ({"min_value": (1, 1, 1_000), "max_value": (12, 1, 1_000)}, {"min_numbers": 2, "max_numbers": 2}),
    "count_bits": ({"min_n": (1, 1, 2**31 - 1), "max_n": (255, 1, 2**31 - 1)}, {}),
    "letter_counting": ({"min_words": (3, 1, 30), "max_words": (6, 1, 30)}, {}),
    "products": (
        {"min_terms": (2, 2, 4), "max_terms": (2, 2, 4), "min_digits": (1, 1, 5), "max_digits": (1, 1, 5)},
        {},
    ),
    "spell_backward": ({"min_word_len": (3, 3, 10), "max_word_len": (5, 3, 10)}, {}),
}
"""The reasoning-gym datasets this node can generate and verify (all with a single exact answer)."""

RG_TASK_NAMES: tuple[str, ...] = tuple(RG_PREFIX + name for name in RG_SPECS)
"""Registered family names (``rg:<dataset>``)."""


class ReasoningGymFamily(TaskFamily):
    """One reasoning-gym dataset as a task family (see the module docstring)."""

    dataset: ClassVar[str] = ""
    fixed: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Mapping[str, Scalar] | None = None) -> None:
        super().__init__(config)
        try:
            _dataset(self.dataset, tuple(sorted(self.config.items())), 0)  # reasoning-gym's own checks
        except (AssertionError, ValueError, TypeError) as e:
            raise BadTaskConfig(f"task {self.name!r}: reasoning-gym rejects config {self.config}: {e}") from None

    def needs_build(self, seed: int) -> bool:
        """True until the dataset of ``seed`` is in the cache (building one can cost 100 ms, see :data:`_DATASETS`)."""
        return (self.dataset, tuple(sorted(self.config.items())), seed) not in _DATASETS

    def item(self, seed: int, index: int) -> TaskItem:
        """The reasoning-gym item at (seed, index), with :data:`INSTRUCTION` appended to its question."""
        if not (0 <= seed < MAX_U63 and 0 <= index < MAX_U63):
            raise ValueError("seed and index must be in [0, 2^63)")
        entry = _dataset(self.dataset, tuple(sorted(self.config.items())), seed)[index]
        ref = TaskRef.make(self.name, self.config, seed, index)
        return TaskItem(ref, str(entry["question"]).rstrip() + INSTRUCTION, str(entry["answer"]))

    def score(self, item: TaskItem, completion: str) -> float:
        """1.0 if the answer extracted from the completion equals the gold answer exactly, else 0.0."""
        return exact_match(completion, item.answer)


DatasetKey = tuple[str, tuple[tuple[str, Any], ...], int]
"""(dataset, sorted config items, seed)."""


class DatasetCache:
    """The last ``capacity`` reasoning-gym datasets built, least recently used evicted first.

    An explicit LRU rather than ``functools.lru_cache`` because ingest must ask
    whether a peer's seed is cached *before* paying for the build
    (:meth:`ReasoningGymFamily.needs_build`). Bounded so that memory stays
    flat however many seeds peers send; honest peers keep one seed per family,
    so their datasets stay recent while a stream of new seeds evicts itself.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}; a dataset cache needs room for at least 1 dataset")
        self.capacity = capacity
        self._built: OrderedDict[DatasetKey, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        return key in self._built

    def __len__(self) -> int:
        return len(self._built)

    def get(self, key: DatasetKey) -> Any:
        """The dataset of ``key``, built (and cached) on a miss."""
        with self._lock:
            if key in self._built:
                self._built.move_to_end(key)
                return self._built[key]
            dataset = _build(*key)
            self._built[key] = dataset
            if len(self._built) > self.capacity:
                self._built.popitem(last=False)
            return dataset


# Measured (reasoning-gym as pinned, one core of a shared 2-core VM): building a dataset takes < 0.1 ms
# for chain_sum, basic_arithmetic, gcd and leg_counting, ~2 ms for letter_counting and 16-100 ms for
# spell_backward (it reads a word list); the first build of a process also imports reasoning-gym
# (~2.9 s). Verifying a group once its dataset is cached takes ~30 us (a built-in family's ~20 us).
_DATASETS = DatasetCache(64)


def _build(name: str, config: tuple[tuple[str, Any], ...], seed: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=_SIZE, **RG_SPECS[name][1], **dict(config))


def _dataset(name: str, config: tuple[tuple[str, Any], ...], seed: int) -> Any:
    """A reasoning-gym dataset (cached: creation can read word lists; bounded so memory stays flat)."""
    return _DATASETS.get((name, config, seed))


@functools.cache
def rg_family_class(name: str) -> type[ReasoningGymFamily]:
    """The family class of ``rg:<dataset>``; KeyError if the dataset is not supported."""
    dataset = name.removeprefix(RG_PREFIX)
    if not name.startswith(RG_PREFIX) or dataset not in RG_SPECS:
        raise KeyError(name)
    params, fixed = RG_SPECS[dataset]
    attrs = {"name": name, "dataset": dataset, "params": params, "fixed": fixed, "__doc__": f"reasoning-gym {dataset}"}
    return type(f"RG_{dataset}", (ReasoningGymFamily,), attrs)
