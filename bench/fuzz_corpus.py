"""What the protocol fuzzer works on: the :class:`Target` shape, the genuine corpus, and adapters.

A target makes one case from a seeded ``random.Random`` (a pure function of
the rng, so any case can be replayed), runs it, and says whether it was
accepted (True: a valid object) or refused by a returned refusal (False).
Raising one of ``handled`` is a refusal too. A target raises
:class:`UnexpectedResult` when a value breaks its contract; the harness
(:mod:`bench.fuzz_protocol`) counts that and anything else it raises as a crash.

The adapters are the single call site of each fuzzed API whose signature is
still changing, so a change there is a one-line fix here.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from bench.fuzz_mutate import KEY, OTHER, render_bytes
from node.core.config import NodeParts
from node.core.ingest import IngestConfig
from node.core.links import swarm_validator
from node.tasks.acceptance import Acceptance
from node.tasks.heldout import training_item
from node.tasks.registry import build_task, task_names
from node.tasks.verify import Verdict, verify_external
from protocol.errors import MessageRejected
from protocol.messages import payload_digest, seal_batch, seal_descriptor
from protocol.schema import Descriptor, RolloutBatch, RolloutGroup
from swarm.exchange import Refusal, select_descriptors, window_key
from swarm.payload_stream import DEFAULT_PACE, _read_response
from swarm.reputation import Reputation
from swarm.sync.records import JOIN_KIND, STATE_KIND, VOTE_KIND, JoinRecord, StateRecord, VoteRecord, seal_record
from swarm.validation import SignedRecordValidator, dht_key, sync_record_keys

T = TypeVar("T")

NOW = 1_700_000_100.0
"""The fake clock of every time-dependent target."""
FP = "0123456789abcdef"
SYNC_PARSERS: dict[str, Callable[[Any], Any]] = {
    JOIN_KIND: JoinRecord.from_wire,
    VOTE_KIND: VoteRecord.from_wire,
    STATE_KIND: StateRecord.from_wire,
}


class UnexpectedResult(Exception):
    """A target returned what its contract rules out (a non-bool from a validator, a wrong payload)."""


@dataclass(frozen=True)
class Target(Generic[T]):
    """One parser under attack: ``make`` a case from an rng, ``run`` it (True: accepted), ``render`` it."""

    name: str
    make: Callable[[random.Random], T]
    run: Callable[[T], bool]
    render: Callable[[T], str] = field(default=lambda case: render_bytes(cast(bytes, case)))
    handled: tuple[type[BaseException], ...] = (MessageRejected,)
    share: float = 1.0
    """Relative share of the message count and of the time budget."""


# ---- adapters: the one call site of each API that is still changing --------------------------------

_PARTS = NodeParts()
"""A node's component configs at their defaults: its swarm id, window width and sync lifetimes."""
SWARM_ID, WINDOW_S = _PARTS.membership.swarm_id, _PARTS.exchange.window_s


def node_acceptance() -> Acceptance:
    """What a node takes from peers (``Node._acceptance``), for a node that trains on every family.

    The budget is SmolLM2-135M's: 32 new tokens plus the default slack of 2, a byte-level BPE
    whose longest token is 81 characters, a 2048-token context. Tokens are estimated at one per
    four UTF-8 bytes (no tokenizer here: that would need torch and a model download).
    """
    families = {name: build_task(name) for name in task_names()}
    budget = 32 + IngestConfig().completion_slack_tokens
    return Acceptance(families, budget, 81, 2048, _estimated_tokens, _estimated_tokens)


def _estimated_tokens(text: str) -> int:
    return len(text.encode()) // 4 + 1


def verify_group(group: RolloutGroup, accept: Acceptance) -> Verdict:
    """verify_external as ingest calls it (``may_build`` left to its default: the build budget is ingest's)."""
    return verify_external(group, accept, "fuzz")


def node_validator() -> SignedRecordValidator:
    """The DHT validator a node with default settings registers."""
    return swarm_validator(_PARTS)


def record_keys(record: Any) -> tuple[bytes, ...]:
    """The DHT keys (as hivemind hashes them) that a genuine record may be stored under."""
    if isinstance(record, Descriptor):
        return (dht_key(window_key(SWARM_ID, record.created, WINDOW_S)),)
    return tuple(dht_key(k) for k in sync_record_keys(SWARM_ID, record))


def read_response(reader: asyncio.StreamReader, expected_size: int, chunk_bytes: int) -> Awaitable[bytes]:
    """payload_stream._read_response as fetch_one calls it (default pace)."""
    return _read_response(reader, expected_size, chunk_bytes, DEFAULT_PACE)


def select(entries: list[tuple[Any, Any]], limit: int) -> tuple[list[Descriptor], list[tuple[str, Refusal]]]:
    """exchange.select_descriptors as collect calls it, with no history: (chosen, rejected)."""
    found = select_descriptors(
        entries, own=OTHER.peer_id, now=NOW, since=0.0, fetched=set(), limit=limit, rng=random.Random(0),
        reputation=Reputation(),
    )  # fmt: skip
    return found.chosen, found.rejected


# ---- the genuine corpus ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """Genuine sealed messages signed by ``KEY``, and genuine rollout groups as wire maps."""

    descriptors: tuple[bytes, ...]
    batches: tuple[bytes, ...]
    records: tuple[bytes, ...]
    groups: tuple[dict[str, Any], ...]

    @property
    def sealed(self) -> tuple[bytes, ...]:
        return self.descriptors + self.batches + self.records


def _group(name: str, index: int, text_chars: int) -> RolloutGroup:
    fam = build_task(name)
    item = training_item(fam, 7, index)
    comps = (item.answer, "x" * text_chars, f"<answer>{item.answer}</answer>")
    return RolloutGroup(item.ref, item.prompt, comps, tuple(fam.score(item, c) for c in comps), "tiny-s")


def build_corpus() -> Corpus:
    """Deterministic genuine messages: every task family, every sealed kind (a few hundred ms)."""
    groups = tuple(_group(name, i, 16) for i, name in enumerate(task_names()))
    big = tuple(_group("max", i, 600) for i in range(8))
    batches = tuple(seal_batch(RolloutBatch(KEY.peer_id, 3, NOW - 5, gs), KEY) for gs in (groups[:2], groups[4:8], big))
    descriptors = tuple(
        seal_descriptor(Descriptor(KEY.peer_id, 3, payload_digest(p), len(p), fams, NOW - 10, NOW + 290), KEY)
        for p, fams in ((batches[0], ("max", "min")), (batches[2], tuple(f"rg:f{i}" for i in range(32))))
    )
    state = "ab" * 32
    records = (
        seal_record(JOIN_KIND, JoinRecord(KEY.peer_id, FP, 3, state, NOW - 20, NOW - 19), KEY),
        seal_record(VOTE_KIND, VoteRecord(KEY.peer_id, FP, 3, "cd" * 16, "ef" * 32, NOW - 2), KEY),
        seal_record(VOTE_KIND, VoteRecord(KEY.peer_id, FP, 3, "cd" * 16, "abort", NOW - 2), KEY),
        seal_record(STATE_KIND, StateRecord(KEY.peer_id, FP, 3, state, NOW - 60), KEY),
    )
    return Corpus(descriptors, batches, records, tuple(g.to_wire() for g in groups))
