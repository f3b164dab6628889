"""Running one node from the command line: ``swarm-node start`` and ``swarm-node join``.

Leaving: the first SIGINT/SIGTERM sets the node's stop event; the round in
progress is abandoned before training or completed after it (an outer sync
already running is finished, within its own time bound), then the node
withdraws from sync, writes a final checkpoint and its summary event, and
exits with status 0. A signal during start-up exits at once (status 128 +
signal number; nothing to save yet, see :mod:`node.cli.signals`).
:data:`LEAVE_BOUND_S` after the signal (plus an outer
sync's bound if one was running) a watchdog ends the process with status 1
regardless; a second Ctrl-C exits at once (status 130).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli.errors import CliError
from node.cli.preflight import parse_host_port
from node.cli.signals import exit_now, stop_signals
from node.core.assemble import node_configs
from node.core.checkpoint import CheckpointError
from node.core.node import Node
from node.core.options import JoinOptions, NodeOptions, options_from, sync_partner_warning
from node.observe.reach import RELAY_WARN_S, reachability_advice, relay_news, relayed_via, startup_reach
from swarm.errors import SwarmError
from swarm.identity import IdentityError
from swarm.membership import parse_peer_multiaddr
from swarm.reach import Reachability, Verdict
from swarm.sync.tensors import float_params

if TYPE_CHECKING:
    from node.dashboard.server import Dashboard

logger = logging.getLogger(__name__)

LEAVE_BOUND_S = 25.0
"""Leaving after a signal is cut off after this long: below the 30 s a supervisor (or the user) waits."""
EXIT_LEAVE_TIMEOUT = 1


def build_node(args: argparse.Namespace) -> Node:
    """Turn parsed flags into a :class:`Node`; bad values become one-sentence CliErrors."""
    cls = JoinOptions if getattr(args, "command", "") == "join" else NodeOptions
    opts = options_from(cls, args)
    peers = tuple(getattr(opts, "peer", ()))
    try:
        for p in peers:
            parse_peer_multiaddr(p)
        host, port = parse_host_port(opts.host_port, "0.0.0.0")
        cfg, parts = node_configs(opts, host, port, peers)
    except ValueError as e:
        raise CliError(str(e)) from None
    return Node(cfg, parts)


REACH_TIMEOUT_S = 6.0
"""Bound on asking peers to dial this node back at start (their dial is 3 s; a NATed node knows within 10 s)."""


def _announce(node: Node, args: argparse.Namespace, dashboard_url: str) -> None:
    assert node.links is not None
    addrs = node.links.multiaddrs()
    if args.ready_file:
        info = {"peer": node.peer_id, "multiaddrs": addrs, "pid": os.getpid(), "dashboard": dashboard_url}
        tmp = Path(args.ready_file).with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(args.ready_file)  # atomic: readers never see half a file
    print(f"swarm-node: peer {node.peer_id} is up at round {node.round}; listening on:", flush=True)
    for a in addrs:
        print(f"  {a}", flush=True)
    cfg = node.parts.membership
    membership = node.links.membership
    verdict = Verdict(Reachability.UNKNOWN, None, 0)
    if membership is not None and not cfg.announce and not cfg.client_mode and cfg.initial_peers:
        verdict = membership.reachability(REACH_TIMEOUT_S)
        if node.metrics is not None:
            node.metrics.write("reach", time=node.clock(), peer=node.peer_id, reachability=verdict.reachability.value,
                               seen_ip=verdict.seen_ip, answers=verdict.answers)  # fmt: skip
    join, note = startup_reach(verdict, addrs, list(cfg.initial_peers), node.peer_id)
    print(f"Others can join with:\n  {join}", flush=True)
    if dashboard_url:
        print(f"Dashboard: {dashboard_url}  (Prometheus: {dashboard_url}metrics)", flush=True)
    if note is not None:
        print(f"swarm-node: {note}", flush=True)
        if verdict.reachability is Reachability.NAT and membership is not None:
            start_relay_watch(node, membership.visible_multiaddrs)
        return
    advice = reachability_advice(addrs, list(cfg.announce), cfg.client_mode, cfg.host)
    if advice:
        print(f"swarm-node: note: {advice}", flush=True)


RELAY_POLL_S = 15.0
"""How often a node behind NAT asks its daemon whether a relay reserved it a slot (one local call)."""


def start_relay_watch(
    node: Node, addrs: Callable[..., list[str]], poll_s: float = RELAY_POLL_S, warn_after_s: float = RELAY_WARN_S
) -> threading.Thread:
    """Say once when this NATed node gains a relayed address, or warn once when none came in time; the
    thread ends with the relayed address or the node's stop."""
    started = time.monotonic()

    def watch() -> None:
        warned = False
        while not node.stop_event.wait(poll_s):
            now = addrs(latest=True)
            news = relay_news(now, time.monotonic() - started, warned, warn_after_s)
            if news is not None:
                print(f"swarm-node: {news}", flush=True)
                warned = True
            relay = relayed_via(now)
            if news is not None and node.metrics is not None:
                node.metrics.write("reach", time=node.clock(), peer=node.peer_id, reachability="nat",
                                   relayed_via=relay or "", waited_s=round(time.monotonic() - started, 1))  # fmt: skip
            if relay is not None:
                return

    thread = threading.Thread(target=watch, name="relay-watch", daemon=True)
    thread.start()
    return thread


