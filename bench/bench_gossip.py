"""Rollout gossip benchmark: publish -> every other peer fetched and verified, vs raw loopback TCP.

Usage: python bench/bench_gossip.py [--peers 4 8 16] [--rounds 6] [--budget-s 400] [--shape 16,16,4000]

``--shape GROUPS,COMPLETIONS,CHARS`` sets the batch (default ~1 MB; a tiny node's
batch of 4 groups x 8 one-character completions is ``4,8,1``, ~2 KB).

For each N, starts N exchange nodes as separate processes on 127.0.0.1
(tests/swarm/exchange_worker.py). Each round one peer (round-robin) publishes
a ~1 MB batch; the other N-1 are then told to collect at once. Latency is
from sending the publish command to the last peer's reply that it fetched and
verified that digest (it includes the DHT store, the DHT read, stdin/stdout
IPC and signature/schema verification). Beside it, the same number of bytes
is sent over raw loopback TCP from a separate server process: one transfer,
and N-1 concurrent transfers (the same fan-out).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: tests/ is importable from the repository root

from tests.procs import Procs  # noqa: E402
from tests.swarm.workers import WorkerProc, start_workers  # noqa: E402

SHAPE = {"groups": 16, "completions": 16, "chars": 4000}  # ~1.05 MB sealed

_SERVER = """
import socket, sys
size = int(sys.argv[1]); data = b"x" * size
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    if conn.recv(1) != b"g":
        break
    conn.sendall(data); conn.close()
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _pull(port: int, size: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"g")
        got = 0
        while got < size:
            chunk = c.recv(1 << 20)
            if not chunk:
                raise RuntimeError("server closed early")
            got += len(chunk)


