"""Uneven same-model peers with the outer sync: rounds done and syncs committed, three schedules side by side.

Three real ``swarm-node`` processes on 127.0.0.1 run the same model (``tiny-s``);
the third does twice the work per round (``--local 4`` instead of 2) and runs
under ``nice -n 19``, so its rounds take twice as long or more (issue 16's "3
same-model peers, one niced"). Rounds take ~0.5-1 s (``--max-new-tokens``),
so a schedule counted in rounds drifts apart by more than the 5 s gather
window within a few syncs. Each mode runs the
same swarm for ``--seconds`` after all three are up, one mode after the other:

* ``off``: no outer sync (the throughput ceiling);
* ``steps-blocking``: ``--sync-every H --sync-blocking``, the schedule and the
  blocking sync main had before issue 16;
* ``period-eager``: ``--sync-period S``, epochs of wall time, the sync running
  beside training (the default now).

Per mode and node it reports rounds per second (and the ratio to ``off``),
sync attempts by outcome, the committed group sizes, and catch-ups, from the
nodes' own ``metrics.jsonl``.

Usage::

    .venv/bin/python bench/bench_uneven.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: tests/ is importable from the repository root

from node.observe.metrics import read_events  # noqa: E402
from protocol import short_id  # noqa: E402
from tests.procs import PYTHON, Procs, wait_for  # noqa: E402

NODE_ARGS = ("--model", "tiny-s", "--generations", "8", "--max-new-tokens", "96", "--max-threads", "1", "--rounds", "0")
NODE_ARGS_MORE = ("--checkpoint-every", "0")
LOCAL = {"a": "2", "b": "2", "slow": "4"}
NAMES = ("a", "b", "slow")


def mode_flags(mode: str, every: int, period: float) -> list[str]:
    if mode == "off":
        return []
    if mode == "steps-blocking":
        return ["--sync-every", str(every), "--sync-blocking"]
    return ["--sync-period", str(period)]


def run_mode(root: Path, mode: str, seconds: float, every: int, period: float) -> dict[str, Any]:
    """Start the three nodes, release them together, run ``seconds``, stop them; their figures."""
    out = root / mode
    (out / "keys").mkdir(parents=True)
    go = out / "go"
    with Procs(out) as procs:
        ready: dict[str, dict[str, Any]] = {}
        for name in NAMES:
            cmd = [PYTHON, "-m", "node", "start" if name == "a" else "join"]
            if name != "a":
                cmd += ["--peer", ready["a"]["multiaddrs"][0]]
            cmd += ["--identity", str(out / "keys" / f"{name}.key"), "--log-dir", str(out / "runs")]
            cmd += ["--host-port", "127.0.0.1:0", "--ready-file", str(out / f"{name}.ready"), "--go-file", str(go)]
            cmd += [*NODE_ARGS, *NODE_ARGS_MORE, "--local", LOCAL[name], *mode_flags(mode, every, period)]
            if name == "slow":
                cmd = ["nice", "-n", "19", *cmd]
            procs.start(name, cmd, log=out / f"{name}.log")
            path = out / f"{name}.ready"
            wait_for(path.exists, 120, f"{mode}: {name} to come up")
            ready[name] = json.loads(path.read_text())
        go.touch()
        t0 = time.time()
        time.sleep(seconds)  # the workload: the nodes run for the measured time
        t1 = time.time()
        procs.reap(grace=30.0)
    return {name: figures(out / "runs", ready[name]["peer"], t0, t1) for name in NAMES}


def figures(runs: Path, peer: str, t0: float, t1: float) -> dict[str, Any]:
    """One node's rounds per second and sync outcomes in ``[t0, t1]``."""
    path = runs / short_id(peer) / "metrics.jsonl"
    rounds = [e for e in read_events(path, "round") if t0 <= e["time"] <= t1]
    syncs = [e for e in read_events(path, "sync") if t0 <= e["time"] <= t1]
    outcomes = Counter(e["reason"] for e in syncs)
    return {
        "rounds_per_s": len(rounds) / (t1 - t0),
        "syncs": dict(outcomes),
        "causes": dict(
            Counter(e.get("cause") or "" for e in syncs if not e["committed"] and e["reason"] != "no partner")
        ),
        "committed_group_sizes": dict(Counter(e["group_size"] for e in syncs if e["committed"])),
        "caught_up": sum(bool(e.get("caught_up")) for e in syncs),
        "sync_s_median": sorted(e["sync_s"] for e in syncs)[len(syncs) // 2] if syncs else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per mode")
    p.add_argument("--every", type=int, default=8, help="--sync-every of the steps-blocking mode")
    p.add_argument("--period", type=float, default=10.0, help="--sync-period of the period-eager mode")
    p.add_argument("--modes", default="off,steps-blocking,period-eager")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-uneven-") as tmp:
        for mode in args.modes.split(","):
            results[mode] = run_mode(Path(tmp), mode, args.seconds, args.every, args.period)
            print(mode, json.dumps(results[mode]), flush=True)
    base = results.get("off")
    print(f"\n{'mode':16} {'node':5} {'rounds/s':>9} {'x off':>6}  syncs (committed group sizes) [causes]")
    for mode, nodes in results.items():
        for name, f in nodes.items():
            ratio = f["rounds_per_s"] / base[name]["rounds_per_s"] if base and base[name]["rounds_per_s"] else None
            shown = "-" if ratio is None else f"{ratio:.2f}"
            print(
                f"{mode:16} {name:5} {f['rounds_per_s']:9.2f} {shown:>6}  {f['syncs']} "
                f"({f['committed_group_sizes']}) [{f['causes']}] caught_up={f['caught_up']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
