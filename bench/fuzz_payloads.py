"""Fuzz targets for what a payload goes through: the stream that carries it, and re-verification of its groups.

Streams are fed to an in-memory ``asyncio.StreamReader`` in pieces, then EOF;
what ``serve_one`` answers must read back through the real client.
Rollout groups are genuine ones with a wrong seed, config, family, prompt,
rewards or hostile completions, sent through the schema check as ingest does.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from bench.fuzz_corpus import Corpus, Target, UnexpectedResult, node_acceptance, read_response, verify_group
from bench.fuzz_mutate import encode, mutate_bytes, mutate_tree, render_bytes
from node.tasks.registry import build_task, task_names
from node.tasks.verify import Verdict
from protocol import codec, limits
from protocol.messages import payload_digest
from protocol.schema import RolloutGroup, config_digest
from swarm.payload_stream import HEADER, MAGIC, MAX_ERROR_BYTES, STATUS_OK, FetchError, error_frame, serve_one

T = TypeVar("T")

STREAM_STALL_S = 2.0
"""Real-time bound on one stream case; its bytes and EOF are all fed, so waiting at all is a bug."""


# ---- payload streams ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamCase:
    """Bytes a peer sends on one stream (fed in pieces, then EOF), and the reader's parameters."""

    data: bytes
    cuts: tuple[int, ...]
    expected_size: int = 0
    chunk_bytes: int = 4096

    def __str__(self) -> str:
        return f"expected_size={self.expected_size} chunk={self.chunk_bytes} cuts={self.cuts} {render_bytes(self.data)}"


