"""``swarm-node local``: N node processes on 127.0.0.1, a progress line, a summary table.

The first node bootstraps the swarm; the others join through it. Every child
runs its rounds and then holds (keeps serving its rollouts) until all are
done, so a fast node's last batches stay fetchable by slower ones. Stopping is
always bounded: SIGTERM, a grace period, then SIGKILL of the PIDs we started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from node.cli.errors import CliError
from node.cli.forkserver import ForkedNode, ForkServer, StartupStopped
from node.cli.main import node_args_to_list
from node.cli.signals import stop_signals
from node.core.options import LocalOptions, default_of, sync_partner_warning
from node.dashboard.server import Dashboard, DashboardConfig, swarm_view
from node.observe.metrics import read_events
from protocol import short_id
from swarm.identity import load_or_create

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_MODELS = ("tiny-s", "tiny-m", "tiny-l", "tiny-gpt2")
STOP_GRACE_S = 15.0
READY_TIMEOUT_S = 90.0


@dataclass
class Child:
    index: int
    model: str
    peer_id: str
    proc: subprocess.Popen[bytes] | ForkedNode
    log: TextIO
    external: int

    @property
    def short(self) -> str:
        return short_id(self.peer_id)


def node_models(args: argparse.Namespace) -> list[str]:
    """The model of each node, round-robin: --models, else --model if given, else a mix of the tiny built-ins."""
    if args.models:
        return [m.strip() for m in args.models.split(",") if m.strip()]
    if args.model != default_of(LocalOptions, "model"):  # the user named one model: use it everywhere
        return [args.model]
    return list(DEFAULT_LOCAL_MODELS)


def child_argv(args: argparse.Namespace, i: int, model: str, log_dir: Path, peers: list[str]) -> list[str]:
    """The command line of node ``i`` (without ``python -m node``): the inherited options, then its own."""
    cmd = ["join" if peers else "start"]
    for p in peers:
        cmd += ["--peer", p]
    key = log_dir / "keys" / f"node{i}.key"
    cmd += [*node_args_to_list(args), "--model", model, "--identity", str(key), "--log-dir", str(log_dir)]
    cmd += ["--host-port", "127.0.0.1:0", "--max-threads", str(args.max_threads or 1), "--hold"]
    cmd += ["--seed", str(args.seed + i), "--ready-file", str(log_dir / f"node{i}.ready")]
    cmd += ["--go-file", str(log_dir / "go")]
    if i >= args.nodes - args.isolated:
        cmd += ["--external", "0"]
    return cmd


def _spawn(
    args: argparse.Namespace, i: int, model: str, log_dir: Path, peers: list[str], server: ForkServer | None
) -> Child:
    identity = load_or_create(log_dir / "keys" / f"node{i}.key")
    cmd = child_argv(args, i, model, log_dir, peers)
    log = open(log_dir / f"node{i}.log", "w")  # noqa: SIM115 - closed in _stop_all
    proc: subprocess.Popen[bytes] | ForkedNode
    if server is None:
        cmd = [sys.executable, "-m", "node", *cmd]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    else:
        proc = server.spawn(cmd, log_dir / f"node{i}.log")
    external = 0 if i >= args.nodes - args.isolated else args.external_groups
    return Child(i, model, identity.peer_id, proc, log, external)


def _wait_ready(child: Child, path: Path, timeout: float, stop: threading.Event) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        if child.proc.poll() is not None:
            break
        if stop.wait(0.1):
            raise StartupStopped(f"stopped while node {child.index} was starting")
    raise CliError(f"node {child.index} did not start (exit code {child.proc.poll()}); see {child.log.name} for why")


def _progress(children: list[Child], log_dir: Path) -> tuple[list[int], list[float | None]]:
    rounds, rewards = [], []
    for c in children:
        events = list(read_events(log_dir / c.short / "metrics.jsonl", "round"))
        rounds.append(max((int(e["round"]) for e in events), default=0))  # resumed runs repeat some rounds
        rewards.append(events[-1]["reward_mean"] if events else None)
    return rounds, rewards


def _stop_all(children: list[Child]) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for c in children:
        try:
            c.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:  # the child's own session: a p2pd or DHT process left behind goes too
            os.killpg(c.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            c.proc.wait(5)
        except subprocess.TimeoutExpired:
            logger.warning("node %d (pid %d) did not exit after SIGKILL", c.index, c.proc.pid)
        c.log.close()


def run_local(args: argparse.Namespace) -> int:
    # the options' ranges (--nodes, --isolated, --rounds) are checked as they are parsed (node.cli.main)
    log_dir = Path(args.log_dir)
    (log_dir / "keys").mkdir(parents=True, exist_ok=True)
    for stale in [*log_dir.glob("node*.ready"), log_dir / "go"]:
        stale.unlink(missing_ok=True)
    models = node_models(args)
    warning = sync_partner_warning(
        args.sync_every, args.rounds, [models[i % len(models)] for i in range(args.nodes)], args.sync_period_s
    )
    if warning:
        print(f"swarm-node local: warning: {warning}", file=sys.stderr, flush=True)
    stop: threading.Event = stop_signals(args, starting=False).stop
    children: list[Child] = []
    t0 = time.monotonic()
    dash = _start_dashboard(args, log_dir)
    server: ForkServer | None = None
    try:
        if not args.fresh_processes:
            server = ForkServer(log_dir / "forkserver.log", stop=stop)
        first = _spawn(args, 0, models[0], log_dir, [], server)
        children.append(first)
        boot = _wait_ready(first, log_dir / "node0.ready", READY_TIMEOUT_S, stop)["multiaddrs"]
        for i in range(1, args.nodes):
            children.append(_spawn(args, i, models[i % len(models)], log_dir, boot, server))
        for c in children[1:]:
            _wait_ready(c, log_dir / f"node{c.index}.ready", READY_TIMEOUT_S, stop)
        (log_dir / "go").touch()
        print(f"swarm-node local: {args.nodes} nodes up in {time.monotonic() - t0:.1f}s; logs in {log_dir}/")
        _watch(children, log_dir, args, stop)
    except StartupStopped as e:  # a Ctrl-C before every node was up: stop what started, as any stop does
        print(f"swarm-node local: {e}; stopping", file=sys.stderr, flush=True)
    finally:
        _stop_all(children)
        if server is not None:
            server.close()
        if dash is not None:
            dash.close()
    table = summary_table(children, log_dir)
    print(table)
    (log_dir / "summary.md").write_text(table + "\n")
    return 0


def _start_dashboard(args: argparse.Namespace, log_dir: Path) -> Dashboard | None:
    """One swarm-wide dashboard over every node's metrics file; a busy default port falls back to a free one."""
    if args.no_dashboard or args.dashboard_port is None:
        return None
    try:
        cfg = DashboardConfig(port=args.dashboard_port, host=args.dashboard_host)
    except ValueError as e:
        raise CliError(str(e)) from None
    dash = Dashboard(swarm_view(log_dir, f"local swarm of {args.nodes} nodes ({log_dir})"), cfg)
    try:
        url = dash.start(fallback_to_free_port=True)
    except OSError as e:
        raise CliError(f"cannot serve the dashboard on {cfg.host}: {e.strerror}; try --no-dashboard") from None
    print(f"swarm-node local: dashboard at {url}  (Prometheus: {url}metrics)", flush=True)
    return dash


