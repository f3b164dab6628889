"""Local swarm scaling: round time, timeouts and memory per node, side by side in one run.

Usage::

    python bench/bench_scale.py [--nodes 4 8 16] [--rounds 20] [--model tiny-s] [--split 4/4]
                                [--compare-isolated] [--launchers fork,fresh] [--budget-s 900]

For each N it runs ``swarm-node local --nodes N`` (every node the same model,
``--split`` local/external groups) and measures, from the nodes' metrics:
round time p50/p95 (round 1 excluded), fetch failures per node-round (peers
that did not answer in time), external groups actually trained on per
node-round, and wall time. While the swarm runs, it samples each node's
process tree (the node's python process, its hivemind DHT child and ``p2pd``)
with psutil: peak RSS, USS (memory unique to the process; RSS counts shared
torch pages once per process) and PSS (each shared page divided among the
processes that map it: the honest per-node share when nodes are forked from
one server). ``--launchers fork,fresh`` runs every N both ways, side by side:
nodes forked from ``local``'s fork server (the default) and fresh python
processes (``--fresh-processes``). A node's total PSS is the sum of its
processes' peaks plus the fork server's PSS divided among the nodes (an upper
bound: the peaks need not coincide); the start time is ``local``'s "nodes up".

``--min-generate S`` paces every node (rounds of at least S s, as a real model's), so
that a big local swarm keeps a real swarm's DHT load per second.

``--compare-isolated`` adds, for the first N, the same swarm with sharing off
at equal compute: ``I+J`` local groups and 0 external (no collect; rollouts
are still published), so the ratio isolates what collecting and verifying
external groups costs a round.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.experiments.results import parse_split  # noqa: E402
from node.observe.metrics import read_events  # noqa: E402


@dataclass
class Peak:
    """Peak resident (RSS) and unique (USS) bytes seen for one kind of process."""

    rss: int = 0
    uss: int = 0
    pss: int = 0
    cpu: float = 0.0  # CPU seconds (user + system) used so far, at the latest sample


KINDS = ("node", "dht", "p2pd", "shm")


def _kind(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "node"
    name = proc.name()
    return "p2pd" if "p2pd" in name else "shm" if "shm_manager" in name else "dht"


def sample_tree(pid: int, peaks: dict[str, Peak]) -> None:
    """Update ``peaks`` (kind -> Peak) with the memory of ``pid`` and its descendants, summed per kind."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    now: dict[str, Peak] = {}
    for proc in procs:
        try:
            info = proc.memory_full_info()
            times = proc.cpu_times()
            kind = _kind(proc, pid)
        except psutil.Error:
            continue
        cur = now.setdefault(kind, Peak())
        cur.rss += info.rss
        cur.uss += info.uss
        cur.pss += info.pss
        cur.cpu += times.user + times.system
    for kind, cur in now.items():
        best = peaks.setdefault(kind, Peak())
        best.rss, best.uss, best.pss = max(best.rss, cur.rss), max(best.uss, cur.uss), max(best.pss, cur.pss)
        best.cpu = max(best.cpu, cur.cpu)  # cumulative: the latest sample is the largest


def _fork_server(pid: int) -> int | None:
    """The pid of ``local``'s fork server (a child of ``pid``), if it runs one."""
    try:
        return next((c.pid for c in psutil.Process(pid).children() if "node.cli.forkserver" in c.cmdline()), None)
    except psutil.Error:
        return None


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


@dataclass
class SwarmStats:
    """What one local swarm run measured."""

    label: str
    nodes: int
    rounds_done: int
    ok: bool
    wall_s: float
    round_s: list[float] = field(default_factory=list)
    fetch_failed: int = 0
    external: int = 0
    memory: dict[int, dict[str, Peak]] = field(default_factory=dict)  # node index -> kind -> peak
    server: Peak = field(default_factory=Peak)  # the fork server's own memory (none for fresh processes)
    up_s: float = float("nan")  # local's "N nodes up in X s"

    def per_node_round(self, value: int) -> float:
        return value / max(self.rounds_done, 1)