GO_TIMEOUT_S = 120.0


def _wait_for_go(path: Path, node: Node) -> None:
    """``local`` releases all nodes at once; a lost signal only delays us by the bound."""
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not path.exists() and time.monotonic() < deadline and not node.stop_event.is_set():
        node.stop_event.wait(0.05)


def _synced_params(node: Node) -> int:
    """How many parameters the outer sync averages (0 before the model is built): its time bound grows with them."""
    policy = getattr(node, "policy", None)
    return sum(p.numel() for p in float_params(policy.model)) if policy is not None else 0


def start_leave_watchdog(node: Node, bound_s: float = LEAVE_BOUND_S) -> threading.Thread:
    """After the stop signal, end the process if leaving takes longer than ``bound_s``.

    An outer sync that is running when the signal comes is finished first; its
    own bound (``max_sync_seconds``) is added.
    """

    def watch() -> None:
        node.stop_event.wait()
        extra = node.parts.sync.max_sync_seconds(_synced_params(node)) if node.in_sync and node.parts.sync else 0.0
        time.sleep(bound_s + extra)
        print(f"swarm-node: leaving took more than {bound_s + extra:.0f}s; exiting now", file=sys.stderr, flush=True)
        exit_now(EXIT_LEAVE_TIMEOUT)

    thread = threading.Thread(target=watch, name="leave-watchdog", daemon=True)
    thread.start()
    return thread


def _start_dashboard(node: Node, args: argparse.Namespace) -> Dashboard | None:
    from node.dashboard.server import Dashboard, DashboardConfig, node_view  # aiohttp: only for a dashboard

    try:
        cfg = DashboardConfig(port=args.dashboard_port, host=args.dashboard_host)
    except ValueError as e:
        raise CliError(str(e)) from None
    if cfg.port is None:
        return None
    dash = Dashboard(node_view(node.run_dir / "metrics.jsonl", f"node {node.peer_id[-6:]}"), cfg)
    try:
        dash.start()
    except OSError as e:
        raise CliError(f"dashboard port {cfg.port} is not free ({e.strerror}); pick another --dashboard-port") from None
    return dash


def os_error_sentence(e: OSError) -> str:
    """A start-up OSError as one sentence naming the path and the flags that set it."""
    where = f" {e.filename}" if e.filename else ""
    return f"cannot use{where} ({e.strerror or e}); check --log-dir and --identity"


def run_node(args: argparse.Namespace) -> int:
    """Start (or join), run the configured rounds, then leave cleanly."""
    signals = stop_signals(args, starting=True)
    warning = sync_partner_warning(
        args.sync_every, args.rounds, sync_period=args.sync_period_s
    )  # others' models are unknown here
    if warning:
        print(f"swarm-node: warning: {warning}", file=sys.stderr, flush=True)
    node = build_node(args)
    node.stop_event = signals.stop
    start_leave_watchdog(node)
    dash: Dashboard | None = None
    try:
        node.start()
        dash = _start_dashboard(node, args)
    except (SwarmError, IdentityError, ValueError, LookupError, CheckpointError, CliError) as e:
        node.shutdown()
        raise CliError(str(e)) from None
    except OSError as e:  # a file or folder the start-up checks could not foresee (it changed meanwhile)
        node.shutdown()
        raise CliError(os_error_sentence(e)) from None
    except BaseException:  # anything else still stops the DHT child and p2pd, or they would keep us alive
        node.shutdown()
        raise
    try:
        signals.started()  # before "is up": whoever sees that line may signal, and gets a clean leave
        _announce(node, args, dash.url if dash else "")
        if args.go_file:
            _wait_for_go(Path(args.go_file), node)
        node.run()
        if args.hold and node.metrics is not None and not node.stop_event.is_set():
            node.metrics.write("done", time=node.clock(), peer=node.peer_id, round=node.round)
            node.stop_event.wait()  # keep serving rollouts until told to stop
    finally:
        node.shutdown()
        if dash is not None:
            dash.close()
    print(f"swarm-node: {node.peer_id[-6:]} left after {node.round} rounds", file=sys.stderr, flush=True)
    return 0