def stall_bound(args: argparse.Namespace) -> tuple[float, str]:
    """How long no node may finish a round before ``local`` gives up, and the flags it comes from.

    A held-out evaluation runs between two rounds with its own bound: a real model's takes minutes on
    a CPU, so that bound is added, or a swarm that evaluates would be stopped as stalled.
    """
    if args.eval_every:
        return args.round_timeout + args.eval_timeout_s, "--round-timeout + --eval-timeout"
    return args.round_timeout, "--round-timeout"


def _watch(children: list[Child], log_dir: Path, args: argparse.Namespace, stop: Any) -> None:
    last_change, last = time.monotonic(), [-1] * len(children)
    bound, flags = stall_bound(args)
    while not stop.is_set():
        rounds, rewards = _progress(children, log_dir)
        if rounds != last:
            last, last_change = rounds, time.monotonic()
            shown = " ".join("-" if r is None else f"{r:.2f}" for r in rewards)
            print(
                f"  rounds {min(rounds)}-{max(rounds)}/{args.rounds} | last reward per node: {shown}",
                flush=True,
            )
        if min(rounds) >= args.rounds:
            return
        dead = [c for c in children if c.proc.poll() is not None]
        if dead:
            raise CliError(
                f"node {dead[0].index} exited early (code {dead[0].proc.returncode}); see {dead[0].log.name}"
            )
        if time.monotonic() - last_change > bound:
            raise CliError(f"no node finished a round in {bound:.0f}s ({flags}); see the node logs in {log_dir}")
        stop.wait(0.5)


COLUMNS: tuple[str, ...] = ("node", "model", "peer", "external J", "rounds", "reward first 5", "reward last 5")
COLUMNS += ("external used", "rejected", "round s")


def summary_table(children: list[Child], log_dir: Path) -> str:
    """Per-node Markdown table: rewards early vs late, external groups used and rejected."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for c in children:
        ev = list(read_events(log_dir / c.short / "metrics.jsonl", "round"))
        row: list[object] = [c.index, c.model, c.short, c.external, len(ev)]
        if ev:
            first = sum(e["reward_mean"] for e in ev[:5]) / len(ev[:5])
            last = sum(e["reward_mean"] for e in ev[-5:]) / len(ev[-5:])
            row += [f"{first:.3f}", f"{last:.3f}", sum(e["external_groups"] for e in ev)]
            row += [sum(e["external_rejected"] for e in ev), f"{sum(e['round_s'] for e in ev) / len(ev):.2f}"]
        else:
            row += ["-"] * 5
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines)