def raw_tcp(size: int, fanout: int, reps: int) -> list[float]:
    """Seconds for ``fanout`` concurrent loopback pulls of ``size`` bytes from one server process."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(size)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        times = []
        for _ in range(reps):
            threads = [threading.Thread(target=_pull, args=(port, size)) for _ in range(fanout)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            times.append(time.perf_counter() - t0)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"q")
        return times
    finally:
        server.kill()
        server.wait(5)


def gossip_round(workers: list[WorkerProc], publisher: int, rnd: int) -> tuple[float, list[float], dict[str, Any]]:
    """(publish -> all verified seconds, per-peer collect seconds, descriptor) for one round."""
    pub, others = workers[publisher], [w for i, w in enumerate(workers) if i != publisher]
    t0 = time.perf_counter()
    desc = pub.request(cmd="publish", round=rnd, **SHAPE)
    for w in others:
        w.send(cmd="collect", since=desc["created"] - 1e-3, limit=len(workers))
    collects = [desc["publish_s"]]  # first entry: the publish itself (seal + DHT store)
    for w in others:
        res = w.reply(30.0)
        if desc["digest"] not in [a[1] for a in res["accepted"]]:
            raise RuntimeError(f"peer {w.peer_id[-6:]} did not get the batch: {res['rejected']} {res['failed']}")
        collects.append(res["elapsed_s"])
    return time.perf_counter() - t0, collects, desc


def bare_pulls(
    workers: list[WorkerProc], desc: dict[str, Any], publisher: WorkerProc, reps: int
) -> list[dict[str, Any]]:
    """Timed single stream pulls of the same payload, one peer at a time (no DHT, no contention)."""
    out = []
    for i in range(reps):
        w = [x for x in workers if x is not publisher][i % (len(workers) - 1)]
        out.append(w.request(cmd="fetch", peer=publisher.peer_id, digest=desc["digest"], size=desc["size"]))
    return out


def bench_n(n: int, rounds: int, deadline: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp))
        workers: list[WorkerProc] = []
        try:
            t_start = time.perf_counter()
            workers = start_workers(procs, n, tag=f"n{n}-", ready_timeout=30.0 + 5.0 * n)
            startup = time.perf_counter() - t_start
            gossip_round(workers, 0, 0)  # warm-up: opens connections
            lat: list[float] = []
            pulls: list[float] = []
            publishes: list[float] = []
            desc: dict[str, Any] = {}
            for r in range(rounds):
                if time.monotonic() > deadline:
                    break
                total, collects, desc = gossip_round(workers, r % n, r + 1)
                lat.append(total)
                publishes.append(collects[0])
                pulls += collects[1:]
            publisher = workers[(len(lat) - 1) % n]
            bare = bare_pulls(workers, desc, publisher, 10)
        finally:
            for w in workers:
                w.quit()
            procs.reap(settle=3.0, grace=2.0)
    size = int(desc["size"])
    raw1 = raw_tcp(size, 1, 10)
    rawn = raw_tcp(size, n - 1, 10)
    return {
        "n": n, "rounds": len(lat), "size": size, "startup_s": startup,
        "p50": pct(lat, 0.5), "p95": pct(lat, 0.95), "pull_p50": pct(pulls, 0.5), "pull_p95": pct(pulls, 0.95),
        "raw1_p50": statistics.median(raw1), "rawn_p50": statistics.median(rawn),
        "publish_p50": statistics.median(publishes),
        "bare_p50": statistics.median(b["fetch_s"] for b in bare),
        "verify_p50": statistics.median(b["verify_s"] for b in bare),
    }  # fmt: skip


def _size(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def report(rows: list[dict[str, float]]) -> None:
    mb, ms = 1e6, 1e3
    print("\nEnd to end: publish -> every other peer fetched and verified (1 publisher, N-1 collectors)")
    print(
        "| N | rounds | payload | p50 / p95 | of which publish() p50 | fan-out goodput "
        "| raw TCP, N-1 concurrent pulls | ratio p50 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        goodput = r["size"] * (r["n"] - 1) / r["p50"] / mb
        print(
            f"| {r['n']:.0f} | {r['rounds']:.0f} | {_size(r['size'])} "
            f"| {r['p50'] * ms:.0f} / {r['p95'] * ms:.0f} ms | {r['publish_p50'] * ms:.0f} ms "
            f"| {goodput:.1f} MB/s "
            f"| {r['rawn_p50'] * ms:.1f} ms ({r['size'] * (r['n'] - 1) / r['rawn_p50'] / mb:.0f} MB/s) "
            f"| {r['p50'] / r['rawn_p50']:.0f}x |"
        )
    print("\nOne pull of the same payload")
    print(
        "| N | collect() p50 / p95 (DHT read + fetch + verify, under fan-out) | bare stream pull p50 "
        "| verify p50 | raw TCP pull p50 | ratio bare/raw |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:.0f} | {r['pull_p50'] * ms:.0f} / {r['pull_p95'] * ms:.0f} ms "
            f"| {r['bare_p50'] * ms:.1f} ms ({r['size'] / r['bare_p50'] / mb:.0f} MB/s) "
            f"| {r['verify_p50'] * ms:.1f} ms "
            f"| {r['raw1_p50'] * ms:.1f} ms ({r['size'] / r['raw1_p50'] / mb:.0f} MB/s) "
            f"| {r['bare_p50'] / r['raw1_p50']:.1f}x |"
        )
    for r in rows:
        print(f"(N={r['n']:.0f}: {r['n']:.0f} worker processes started and joined in {r['startup_s']:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting new rounds after this")
    ap.add_argument("--shape", default="16,16,4000", help="GROUPS,COMPLETIONS,CHARS of the published batch")
    args = ap.parse_args()
    groups, completions, chars = (int(x) for x in args.shape.split(","))
    SHAPE.update(groups=groups, completions=completions, chars=chars)
    deadline = time.monotonic() + args.budget_s
    rows = []
    for n in args.peers:
        if n < 2:
            raise SystemExit("--peers values must be >= 2")
        try:
            rows.append(bench_n(n, args.rounds, deadline))
        except (TimeoutError, RuntimeError) as e:  # report the sizes that worked; say which one did not
            print(f"N={n} failed: {e}", file=sys.stderr)
            continue
        print(f"N={n} done", file=sys.stderr)
    report(rows)


if __name__ == "__main__":
    main()
