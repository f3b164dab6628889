"""The swarm on the WAN testbed (bench/wan.py): NATed homes, public peers, slow and lossy links.

Each *scenario* builds a testbed, starts real nodes (``swarm-node start`` on the bootstrap host,
``swarm-node join`` everywhere else, each in its host's namespace, with the node's defaults plus the
flags given), lets them run for ``--seconds``, stops them with SIGTERM (and times the exit), and reads
their metrics files. It prints, per node: where it runs, what its start-up said about reachability and
which join address it offered, rounds per hour, whose groups it trained on (groups per round from each
publisher), its sync commits and the distinct committed states per revision (1: bit-identical).

Scenarios (``--scenario``, repeatable):

- ``flat``: the hosts of ``nat`` on one unshaped bridge, no NAT (the reference rates);
- ``nat``: a public bootstrap + one public peer, three homes (one with two peers), no shaping;
- ``wan``: six nodes, each access link ``--delay-ms`` each way +- ``--jitter-ms``, ``--loss`` per
  direction (a path crosses two links: 4 x delay round trip), beside ``flat6`` (the same six unshaped).

Usage::

    sudo .venv/bin/python bench/bench_wan.py --scenario flat --scenario nat --seconds 150 [--json FILE]
        [--keep DIR] [--node-args "--sync-every 2"]

Needs root, iproute2, nftables and ethtool (``make wan-deps``); says so in one line where they are missing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: bench/ and tests/ are importable from the repository root

from bench import wan as wanbed  # noqa: E402
from bench.linkemu import LinkShape  # noqa: E402
from tests.procs import PYTHON, Proc, Procs, poll_until  # noqa: E402

PORT = 7100
READY_S = 120.0
LEAVE_S = 30.0


@dataclass
class NodeRun:
    """One node of a scenario: where it ran and what it recorded."""

    host: wanbed.Host
    proc: Proc
    log_dir: Path
    ready: dict[str, Any] = field(default_factory=dict)
    exit_s: float | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    public: int
    homes: list[int]
    shape: LinkShape | None = None
    nat: bool = True  # False: every host public on one bridge (homes become public hosts)


def scenarios(args: argparse.Namespace) -> dict[str, Scenario]:
    shape = LinkShape(args.delay_ms, args.jitter_ms, args.loss)
    return {
        "flat": Scenario("flat", public=6, homes=[]),
        "nat": Scenario("nat", public=2, homes=[2, 1, 1]),
        "wan": Scenario("wan", public=6, homes=[], shape=shape),
        "wan-nat": Scenario("wan-nat", public=2, homes=[2, 1, 1], shape=shape),
        "pair": Scenario("pair", public=1, homes=[1, 1]),
        "flat-pair": Scenario("flat-pair", public=1, homes=[1, 1], nat=False),
    }


def node_cmd(host: wanbed.Host, log_dir: Path, bootstrap: str | None, seed: int, extra: list[str]) -> list[str]:
    cmd = [PYTHON, "-m", "node", "join" if bootstrap else "start"]
    if bootstrap:
        cmd += ["--peer", bootstrap]
    cmd += ["--model", "tiny-m", "--host-port", f"{host.ip}:{PORT}", "--log-dir", str(log_dir)]
    cmd += ["--identity", str(log_dir / "id.key"), "--ready-file", str(log_dir / "ready.json")]
    cmd += ["--seed", str(seed), "--max-threads", "1", *extra]
    return cmd


def _ready(run: NodeRun) -> dict[str, Any] | None:
    path = run.log_dir / "ready.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def start_nodes(bed: wanbed.Wan, procs: Procs, root: Path, extra: list[str]) -> list[NodeRun]:
    """The first public host (or the first host) is the bootstrap; everyone joins through it."""
    runs: list[NodeRun] = []
    for i, host in enumerate(bed.hosts):
        log_dir = root / host.name
        log_dir.mkdir(parents=True)
        bootstrap = None
        if runs:
            addrs = [a for a in runs[0].ready["multiaddrs"] if f"/{runs[0].host.ip}/" in a]
            bootstrap = addrs[0]
        cmd = bed.prefix(host) + node_cmd(host, log_dir, bootstrap, seed=100 + i, extra=extra)
        run = NodeRun(host, procs.start(host.name, cmd, log=log_dir / "node.log"), log_dir)
        runs.append(run)
        if i == 0:
            ready = poll_until(lambda r=run: _ready(r), READY_S)  # type: ignore[misc]
            if ready is None:
                raise RuntimeError(f"bootstrap did not start in {READY_S:g} s:\n{run.proc.log_tail()}")
            run.ready = ready
    for run in runs[1:]:
        ready = poll_until(lambda r=run: _ready(r), READY_S)  # type: ignore[misc]
        if ready is None:
            raise RuntimeError(f"{run.host.name} did not start in {READY_S:g} s:\n{run.proc.log_tail()}")
        run.ready = ready
    return runs


def stop_nodes(runs: list[NodeRun]) -> None:
    """SIGTERM every node at once and time each exit (the bound a node promises is 30 s)."""
    t0 = time.monotonic()
    for run in runs:
        run.proc.send(signal.SIGTERM)
    for run in runs:
        left = max(0.1, t0 + LEAVE_S + 5 - time.monotonic())
        try:
            run.exit_code = run.proc.wait(left)
            run.exit_s = time.monotonic() - t0
        except Exception:  # a node past its bound is reported, then killed by the reaper
            run.exit_code = None


def events(run: NodeRun) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in run.log_dir.glob("*/metrics.jsonl"):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line
    return out


def summarize(runs: list[NodeRun], seconds: float) -> dict[str, Any]:
    by_peer = {run.ready.get("peer", ""): run.host.name for run in runs}
    by_peer.update({peer[-6:]: name for peer, name in by_peer.items()})  # batches_from names short ids
    nodes: dict[str, Any] = {}
    states: dict[int, set[str]] = defaultdict(set)
    for run in runs:
        evs = events(run)
        rounds = [e for e in evs if e.get("event") == "round"]
        syncs = [e for e in evs if e.get("event") == "sync"]
        used: Counter[str] = Counter()
        fetched: Counter[str] = Counter()
        for r in rounds:
            for peer, n in (r.get("external_peers") or {}).items():
                used[by_peer.get(peer, peer[-6:])] += int(n)
            for peer, n in (r.get("batches_from") or {}).items():
                fetched[by_peer.get(peer, peer[-6:])] += int(n)
        commits = [s for s in syncs if s.get("committed")]
        for s in commits:
            states[int(s["revision"])].add(str(s["state_hash"]))
        span = rounds[-1]["time"] - rounds[0]["time"] if len(rounds) > 1 else 0.0
        log = (run.log_dir / "node.log").read_text(errors="replace")
        nodes[run.host.name] = {
            "ip": run.host.ip,
            "public": run.host.public,
            "join_hint": _line_after(log, "Others can join with:"),
            "note": [ln for ln in log.splitlines() if "note:" in ln or "reachab" in ln.lower()][:3],
            "rounds": len(rounds),
            "rounds_per_h": round(3600 * (len(rounds) - 1) / span, 1) if span > 0 else 0.0,
            "round_s_median": statistics.median(r["round_s"] for r in rounds) if rounds else None,
            "groups_from": dict(used),
            "groups_per_round_from": {k: round(v / max(1, len(rounds)), 3) for k, v in used.items()},
            "batches_from": dict(fetched),
            "batches_per_min_from": {k: round(60 * v / max(span, 1e-9), 1) for k, v in fetched.items()},
            "fetched_via_relay": max((int(r.get("fetched_via_relay") or 0) for r in rounds), default=0),
            "fetch_failed": sum(int(r.get("fetch_failed") or 0) for r in rounds),
            "sync_attempts": len(syncs),
            "sync_ends": dict(Counter(str(s.get("cause") or s.get("reason")) for s in syncs if not s.get("committed"))),
            "sync_phase_s_median": _median_phases(syncs),
            "commits": len(commits),
            "commits_per_h": round(3600 * len(commits) / seconds, 1),
            "exit_s": None if run.exit_s is None else round(run.exit_s, 1),
            "exit_code": run.exit_code,
            "tracebacks": log.count("Traceback"),
        }
    forks = sum(1 for hashes in states.values() if len(hashes) > 1)
    return {"nodes": nodes, "revisions": len(states), "revisions_with_two_states": forks}


def _median_phases(syncs: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per phase over the syncs that reached it: where a slow sync spends its time."""
    seen: dict[str, list[float]] = defaultdict(list)
    for s in syncs:
        for phase, secs in (s.get("phases") or {}).items():
            seen[phase].append(float(secs))
    return {phase: round(statistics.median(v), 2) for phase, v in seen.items()}


