"""The ``swarm-node`` command: start a swarm, join one, or run a whole swarm locally.

Bad input gets one plain sentence naming the fix (exit status 2), never a
traceback; ``-v`` shows details.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from node.cli.errors import EXIT_USAGE, CliError


def _add_common(p: argparse.ArgumentParser) -> None:
    """The flags of every node command (start, join, local); each is also a key of the config file."""
    p.add_argument("--config", default=None, help="TOML config file (swarm-node init writes one); flags override it")
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
    c = p.add_argument_group("checkpoints")
    c.add_argument(
        "--checkpoint-every", type=int, default=50, help="rounds between checkpoints (also written on leave); 0: off"
    )
    c.add_argument("--resume", action="store_true", help="continue from the latest intact checkpoint in the log dir")
    d = p.add_argument_group("dashboard")
    d.add_argument("--dashboard-port", type=int, default=None, help="serve the live dashboard on this port (0: any)")
    d.add_argument("--dashboard-host", default="127.0.0.1", help="dashboard bind address (0.0.0.0: your network)")
    n = p.add_argument_group("network")
    n.add_argument("--identity", default="~/.swarm-node/identity.key", help="Ed25519 key file (created if missing)")
    n.add_argument("--host-port", default=None, help="listen address as PORT or HOST:PORT (default 0.0.0.0:0)")
    n.add_argument("--announce", action="append", default=[], help="multiaddr to announce (repeatable)")
    n.add_argument("--client-mode", action="store_true", help="accept no incoming connections (behind NAT)")
    n.add_argument("--no-relay", action="store_true", help="do not use libp2p circuit relays to reach peers")
    n.add_argument("--auto-relay", action="store_true", help="find a relay to be reachable through (behind NAT)")
    n.add_argument("--bootstrap-attempts", type=int, default=4, help="tries to reach --peer (backoff 1 s, doubling)")
    n.add_argument("--swarm-id", default="swarm-node", help="swarm name; keys are namespaced by it")
    p.add_argument("--ready-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--go-file", default=None, help=argparse.SUPPRESS)


def _add_tools(sub: Any) -> None:
    """``init`` (write a config file) and ``id`` (show this machine's peer id)."""
    init = sub.add_parser("init", help="write a commented default config file")
    init.add_argument("path", nargs="?", default="swarm-node.toml", help="where to write it (default swarm-node.toml)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    ident = sub.add_parser("id", help="print this node's peer id and the addresses it would listen on")
    ident.add_argument("--identity", default="~/.swarm-node/identity.key", help="Ed25519 key file (created if missing)")
    ident.add_argument("--host-port", default=None, help="PORT or HOST:PORT the node would listen on")
    ident.add_argument("--config", default=None, help="read identity and host-port from this config file")


def build_parser() -> argparse.ArgumentParser:
    """The ``swarm-node`` parser; a new command is one ``sub.add_parser`` plus an entry in :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="swarm-node", description="Decentralized RL post-training: share rollouts, train together."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = sub.add_parser("start", help="start a new swarm as its first node")
    _add_common(start)
    join = sub.add_parser("join", help="join a swarm through one or more known peers")
    join.add_argument("--peer", action="append", default=[], help="multiaddr of a peer (repeatable; required)")
    _add_common(join)
    local = sub.add_parser("local", help="run N nodes on this machine (127.0.0.1) with one dashboard")
    local.add_argument("--nodes", type=int, default=4, help="number of node processes")
    _add_common(local)
    local.set_defaults(rounds=20, log_dir="runs/local", dashboard_port=8765)
    local.add_argument(
        "--isolated", type=int, default=0, help="run the last K nodes with --external 0 (side-by-side baseline)"
    )
    local.add_argument("--models", default="", help="comma-separated models assigned round-robin to nodes")
    local.add_argument("--round-timeout", type=float, default=120.0, help="give up if no node progresses this long")
    local.add_argument("--no-dashboard", action="store_true", help="do not serve the swarm dashboard")
    _add_tools(sub)
    from node.cli.experiment import add_experiment_parser

    add_experiment_parser(sub)
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


# command -> "module:function" taking the parsed args and returning the exit status (imported lazily)
COMMANDS = {
    "start": "node.cli.serve:run_node",
    "join": "node.cli.serve:run_node",
    "local": "node.cli.local:run_local",
    "init": "node.cli.tools:run_init",
    "id": "node.cli.tools:run_id",
    "experiment": "node.cli.experiment:run_experiment_cli",
}


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse; with ``--config`` the file's values become defaults and flags are parsed again over them."""
    args = parser.parse_args(argv)
    if getattr(args, "config", None) and args.command in ("start", "join", "local", "id"):
        from node.cli.configfile import apply_config_file

        lists = apply_config_file(parser, args.command, args.config)
        args = parser.parse_args(argv)
        for dest, value in lists.items():  # a repeatable flag given on the command line replaces the file's list
            if not getattr(args, dest):
                setattr(args, dest, value)
    if args.command == "join" and not args.peer:
        raise CliError("join needs at least one --peer MULTIADDR (or peer = [...] in the config file)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``swarm-node``; returns the exit status."""
    parser = build_parser()
    try:
        args = _parse(parser, argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        from node.observe.logs import configure_logging

        configure_logging(getattr(args, "verbose", 0))
        module, func = COMMANDS[args.command].split(":")
        return int(getattr(importlib.import_module(module), func)(args))
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
    out += ["--outer-lr", str(args.outer_lr), "--checkpoint-every", str(args.checkpoint_every)]
    out += ["--sampling", args.sampling, "--device", args.device, "--swarm-id", args.swarm_id]
    out += ["--resume"] if args.resume else []
    for t in args.task:
        out += ["--task", t]
    out += ["-v"] * args.verbose
    return out