def _ready_pids(log_dir: Path) -> dict[int, int]:
    pids = {}
    for path in log_dir.glob("node*.ready"):
        try:
            pids[int(path.stem[4:])] = int(json.loads(path.read_text())["pid"])
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
    return pids


def run_swarm(
    label: str,
    n: int,
    rounds: int,
    model: str,
    split: tuple[int, int],
    timeout: float,
    fresh: bool = False,
    keep: Path | None = None,
    min_generate: float = 0.0,
) -> SwarmStats:
    """One ``swarm-node local`` run, sampling memory while it goes; its logs are copied to ``keep``/N<n>-<label>."""
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        cmd = [sys.executable, "-m", "node", "local", "--nodes", str(n), "--rounds", str(rounds)]
        cmd += ["--models", model, "--local", str(split[0]), "--external", str(split[1])]
        cmd += ["--log-dir", str(log_dir), "--round-timeout", "120", "--no-dashboard"]
        cmd += ["--fresh-processes"] if fresh else []
        cmd += ["--min-generate", str(min_generate)] if min_generate else []
        t0 = time.monotonic()
        stats = SwarmStats(label, n, 0, False, 0.0)
        every = max(2.0, n / 4)  # reading smaps costs ~10 ms a process: keep the sampler's CPU small
        with open(log_dir / "local.out", "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                ready = _ready_pids(log_dir)
                for i, pid in ready.items():
                    sample_tree(pid, stats.memory.setdefault(i, {}))
                server = _fork_server(proc.pid)
                if server is not None and len(ready) == n:  # before the forks it holds every page alone
                    only: dict[str, Peak] = {}
                    sample_tree(server, only)  # its children are the nodes: only its own entry counts
                    stats.server = only.get("node", stats.server)
                time.sleep(every)
            if proc.poll() is None:
                proc.terminate()
            proc.wait(120)
        stats.wall_s = time.monotonic() - t0
        stats.ok = proc.returncode == 0
        up = re.search(r"nodes up in ([0-9.]+)s", (log_dir / "local.out").read_text())
        stats.up_s = float(up.group(1)) if up else float("nan")
        for path in log_dir.glob("*/metrics.jsonl"):
            for e in read_events(path, "round"):
                stats.rounds_done += 1
                stats.fetch_failed += int(e.get("fetch_failed", 0))
                stats.external += int(e.get("external_groups", 0))
                if int(e["round"]) > 1:
                    stats.round_s.append(float(e["round_s"]))
        if not stats.ok:
            print((log_dir / "local.out").read_text()[-2000:], file=sys.stderr)
        if keep is not None:
            shutil.copytree(log_dir, keep / f"N{n}-{label.replace(' ', '_').replace('/', '-')}", dirs_exist_ok=True)
    return stats


def _mb(kind: str, s: SwarmStats, attr: str) -> str:
    vals = [getattr(m[kind], attr) / 2**20 for m in s.memory.values() if kind in m]
    return f"{statistics.fmean(vals):.0f}" if vals else "-"


def report(rows: list[SwarmStats], isolated: SwarmStats | None, cores: int) -> None:
    """Print the Markdown tables."""
    print(f"\nSwarm scaling ({cores} CPU cores): round time, fetch failures, external groups per node-round")
    print("| run | N | node-rounds | ok | round s p50 / p95 | fetch failed / node-round ", end="")
    print("| external / node-round | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for s in [*rows, *([isolated] if isolated else [])]:
        print(
            f"| {s.label} | {s.nodes} | {s.rounds_done} | {'yes' if s.ok else 'NO'} "
            f"| {pct(s.round_s, 0.5):.2f} / {pct(s.round_s, 0.95):.2f} | {s.per_node_round(s.fetch_failed):.2f} "
            f"| {s.per_node_round(s.external):.2f} | {s.wall_s:.0f} |"
        )
    if isolated is not None and rows:
        base = rows[0]
        ratio = pct(base.round_s, 0.5) / pct(isolated.round_s, 0.5)
        print(f"\nRound time, sharing on / off at equal compute (N={base.nodes}, p50): {ratio:.2f}x")
    print("\nStart and peak memory per node (MB, mean over nodes): PSS (USS)")
    print("| run | N | nodes up s | python node | DHT child | p2pd | torch shm manager | fork server ", end="")
    print("| **node total PSS** | node total USS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in rows:
        cells = [f"{_mb(k, s, 'pss')} ({_mb(k, s, 'uss')})" for k in KINDS]
        server = f"{s.server.pss / 2**20:.0f} ({s.server.uss / 2**20:.0f})" if s.server.rss else "-"
        uss = [sum(p.uss for p in m.values()) / 2**20 for m in s.memory.values()]
        # each kind's peak, summed, plus the fork server's share: an upper bound (the peaks need not coincide)
        share = s.server.pss / max(s.nodes, 1)
        totals = [sum(p.pss for p in m.values()) + share for m in s.memory.values()]
        per_node = statistics.fmean(totals) / 2**20 if totals else float("nan")
        total_uss = f"{statistics.fmean(uss):.0f}" if uss else "-"
        print(f"| {s.label} | {s.nodes} | {s.up_s:.1f} | " + " | ".join(cells) + f" | {server} ", end="")
        print(f"| **{per_node:.0f}** | {total_uss} |")
    print("\nCPU per node-round (s, all nodes' processes up to the last sample, over the node-rounds done)")
    print("| run | N | python node | DHT child | p2pd | total |")
    print("|---|---|---|---|---|---|")
    for s in rows:
        cpu = {k: sum(m[k].cpu for m in s.memory.values() if k in m) / max(s.rounds_done, 1) for k in KINDS}
        per_kind = " | ".join(f"{cpu[k]:.3f}" for k in ("node", "dht", "p2pd"))
        print(f"| {s.label} | {s.nodes} | {per_kind} | {sum(cpu.values()):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--split", default="4/4", help="local/external groups per round")
    ap.add_argument("--compare-isolated", action="store_true", help="also run the first N with sharing off")
    ap.add_argument("--budget-s", type=float, default=900.0, help="per-run time limit")
    ap.add_argument("--launchers", default="fork", help="comma-separated: fork (the default), fresh, or both")
    ap.add_argument("--keep", type=Path, default=None, help="copy each run's logs and metrics here")
    ap.add_argument(
        "--min-generate", type=float, default=0.0,
        help="pace the nodes: each round's generation lasts at least this long (s), as a bigger model's would",
    )  # fmt: skip
    args = ap.parse_args()
    local, external = parse_split(args.split)
    launchers = [w.strip() for w in args.launchers.split(",")]
    if not set(launchers) <= {"fork", "fresh"}:
        ap.error("--launchers: use fork, fresh or fork,fresh")
    rows = []
    for n in args.nodes:
        for launcher in launchers:  # side by side, same N, one after the other
            paced = f" paced {args.min_generate:g}s" if args.min_generate else ""
            label = f"{args.model} {args.split} {launcher}{paced}"
            split = (local, external)
            fresh = launcher == "fresh"
            rows.append(
                run_swarm(label, n, args.rounds, args.model, split, args.budget_s, fresh, args.keep, args.min_generate)
            )
            print(f"N={n} {launcher} done in {rows[-1].wall_s:.0f}s", file=sys.stderr)
    isolated = None
    if args.compare_isolated:
        label = f"{args.model} {local + external}/0"
        split = (local + external, 0)
        isolated = run_swarm(label, args.nodes[0], args.rounds, args.model, split, args.budget_s)
    report(rows, isolated, psutil.cpu_count() or 0)


if __name__ == "__main__":
    main()