def _line_after(text: str, marker: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if marker in line and i + 1 < len(lines):
            return lines[i + 1].strip()
    return ""


def after_kill(runs: list[NodeRun], victim: NodeRun, killed_at: float) -> dict[str, Any]:
    """Per surviving NATed node: how soon after ``victim`` died it fetched a batch of another home again, and
    its rate of those batches per minute after that (the unix time ``killed_at``)."""
    homes = {r.ready.get("peer", "")[-6:]: r.host.home for r in runs if r.host.home is not None}
    out: dict[str, Any] = {}
    for run in runs:
        if run is victim or run.host.home is None:
            continue
        later = [e for e in events(run) if e.get("event") == "round" and e["time"] > killed_at]
        others = [(e["time"], sum(n for p, n in (e.get("batches_from") or {}).items()
                                  if homes.get(p[-6:]) not in (None, run.host.home))) for e in later]  # fmt: skip
        first = next((t for t, n in others if n > 0), None)
        span = later[-1]["time"] - killed_at if later else 0.0
        out[run.host.name] = {
            "first_other_home_batch_s": None if first is None else round(first - killed_at, 1),
            "other_home_batches_per_min": round(60 * sum(n for _, n in others) / span, 1) if span > 0 else 0.0,
        }
    return out


def run_scenario(
    sc: Scenario, seconds: float, extra: list[str], keep: Path | None, kill_at: float | None = None
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"wan-{sc.name}-", dir=keep))
    homes = sc.homes if sc.nat else []
    public = sc.public if sc.nat else sc.public + sum(sc.homes)
    with wanbed.Wan(public, homes, shape=sc.shape) as bed, Procs(root) as procs:
        t0 = time.monotonic()
        runs = start_nodes(bed, procs, root, extra)
        started = time.monotonic() - t0
        killed: dict[str, Any] | None = None
        if kill_at is not None:  # the bootstrap, every NATed node's first relay, dies without a word
            time.sleep(kill_at)
            killed_at = time.time()
            runs[0].proc.kill()
            time.sleep(max(0.0, seconds - kill_at))
            stop_nodes(runs[1:])
            killed = after_kill(runs, runs[0], killed_at)
            runs = runs[1:]
        else:
            time.sleep(seconds)  # the nodes run on their own; this bench only watches the clock
            stop_nodes(runs)
        out = summarize(runs, seconds)
        out["after_relay_killed"] = killed
        out["scenario"] = sc.name
        out["start_s"] = round(started, 1)
        out["emulator"] = json.loads(bed.stats_path.read_text()) if bed.stats_path.exists() else None
        out["load"] = Path("/proc/loadavg").read_text().split()[:3]
    return out


