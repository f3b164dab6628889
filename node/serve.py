"""Running one node from the command line: ``swarm-node start`` and ``swarm-node join``."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from node.cli import CliError, install_stop_handlers, parse_host_port
from node.config import NodeConfig
from node.grpo import GRPOConfig
from node.models import BUILTIN_MODELS
from node.policy import GenerationConfig
from node.runner import Node, NodeParts
from swarm.errors import SwarmError
from swarm.identity import IdentityError
from swarm.membership import MembershipConfig, parse_peer_multiaddr
from swarm.sync import OuterSyncConfig

logger = logging.getLogger(__name__)


def build_node(args: Any) -> Node:
    """Turn parsed flags into a :class:`Node`; bad values become one-sentence CliErrors."""
    peers = tuple(getattr(args, "peer", None) or ())
    try:
        for p in peers:
            parse_peer_multiaddr(p)
        host, port = parse_host_port(args.host_port, "0.0.0.0")
        cfg = NodeConfig(
            model=args.model,
            tasks=tuple(args.task),
            seed=args.seed,
            rounds=args.rounds,
            local_groups=args.local_groups,
            external_groups=args.external_groups,
            num_generations=args.generations,
            sampling=args.sampling,
            log_dir=args.log_dir,
            device=args.device,
            max_threads=args.max_threads,
            identity=args.identity,
        )
        max_new = args.max_new_tokens or (1 if args.model in BUILTIN_MODELS else 64)
        grpo = GRPOConfig() if args.lr is None else GRPOConfig(learning_rate=args.lr)
        parts = NodeParts(
            generation=GenerationConfig(temperature=args.temperature, max_new_tokens=max_new),
            grpo=grpo,
            sync=_sync_config(args),
            membership=MembershipConfig(
                swarm_id=args.swarm_id,
                host=host,
                port=port,
                announce=tuple(args.announce),
                initial_peers=peers,
                client_mode=args.client_mode,
            ),
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    return Node(cfg, parts)


def _sync_config(args: Any) -> OuterSyncConfig | None:
    if args.sync_every < 0:
        raise ValueError(f"--sync-every {args.sync_every}: use 0 (off) or a positive number of rounds")
    if args.sync_every == 0:
        return None
    return OuterSyncConfig(sync_every=args.sync_every, compression=args.sync_compression, outer_lr=args.outer_lr)


def _join_hint(addrs: list[str]) -> str:
    # Prefer an address others can reach: non-loopback first.
    best = sorted(addrs, key=lambda a: ("/127." in a or "/::1/" in a, a))
    return f"swarm-node join --peer {best[0]}" if best else "(no listen address)"


def _announce(node: Node, ready_file: str | None) -> None:
    assert node.membership is not None
    addrs = node.membership.visible_multiaddrs()
    if ready_file:
        tmp = Path(ready_file).with_suffix(".tmp")
        tmp.write_text(json.dumps({"peer": node.peer_id, "multiaddrs": addrs, "pid": os.getpid()}))
        tmp.replace(ready_file)  # atomic: readers never see half a file
    print(f"swarm-node: peer {node.peer_id} is up; listening on:", flush=True)
    for a in addrs:
        print(f"  {a}", flush=True)
    print(f"Others can join with:\n  {_join_hint(addrs)}", flush=True)


GO_TIMEOUT_S = 120.0


def _wait_for_go(path: Path, node: Node) -> None:
    """``local`` releases all nodes at once; a lost signal only delays us by the bound."""
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not path.exists() and time.monotonic() < deadline and not node.stop_event.is_set():
        node.stop_event.wait(0.05)


def run_node(args: Any) -> int:
    """Start (or join), run the configured rounds, then leave cleanly."""
    node = build_node(args)
    install_stop_handlers(node.stop_event)
    try:
        node.start()
    except (SwarmError, IdentityError, ValueError, LookupError) as e:
        node.shutdown()
        raise CliError(str(e)) from None
    try:
        _announce(node, args.ready_file)
        if args.go_file:
            _wait_for_go(Path(args.go_file), node)
        node.run()
        if args.hold and node.metrics is not None:
            node.metrics.write("done", time=node.clock(), peer=node.peer_id, round=node.round)
            node.stop_event.wait()  # keep serving rollouts until told to stop
    finally:
        node.shutdown()
    print(f"swarm-node: {node.peer_id[-6:]} left after {node.round} rounds", file=sys.stderr)
    return 0