class MemoryWriter:
    """The writer half of a stream, in memory: what ``serve_one`` answers is kept for checking."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        self.data += data

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self.closed = True


def _cuts(rng: random.Random, data: bytes) -> tuple[int, ...]:
    return tuple(sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(4))))


async def _fed(case: StreamCase, read: Callable[[asyncio.StreamReader], Awaitable[T]]) -> T:
    """Run ``read`` on a stream fed ``case.data`` piece by piece, then EOF, within STREAM_STALL_S."""
    reader = asyncio.StreamReader()

    async def feed() -> None:
        start = 0
        for end in (*case.cuts, len(case.data)):
            reader.feed_data(case.data[start:end])
            start = end
            await asyncio.sleep(0)  # let the reader see a partial frame
        reader.feed_eof()

    feeder = asyncio.create_task(feed())
    try:
        return await asyncio.wait_for(read(reader), STREAM_STALL_S)
    except TimeoutError:
        raise UnexpectedResult(f"stalled for {STREAM_STALL_S}s on a stream that had ended") from None
    finally:
        feeder.cancel()


def _response_case(rng: random.Random, payloads: Sequence[bytes]) -> StreamCase:
    payload = rng.choice(payloads)
    size = len(payload)
    pick = rng.random()
    if pick < 0.4:  # lying header fields
        magic = rng.choice((MAGIC, MAGIC, b"SNP2", b"\0" * 4))
        status = rng.choice((STATUS_OK, STATUS_OK, 1, 2, 255))
        length = rng.choice((0, 1, size - 1, size, size + 1, MAX_ERROR_BYTES + 1, limits.MAX_PAYLOAD_BYTES, 2**32 - 1))
        data = HEADER.pack(magic, status, max(length, 0)) + payload[: rng.randrange(size + 1)]
    elif pick < 0.8:
        genuine = HEADER.pack(MAGIC, STATUS_OK, size) + payload if rng.random() < 0.8 else error_frame("no such digest")
        data = mutate_bytes(rng, genuine, payloads)
    elif pick < 0.9:  # endless: far more than announced
        data = HEADER.pack(MAGIC, STATUS_OK, size) + payload + rng.randbytes(rng.choice((1, 4096, 1 << 20)))
    else:
        data = HEADER.pack(MAGIC, STATUS_OK, size) + payload
    expected = size if rng.random() < 0.85 else rng.choice((0, 1, size - 1, size + 1, limits.MAX_PAYLOAD_BYTES))
    return StreamCase(data, _cuts(rng, data), max(expected, 0), rng.choice((4096, 65_536, 262_144)))


def stream_targets(corpus: Corpus) -> list[Target[Any]]:
    """The client side (``_read_response``) and the server side (``serve_one``) of the payload stream."""
    payloads = (*corpus.batches, random.Random(1).randbytes(300_000))
    served = {payload_digest(p): p for p in payloads}

    def check_response(case: StreamCase) -> bool:
        got = asyncio.run(_fed(case, lambda r: read_response(r, case.expected_size, case.chunk_bytes)))
        if got != case.data[HEADER.size : HEADER.size + case.expected_size] or len(got) != case.expected_size:
            raise UnexpectedResult(f"returned {len(got)} bytes that are not the announced body")
        return True

    def make_request(rng: random.Random) -> StreamCase:
        digest = rng.choice((*served, payload_digest(b"gone"))).encode()
        data = mutate_bytes(rng, digest, [digest]) if rng.random() < 0.6 else digest
        return StreamCase(data, _cuts(rng, data), chunk_bytes=rng.choice((4096, 65_536, 262_144)))

    async def serve_and_check(case: StreamCase) -> bool:
        writer = MemoryWriter()
        as_stream = cast(asyncio.StreamWriter, writer)
        sent = await _fed(case, lambda r: serve_one(r, as_stream, served.get, case.chunk_bytes))
        return await _check_answer(bytes(writer.data), sent, served.get(case.data[:64].decode("latin-1")))

    return [
        Target(
            "payload_stream._read_response",
            lambda r: _response_case(r, payloads),
            check_response,
            str,
            handled=(FetchError, asyncio.IncompleteReadError),
        ),
        Target(
            "payload_stream.serve_one",
            make_request,
            lambda c: asyncio.run(serve_and_check(c)),
            str,
            handled=(asyncio.IncompleteReadError,),
        ),
    ]


async def _check_answer(answer: bytes, sent: int, payload: bytes | None) -> bool:
    """What ``serve_one`` wrote must read back, through the real client, as the payload or a peer error."""
    case = StreamCase(answer, ())
    if payload is not None:
        got = await _fed(case, lambda r: read_response(r, len(payload), 65_536))
        if got != payload or sent != len(payload):
            raise UnexpectedResult(f"served {sent} bytes that do not read back as the payload")
        return True
    try:
        await _fed(case, lambda r: read_response(r, 1, 65_536))
    except FetchError as e:
        if sent == 0 and e.reason.startswith("peer error"):
            return False
        raise UnexpectedResult(f"error answer reads back as {e.reason!r}") from None
    raise UnexpectedResult("an unknown digest was answered with a payload")


# ---- re-verification of rollout groups ------------------------------------------------------------

_ATTACK_TEXTS = ("<answer>", "\\boxed{", "answer: ", "the answer is ", "=", "\n", "<answer>9</answer>", "9", "é ", " ")


def _attack_completions(rng: random.Random, max_chars: int) -> list[str]:
    unit = rng.choice(_ATTACK_TEXTS)
    chars = min(max_chars, rng.choice((limits.MAX_TEXT_CHARS, limits.MAX_TEXT_CHARS // 2, 5000, 1000, 256, 64)))
    text = (unit * (chars // len(unit) + 1))[:chars]
    return [text] * rng.choice((1, 3, limits.MAX_COMPLETIONS))


def _mutate_config(rng: random.Random, config: dict[str, Any]) -> None:
    key = rng.choice(list(config)) if config else "digits"
    pick = rng.random()
    if pick < 0.15:
        config.pop(key, None)
    elif pick < 0.3:
        config[rng.choice(("extra", "path", "size"))] = rng.choice((1, "/etc/passwd", 2**62))
    else:
        value = config.get(key, 0)
        config[key] = rng.choice((value + 1, value - 1, -1, 0, 2**31, 2**63 - 1, str(value), float(value), True))


def mutate_group(rng: random.Random, wire: dict[str, Any], groups: Sequence[dict[str, Any]], max_chars: int) -> Any:
    """A genuine group with a wrong seed, config, family, prompt, rewards or hostile completions."""
    g = copy.deepcopy(wire)
    task, op = g["task"], rng.randrange(7) if max_chars <= 256 else 4
    if op == 0:
        task[rng.choice(("seed", "index"))] = rng.choice((0, 2**63 - 1, 2**63, rng.randrange(2**63)))
    elif op == 1:
        _mutate_config(rng, task["config"])
    elif op == 2:  # another family, with its own valid config so that the item is generated
        task["family"] = rng.choice((*task_names(), "rg:unknown", "rg:", "max "))
        task["config"] = build_task(task["family"]).config if task["family"] in task_names() else task["config"]
    elif op == 3:
        g["prompt"] = rng.choice((g["prompt"] + " ", g["prompt"][:-1], "", rng.choice(groups)["prompt"]))
    elif op == 4:
        g["completions"] = _attack_completions(rng, max_chars)
        g["rewards"] = [rng.choice((0.0, 1.0))] * len(g["completions"])
    elif op == 5:
        g["rewards"] = rng.choice((g["rewards"][:-1], [1.0] * len(g["rewards"]), [1e308] * len(g["rewards"])))
    else:
        return mutate_tree(rng, g)
    if rng.random() < 0.85:  # a peer recomputes the digest of whatever config it sends
        task["config_digest"] = config_digest(task["config"])
    return g


def verify_targets(corpus: Corpus) -> list[Target[Any]]:
    """verify_external under a node's acceptance policy, on groups that pass the schema check as ingest gets them.

    ``[long]`` sends completions of 64 to MAX_TEXT_CHARS characters made of one
    repeated unit (``<answer>``, ``\\boxed{``, ...), the worst case for answer extraction.
    """

    accept = node_acceptance()

    def make(max_chars: int) -> Callable[[random.Random], bytes]:
        return lambda rng: encode(mutate_group(rng, rng.choice(corpus.groups), corpus.groups, max_chars))

    def verify(data: bytes) -> bool:
        verdict = verify_group(RolloutGroup.from_wire(codec.unpack(data, limits.MAX_PAYLOAD_BYTES)), accept)
        if not isinstance(verdict, Verdict):
            raise UnexpectedResult(f"verify_external returned {type(verdict).__name__}")
        return verdict.ok

    return [
        Target("tasks.verify_external", make(256), verify),
        Target("tasks.verify_external[long]", make(limits.MAX_TEXT_CHARS), verify),
    ]