PROBE = r"""
import socket, sys, time
mode, host, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "serve":
    srv = socket.create_server((host, 5001)); conn, _ = srv.accept()
    while True:
        data = conn.recv(1 << 16)
        if not data: break
        if data == b"p": conn.sendall(b"p")
    sys.exit(0)
conn = socket.create_connection((host, 5001)); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(21):
    t = time.perf_counter(); conn.sendall(b"p"); conn.recv(1); rtts.append(1000 * (time.perf_counter() - t))
buf, sent, t = b"x" * 65536, 0, time.perf_counter()
while time.perf_counter() - t < secs:
    conn.sendall(buf); sent += len(buf)
conn.close()
print(sorted(rtts)[10], sent / (time.perf_counter() - t) / 1e6)
"""


def link_overhead(shapes: dict[str, LinkShape | None], seconds: float = 5.0) -> dict[str, dict[str, float]]:
    """RTT (median of 21 pings on one TCP connection) and one stream's throughput between two public hosts,
    for each link shape: ``None`` is a plain veth, a zero shape is the emulator's own cost."""
    out: dict[str, dict[str, float]] = {}
    for name, shape in shapes.items():
        with wanbed.Wan(2, [], shape=shape) as bed:
            a, b = bed.hosts
            server = subprocess.Popen([*bed.prefix(b), PYTHON, "-c", PROBE, "serve", b.ip, "0"])
            try:
                time.sleep(0.5)
                done = subprocess.run([*bed.prefix(a), PYTHON, "-c", PROBE, "send", b.ip, str(seconds)],
                                      capture_output=True, text=True, timeout=seconds + 30, check=True)  # fmt: skip
            finally:
                server.wait(timeout=10)
            rtt, mbps = map(float, done.stdout.split())
            out[name] = {"rtt_ms": round(rtt, 2), "MB_per_s": round(mbps, 1)}
            print(f"{name:<24} rtt {rtt:7.2f} ms  {mbps:7.1f} MB/s", flush=True)
    return out


