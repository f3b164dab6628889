"""The ``swarm-node`` command: start a swarm, join one, or run a whole swarm locally.

Bad input gets one plain sentence naming the fix (exit status 2), never a
traceback; ``-v`` shows details.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from node.cli.errors import EXIT_USAGE, CliError
from node.cli.flags import add_option_flags
from node.cli.preflight import parse_host_port as parse_host_port  # re-exported: node.cli.tools, serve
from node.cli.preflight import preflight, start_warnings
from node.cli.signals import install_stop_handlers
from node.core.options import (
    JoinOptions,
    LocalOptions,
    NodeOptions,
    check_options,
    default_of,
    options_from,
    to_argv,
)
from node.training.names import model_name_error
from swarm.maddr import peer_address_problem


def _add_common(p: argparse.ArgumentParser, cls: type[NodeOptions]) -> None:
    """The flags of a node command, generated from ``cls``; each is also a key of the config file."""
    p.add_argument("--config", default=None, help="TOML config file (swarm-node init writes one); flags override it")
    add_option_flags(p, cls)


def _add_tools(sub: Any) -> None:
    """``init`` (write a config file) and ``id`` (show this machine's peer id)."""
    init = sub.add_parser("init", help="write a commented default config file")
    init.add_argument("path", nargs="?", default="swarm-node.toml", help="where to write it (default swarm-node.toml)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    ident = sub.add_parser("id", help="print this node's peer id and the addresses it would listen on")
    ident.add_argument("--identity", default=default_of(NodeOptions, "identity"), help="Ed25519 key file")
    ident.add_argument("--host-port", default=None, help="PORT or HOST:PORT the node would listen on")
    ident.add_argument("--config", default=None, help="read identity and host-port from this config file")


class Parser(argparse.ArgumentParser):
    """argparse with one-sentence errors: a mistyped value names the flag and where help is, without the
    25 lines of usage that would bury it (``--help`` still prints them).

    No flag may be abbreviated (``--round`` for ``--rounds``): a prefix that is unique today can mean
    another flag once one is added, and a config file's keys are whole names too. Every subcommand's
    parser is of this class (argparse builds them with their parent's), so the rule holds for all.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message}; see {self.prog} --help")


def package_version() -> str:
    """The installed package's version (from its metadata: no import of the package's heavy parts)."""
    import importlib.metadata  # a twentieth of a second: only for --version

    try:
        return importlib.metadata.version("swarm-node")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """``--version``: print the package version and exit, reading the metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        print(f"swarm-node {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``swarm-node`` parser; a new command is one ``sub.add_parser`` plus an entry in :data:`COMMANDS`."""
    parser = Parser(prog="swarm-node", description="Decentralized RL post-training: share rollouts, train together.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = sub.add_parser("start", help="start a new swarm as its first node")
    _add_common(start, NodeOptions)
    join = sub.add_parser("join", help="join a swarm through one or more known peers")
    _add_common(join, JoinOptions)
    local = sub.add_parser("local", help="run N nodes on this machine (127.0.0.1) with one dashboard")
    _add_common(local, LocalOptions)
    _add_tools(sub)
    from node.cli.experiment import add_experiment_parser

    add_experiment_parser(sub)
    from node.cli.evaluate import add_eval_parser

    add_eval_parser(sub)
    from node.cli.demo import add_demo_parser

    add_demo_parser(sub)
    from node.cli.export import add_export_parser

    add_export_parser(sub)
    return parser


# command -> "module:function" taking the parsed args and returning the exit status (imported lazily)
COMMANDS = {
    "start": "node.cli.serve:run_node",
    "join": "node.cli.serve:run_node",
    "local": "node.cli.local:run_local",
    "init": "node.cli.tools:run_init",
    "id": "node.cli.tools:run_id",
    "experiment": "node.cli.experiment:run_experiment_cli",
    "eval": "node.cli.evaluate:run_eval",
    "demo": "node.cli.demo:run_demo",
    "export": "node.cli.export:run_export",
}


NODE_COMMANDS = ("start", "join", "local")
OPTIONS: dict[str, type[NodeOptions]] = {"start": NodeOptions, "join": JoinOptions, "local": LocalOptions}
"""The options of each node command: their ranges are checked as they are parsed, from flags or a file."""
"""Commands that run until stopped: signals are handled by :mod:`node.cli.signals` from the first moment."""


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
    if args.command in OPTIONS:
        try:
            check_options(options_from(OPTIONS[args.command], args))
        except ValueError as e:
            raise CliError(str(e)) from None
    problem = _model_or_peer_problem(args)
    if problem:
        raise CliError(problem)
    if args.command in NODE_COMMANDS:
        preflight(args)  # before the command's module imports torch and hivemind
        for warning in start_warnings(args):
            print(f"swarm-node: warning: {warning}", file=sys.stderr, flush=True)
    return args


def _model_or_peer_problem(args: argparse.Namespace) -> str | None:
    """A mistyped ``--model``/``--models`` or ``--peer``, found without loading torch or hivemind."""
    models = [("--model", getattr(args, "model", None) or "")]
    listed = getattr(args, "models", None) or ""  # a comma list for local, a tuple for experiment
    models += [("--models", m) for m in (listed if isinstance(listed, (list, tuple)) else str(listed).split(","))]
    for flag, name in models:
        if name.strip() and (problem := model_name_error(name.strip(), flag)):
            return problem
    for peer in getattr(args, "peer", None) or ():
        if problem := peer_address_problem(peer):
            return problem
    return None


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
        if args.command not in NODE_COMMANDS:
            return int(getattr(importlib.import_module(module), func)(args))
        # before the heavy imports: a KeyboardInterrupt raised inside one can be swallowed by a library
        signals = args.stop_signals = install_stop_handlers(threading.Event(), starting=args.command != "local")
        # a child inherits its parent's signal mask: started with SIGINT/SIGTERM blocked (by a parent that
        # shields its own children, say) this node could never be stopped; a signal pending meanwhile is
        # delivered now, to the handlers just installed
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            return int(getattr(importlib.import_module(module), func)(args))
        finally:
            signals.uninstall()
    except CliError as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def node_args_to_list(args: argparse.Namespace) -> list[str]:
    """The options ``local`` hands to every child node, as a command line (generated from the options)."""
    return to_argv(options_from(LocalOptions, args))
