"""Which heavy libraries a node has imported when it joins the swarm, in a fresh process.

Builds the node as ``swarm-node start`` does (the CLI's parser and :func:`node.cli.serve.build_node`)
and starts it with a links factory that, instead of listening, records which of :data:`HEAVY` are
in ``sys.modules`` at that moment; the node then loads its model and starts as usual, alone. Prints
one JSON object: ``joining`` (the heavy modules imported before joining) and ``started`` (those
imported once it started: the model's own, which shows the probe sees imports at all).

    python -m tests.startup_probe tiny-m /tmp/probe   # from the repository root

Started by tests/node/test_startup.py; no side effects at import.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.core.config import NodeParts
    from swarm.identity import Identity

HEAVY = ("transformers", "peft", "accelerate", "gguf", "reasoning_gym", "aiohttp", "matplotlib")
"""Libraries a tiny-model node without a dashboard needs none of before it listens (seconds to import)."""


def imported() -> list[str]:
    """The modules of :data:`HEAVY` imported so far."""
    return [m for m in HEAVY if m in sys.modules]


def probe(model: str, folder: Path) -> dict[str, list[str]]:
    """Start a node of ``model`` (identity and logs in ``folder``) and say what it had imported when."""
    from node.cli.main import build_parser
    from node.cli.serve import build_node
    from node.core.node import Node
    from tests.fakes import Alone

    argv = ["start", "--model", model, "--rounds", "1", "--max-threads", "1"]
    argv += ["--identity", str(folder / "id.key"), "--log-dir", str(folder / "runs")]
    built = build_node(build_parser().parse_args(argv))
    seen: dict[str, list[str]] = {}

    def join(identity: Identity, parts: NodeParts, clock: Callable[[], float]) -> Alone:
        seen["joining"] = imported()
        return Alone()

    node = Node(built.cfg, built.parts, links=join)
    try:
        node.start()
    finally:
        node.shutdown()
    seen["started"] = imported()
    return seen


def main() -> None:
    model, folder = sys.argv[1], Path(sys.argv[2])
    print(json.dumps(probe(model, folder)), flush=True)


if __name__ == "__main__":
    main()
