"""The ``swarm-node`` command: start a swarm, join one, or run a whole swarm locally.

Bad input gets one plain sentence naming the fix (exit status 2), never a
traceback; ``-v`` shows details.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

EXIT_USAGE = 2


class CliError(Exception):
    """A problem with the user's input or environment, explained in one sentence."""


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("node")
    g.add_argument("--model", default="tiny-s", help="built-in model name or local HF model folder")
    g.add_argument("--task", action="append", default=[], help="task family (repeatable; default: all)")
    g.add_argument("--seed", type=int, default=0, help="seed for init, sampling and generation")
    g.add_argument("--rounds", type=int, default=0, help="rounds to run; 0 runs until stopped")
    g.add_argument("--local", type=int, default=4, dest="local_groups", help="I: local groups per round")
    g.add_argument("--external", type=int, default=4, dest="external_groups", help="J: external groups per round")
    g.add_argument("--generations", type=int, default=8, help="G: completions per question")
    g.add_argument(
        "--max-new-tokens", type=int, default=0, help="tokens per completion (0: 1 for built-in tiny models, else 64)"
    )
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: GRPOConfig's)")
    g.add_argument("--sampling", default="uniform", help="external group choice: uniform or advantage")
    g.add_argument("--log-dir", default="runs", help="metrics go to <log-dir>/<peer-short-id>/metrics.jsonl")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    g.add_argument("--max-threads", type=int, default=0, help="cap torch CPU threads (0: torch default)")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more log detail (-vv for debug)")
    y = p.add_argument_group("outer sync (DiLoCo, among peers of the same architecture)")
    y.add_argument("--sync-every", type=int, default=0, help="rounds between outer syncs (H); 0 turns sync off")
    y.add_argument("--sync-compression", default="none", help="none, fp16 or int8")
    y.add_argument("--outer-lr", type=float, default=0.7, help="outer Nesterov SGD learning rate")
    n = p.add_argument_group("network")
    n.add_argument("--identity", default="~/.swarm-node/identity.key", help="Ed25519 key file (created if missing)")
    n.add_argument("--host-port", default=None, help="listen address as PORT or HOST:PORT (default 0.0.0.0:0)")
    n.add_argument("--announce", action="append", default=[], help="multiaddr to announce (repeatable)")
    n.add_argument("--client-mode", action="store_true", help="accept no incoming connections (behind NAT)")
    n.add_argument("--swarm-id", default="swarm-node", help="swarm name; keys are namespaced by it")
    p.add_argument("--ready-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--go-file", default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm-node", description="Decentralized RL post-training: share rollouts, train together."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = sub.add_parser("start", help="start a new swarm as its first node")
    _add_common(start)
    join = sub.add_parser("join", help="join a swarm through one or more known peers")
    join.add_argument("--peer", action="append", required=True, help="multiaddr of a peer (repeatable)")
    _add_common(join)
    local = sub.add_parser("local", help="run N nodes on this machine (127.0.0.1) and summarise")
    local.add_argument("--nodes", type=int, default=4, help="number of node processes")
    _add_common(local)
    local.set_defaults(rounds=20, log_dir="runs/local")
    local.add_argument(
        "--isolated", type=int, default=0, help="run the last K nodes with --external 0 (side-by-side baseline)"
    )
    local.add_argument("--models", default="", help="comma-separated models assigned round-robin to nodes")
    local.add_argument("--round-timeout", type=float, default=120.0, help="give up if no node progresses this long")
    return parser


def parse_host_port(text: str | None, default_host: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` -> (host, port), with a one-sentence error."""
    if text is None:
        return default_host, 0
    host, _, port = text.rpartition(":")
    try:
        value = int(port)
    except ValueError:
        raise CliError(f"--host-port {text!r} is not PORT or HOST:PORT, e.g. --host-port 31337") from None
    if not 0 <= value <= 65535:
        raise CliError(f"--host-port {text!r}: the port must be 0-65535")
    return host or default_host, value


def configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose < 0 else (logging.INFO if verbose <= 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname).1s %(message)s", datefmt="%H:%M:%S")
    # hivemind is chatty at INFO; show its details only with -vv
    logging.getLogger("hivemind").setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)


def install_stop_handlers(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM stops after the current step; a second Ctrl-C exits at once."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            os._exit(130)
        stop.set()
        print("\nswarm-node: stopping after the current step (Ctrl-C again to exit now)", file=sys.stderr)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    configure_logging(args.verbose)
    try:
        if args.command == "local":
            from node.local import run_local

            return run_local(args)
        from node.serve import run_node

        return run_node(args)
    except CliError as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def node_args_to_list(args: Any) -> list[str]:
    """The common flags of ``args`` as a command line (used to spawn local nodes)."""
    out = ["--rounds", str(args.rounds), "--local", str(args.local_groups)]
    out += ["--external", str(args.external_groups), "--generations", str(args.generations)]
    out += ["--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature)]
    out += [] if args.lr is None else ["--lr", str(args.lr)]
    out += ["--sync-every", str(args.sync_every), "--sync-compression", args.sync_compression]
    out += ["--outer-lr", str(args.outer_lr)]
    out += ["--sampling", args.sampling, "--device", args.device, "--swarm-id", args.swarm_id]
    for t in args.task:
        out += ["--task", t]
    out += ["-v"] * args.verbose
    return out
