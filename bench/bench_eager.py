"""Training throughput with the outer sync off, blocking, and beside training (eager): issue 16.

Each mode runs three ``tests/sync_worker.py`` processes on 127.0.0.1 (one
after another, each mode on a quiet machine): simulated compute (every inner
step sleeps ``--step-sleep``) and a real outer sync (hivemind DHT
matchmaking, all-reduce of the model's pseudo-gradients, commit vote) every
``--sync-every`` steps:

* ``off``: the sync is never due (``sync_every`` past the last step);
* ``blocking``: ``OuterSync.maybe_sync``, training waits for every sync;
* ``eager``: ``SyncRunner``, the sync runs on a thread and its outcome is
  applied at a later step boundary (async DiLoCo's "eager updates").

Per mode it prints the median over workers of steps/s (inner steps over the
loop's wall time; leaving ends an eager sync still gathering at the last
step, so ``--steps`` should leave a sync's time after the last one), the
share of that time spent inside sync calls, the syncs committed, and the
ratios to ``off``. With ``--uneven-s``, it also runs eager workers at
uneven speeds (the last one 2x slower) for that long, syncing every
``--sync-every`` steps and then on wall-time epochs of the same length, and
prints how many syncs committed with all of them, with fewer, and how many
were ended by leaving (a sync still gathering when training stopped).

Usage::

    .venv/bin/python bench/bench_eager.py --steps 120 --sync-every 25 --step-sleep 0.1 --uneven-s 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: tests/ is importable from the repository root

from swarm.sync.config import AbortCause  # noqa: E402
from tests.faults import FaultSwarm, final_state  # noqa: E402
from tests.procs import Procs  # noqa: E402

MODES = ("off", "blocking", "eager")
PEERS = 3


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Run ``PEERS`` workers in ``mode``; the medians of their throughput and sync figures."""
    every = args.steps + 1 if mode == "off" else args.sync_every
    worker = ["--steps", str(args.steps), "--sync-every", str(every), "--step-sleep", str(args.step_sleep)]
    worker += ["--arch", args.arch, "--linger", "10"]
    worker += ["--eager"] if mode == "eager" else []
    root.mkdir(parents=True)
    swarm = FaultSwarm(Procs(root))
    try:
        peers = swarm.start_many({f"p{i}": (*worker, "--update-seed", str(i + 1)) for i in range(PEERS)})
        swarm.go()
        dones = [final_state(p, args.timeout) for p in peers]
        syncs = [p.syncs() for p in peers]
    finally:
        swarm.close()
    rates = [d["steps"] / d["train_s"] for d in dones]
    return {
        "mode": mode,
        "steps_s": statistics.median(rates),
        "waited": statistics.median(d["waited_s"] / d["train_s"] for d in dones),
        "committed": statistics.median(sum(r["committed"] for r in s) for s in syncs),
        "syncs": statistics.median(len(s) for s in syncs),
        "sync_s": statistics.median([r["sync_s"] for s in syncs for r in s] or [0.0]),
        "skipped": max(d["skipped_busy"] for d in dones),
        "hashes": _hashes_agree(syncs),
    }