def print_table(result: dict[str, Any]) -> None:
    print(f"\n== {result['scenario']}: start {result['start_s']} s, load {' '.join(result['load'])}, "
          f"revisions {result['revisions']}, forked {result['revisions_with_two_states']}")  # fmt: skip
    head = f"{'node':<9} {'ip':<13} {'rnd/h':>6} {'rnd_s':>6} {'commits':>7} {'/h':>5} {'exit_s':>6} {'relay':>5}"
    head += "  batches/min from"
    print(head)
    for name, n in result["nodes"].items():
        med = f"{n['round_s_median']:.2f}" if n["round_s_median"] is not None else "-"
        used = " ".join(f"{k}:{v:.1f}" for k, v in sorted(n["batches_per_min_from"].items()))
        print(f"{name:<9} {n['ip']:<13} {n['rounds_per_h']:>6} {med:>6} {n['commits']:>7} {n['commits_per_h']:>5} "
              f"{n['exit_s']!s:>6} {n['fetched_via_relay']:>5}  {used}")  # fmt: skip
        print(f"          join: {n['join_hint']}")
        for note in n["note"]:
            print(f"          {note.strip()[:160]}")
        if n["sync_ends"]:
            ends = ", ".join(f"{k} {v}" for k, v in sorted(n["sync_ends"].items(), key=lambda kv: -kv[1]))
            print(f"          not committed: {ends}; median phases {n['sync_phase_s_median']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", default=None, help="flat, nat, wan, wan-nat (repeatable)")
    parser.add_argument("--seconds", type=float, default=150.0, help="how long the nodes run")
    parser.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay per access link (x4 = RTT)")
    parser.add_argument("--jitter-ms", type=float, default=5.0, help="+- per access link and direction")
    parser.add_argument("--loss", type=float, default=0.005, help="loss per access link and direction")
    parser.add_argument("--node-args", default="--sync-every 2", help="flags added to every node")
    parser.add_argument("--json", type=Path, default=None, help="write every scenario's result here")
    parser.add_argument("--keep", type=Path, default=None, help="leave the nodes' logs under this folder")
    parser.add_argument("--links", action="store_true", help="measure the link emulator's own cost first")
    parser.add_argument("--kill-relay-at", type=float, default=None, help="SIGKILL the bootstrap after S seconds")
    args = parser.parse_args(argv)
    why = wanbed.unavailable()
    if why is not None:
        print(f"bench_wan: {why}")
        return 2
    table = scenarios(args)
    chosen = args.scenario or ([] if args.links else ["flat", "nat"])
    unknown = [s for s in chosen if s not in table]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]}; choose from {', '.join(table)}")
    results: list[dict[str, Any]] = []
    if args.links:
        shape = LinkShape(args.delay_ms, args.jitter_ms, args.loss)
        shapes = {"veth": None, "emulator, no delay": LinkShape(), f"emulator {shape.delay_ms:g} ms": shape}
        results.append({"scenario": "links", "links": link_overhead(shapes)})
        chosen = args.scenario or []
    for name in chosen:
        result = run_scenario(table[name], args.seconds, shlex.split(args.node_args), args.keep, args.kill_relay_at)
        print_table(result)
        if result.get("after_relay_killed"):
            print(f"after the bootstrap was killed: {json.dumps(result['after_relay_killed'])}")
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
