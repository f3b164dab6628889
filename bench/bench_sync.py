"""Outer-sync benchmark: 4 peer processes on 127.0.0.1, beside a raw loopback TCP copy of the same bytes.

For each model size, four ``tests/sync_worker.py`` processes (a 2-layer
``nn.Linear`` model of about that many parameters) run ``--rounds-per``
syncs with each encoding (none, fp16, int8). Per encoding it reports the
median over rounds of:

* ``sync_s``: the whole ``sync_now`` (gather window, all-reduce, vote, apply);
* ``ar_s``: reduce-scatter + all-gather + assembling (what bytes cost);
* ``MB/peer``: tensor bytes one peer sent in the round;
* ``tcp_s``: one raw loopback TCP connection moving the bytes *all four*
  peers sent in that round, measured in the same run; ``ar/tcp`` is the ratio.

Usage::

    .venv/bin/python bench/bench_sync.py --sizes 1,10,50 --rounds-per 2
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: tests/ is importable from the repository root

from swarm.identity import load_or_create  # noqa: E402
from tests.procs import PYTHON, Procs, wait_for  # noqa: E402

WORKER = REPO / "tests" / "sync_worker.py"
ENCODINGS = ("none", "fp16", "int8")


def tcp_copy_seconds(n_bytes: int) -> float:
    """Seconds to push ``n_bytes`` through one loopback TCP connection (1 MiB writes)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    done = threading.Event()

    def receive() -> None:
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        got = 0
        with conn:
            while got < n_bytes:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                got += n
        done.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    chunk = b"\x00" * (1 << 20)
    start = time.perf_counter()
    with socket.create_connection(server.getsockname()) as out:
        left = n_bytes
        while left > 0:
            out.sendall(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        done.wait(120.0)
    elapsed = time.perf_counter() - start
    server.close()
    return elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_size(width: int, rounds_per: int, root: Path, timeout_s: float) -> list[dict[str, Any]]:
    """Run 4 peers with a width x width (+ bias) Linear model; return all their sync records."""
    root.mkdir(parents=True)
    port = _free_port()
    boot = f"/ip4/127.0.0.1/tcp/{port}/p2p/{load_or_create(root / 'p0.key').peer_id}"
    n_syncs = rounds_per * len(ENCODINGS)
    procs = Procs(root)  # each peer in its own session, logs in root/pI.log; all reaped below
    try:
        for i in range(4):
            cmd = [PYTHON, str(WORKER), "--identity", str(root / f"p{i}.key")]
            cmd += ["--report", str(root / f"p{i}.jsonl"), "--go-file", str(root / "go")]
            cmd += ["--stop-file", str(root / "stop"), "--arch", f"{width},{width}", "--update-seed", str(i + 1)]
            cmd += ["--steps", str(n_syncs), "--sync-every", "1", "--step-sleep", "0", "--linger", "5"]
            cmd += ["--compression", ",".join(ENCODINGS), "--rounds-per", str(rounds_per)]
            cmd += ["--timeouts", "1.0,120,15,5,60,15"]
            cmd += ["--port", str(port)] if i == 0 else ["--initial-peer", boot]
            procs.start(f"p{i}", cmd)
        _wait_lines(procs, "ready", 1, timeout_s, watch=True)  # a peer that exits before it is up has crashed
        (root / "go").touch()
        _wait_lines(procs, "done", 1, timeout_s, watch=False)  # finished peers linger 5 s, then exit
    finally:
        (root / "stop").touch()
        procs.reap(settle=20.0, grace=2.0)
    return [r for i in range(4) for r in _records(root / f"p{i}.jsonl") if r.get("event") == "sync"]


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _wait_lines(procs: Procs, event: str, per_peer: int, timeout_s: float, watch: bool) -> None:
    def reported() -> bool:
        counts = [sum(1 for r in _records(procs.root / f"p{i}.jsonl") if r.get("event") == event) for i in range(4)]
        return min(counts) >= per_peer

    wait_for(reported, timeout_s, f"every peer to report {event!r}", poll=0.2, watch=procs.groups if watch else ())


def summarize(params: int, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for enc in ENCODINGS:
        mine = [r for r in records if r.get("compression") == enc]
        ok = [r for r in mine if r["committed"]]
        failed = sorted({r["reason"] for r in mine if not r["committed"]})
        if failed:
            print(f"# {params / 1e6:.1f}M {enc}: not committed: {failed}", file=sys.stderr, flush=True)
        if not ok:
            rows.append({"params": params, "enc": enc, "committed": f"0/{len(mine)}"})
            continue
        by_step: dict[int, int] = {}
        for r in ok:
            by_step[r["step"]] = by_step.get(r["step"], 0) + r["bytes_sent"]
        total = int(statistics.median(by_step.values()))
        tcp = statistics.median(tcp_copy_seconds(total) for _ in range(3))
        ar = statistics.median(r["allreduce_s"] for r in ok)
        rows.append(
            {
                "params": params,
                "enc": enc,
                "committed": f"{len(ok)}/{len(mine)}",
                "sync_s": statistics.median(r["sync_s"] for r in ok),
                "ar_s": ar,
                "mb_peer": statistics.median(r["bytes_sent"] for r in ok) / 1e6,
                "tcp_s": tcp,
                "ratio": ar / tcp,
                "hashes": len({(r["revision"], r["state_hash"]) for r in ok}) / max(1, len(by_step)),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,50", help="millions of parameters")
    parser.add_argument("--rounds-per", type=int, default=2, help="syncs per encoding")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound per size, seconds")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        for millions in (float(s) for s in args.sizes.split(",")):
            width = int((millions * 1e6) ** 0.5)
            params = width * width + width
            t = time.monotonic()
            records = run_size(width, args.rounds_per, Path(tmp) / f"m{millions:g}", args.timeout)
            rows += summarize(params, records)
            print(f"# {params / 1e6:.1f}M done in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
    cols = [("params", 8), ("enc", 5), ("ok", 5), ("sync_s", 7), ("ar_s", 7), ("MB/peer", 8), ("tcp_s", 7)]
    print(" ".join(f"{c:>{w}}" for c, w in [*cols, ("ar/tcp", 7), ("states/rnd", 10)]))
    for r in rows:
        if "sync_s" not in r:
            print(f"{r['params'] / 1e6:>7.1f}M {r['enc']:>5} {r['committed']:>5}  (no committed round)")
            continue
        print(
            f"{r['params'] / 1e6:>7.1f}M {r['enc']:>5} {r['committed']:>5} {r['sync_s']:>7.2f} {r['ar_s']:>7.2f} "
            f"{r['mb_peer']:>8.1f} {r['tcp_s']:>7.3f} {r['ratio']:>7.1f} {r['hashes']:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