def run_uneven(schedule: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Eager workers for ``--uneven-s`` each, the last one 2x slower: sync on wall-time epochs or every H steps.

    Both schedules aim at one sync per ``sync_every x step_sleep`` seconds of the fast workers.
    """
    period = args.sync_every * args.step_sleep
    when = ["--period", str(period)] if schedule == "period" else ["--sync-every", str(args.sync_every)]
    root.mkdir(parents=True)
    swarm = FaultSwarm(Procs(root))
    specs = {}
    for i in range(PEERS):
        sleep = args.step_sleep * (2 if i == PEERS - 1 else 1)
        steps = int(args.uneven_s / sleep)
        worker = ["--eager", *when, "--steps", str(steps), "--step-sleep", str(sleep), "--arch", args.arch]
        specs[f"p{i}"] = (*worker, "--linger", "10", "--update-seed", str(i + 1))
    try:
        peers = swarm.start_many(specs)
        swarm.go()
        for p in peers:
            final_state(p, args.timeout)
        syncs = [p.syncs() for p in peers]
    finally:
        swarm.close()
    every = [r for s in syncs for r in s]
    missed = Counter(f"{r['reason']} {r.get('cause', '')}".strip() for r in every if not r["committed"])
    print(f"# uneven {schedule}: not committed {dict(missed)}", file=sys.stderr, flush=True)
    return {
        "schedule": schedule if schedule == "steps" else f"{period:g} s",
        "syncs": len(every),
        "full": sum(r["committed"] and r["group_size"] == PEERS for r in every),
        "partial": sum(r["committed"] and r["group_size"] < PEERS for r in every),
        "caught_up": sum(r["caught_up"] for r in every),
        "left": sum(r.get("cause") == AbortCause.SHUTTING_DOWN.value for r in every),
        "slow": f"{sum(r['committed'] for r in syncs[-1])}/{len(syncs[-1])}",
        "hashes": _hashes_agree(syncs),
    }


def _hashes_agree(syncs: list[list[dict[str, Any]]]) -> bool:
    """Whether every committed revision has one state hash across the workers."""
    seen: dict[int, set[str]] = {}
    for s in syncs:
        for r in s:
            if r["committed"]:
                seen.setdefault(r["revision"], set()).add(r["state_hash"])
    return all(len(h) == 1 for h in seen.values())


def _print_uneven(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print(f"\nuneven speeds (the last of {PEERS} workers 2x slower), eager:")
    head = [("schedule", 8), ("syncs", 6), ("all 3", 6), ("fewer", 6), ("left", 5), ("catch-ups", 9), ("slow ok", 8)]
    print(" ".join(f"{c:>{w}}" for c, w in [*head, ("hashes", 6)]))
    for r in rows:
        print(
            f"{r['schedule']:>8} {r['syncs']:>6} {r['full']:>6} {r['partial']:>6} {r['left']:>5} {r['caught_up']:>9} "
            f"{r['slow']:>8} {'same' if r['hashes'] else 'SPLIT':>6}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="inner steps per worker")
    parser.add_argument("--sync-every", type=int, default=25, help="inner steps between syncs (H)")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="simulated compute per inner step, s")
    parser.add_argument("--arch", default="512,512,512", help="layer widths (default ~0.5M parameters)")
    parser.add_argument("--timeout", type=float, default=90.0, help="bound per mode once released, s")
    parser.add_argument("--uneven-s", type=float, default=0.0, help="also run uneven speeds this long (0: no)")
    args = parser.parse_args()
    rows = []
    uneven = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-eager-") as tmp:
        for mode in MODES:
            t = time.monotonic()
            rows.append(run_mode(mode, args, Path(tmp) / mode))
            print(f"# {mode} done in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
        for schedule in ("steps", "period") if args.uneven_s else ():
            t = time.monotonic()
            uneven.append(run_uneven(schedule, args, Path(tmp) / f"uneven-{schedule}"))
            print(f"# uneven {schedule} done in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
    off = rows[0]["steps_s"]
    head = [("mode", 8), ("steps/s", 8), ("x off", 6), ("waited", 7), ("commits", 8), ("sync_s", 7), ("skipped", 7)]
    print(" ".join(f"{c:>{w}}" for c, w in [*head, ("hashes", 6)]))
    for r in rows:
        commits = f"{r['committed']:g}/{r['syncs']:g}"
        print(
            f"{r['mode']:>8} {r['steps_s']:>8.2f} {r['steps_s'] / off:>6.2f} {r['waited']:>7.1%} {commits:>8} "
            f"{r['sync_s']:>7.2f} {r['skipped']:>7} {'same' if r['hashes'] else 'SPLIT':>6}"
        )
    _print_uneven(uneven)
    print(
        f"# {PEERS} workers per mode, step sleep {args.step_sleep} s, sync every {args.sync_every} steps, "
        f"{args.steps} steps, arch {args.arch}; {time.monotonic() - started:.0f} s in all",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
