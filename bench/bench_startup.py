"""Start-up time of one node: from exec to listening, to "up" and to its first round record.

Runs ``swarm-node start`` (a founder, no peer) or ``swarm-node join --peer <a running founder>`` as a
subprocess and times, from just before the exec:

- ``listen``: the node's port accepts a TCP connection (its p2pd is listening);
- ``up``: the node prints ``... is up at round N; listening on:`` (start-up done, see node.cli.serve);
- ``round``: the ``time`` of its first ``round`` record in metrics.jsonl (the end of round 0);

and the CPU seconds (user + system) the node's own process had used when it was seen listening
(``cpu_listen``) and after its first round (``cpu_round``; its DHT child and p2pd not counted): on a
machine shared with other work they show what start-up costs where wall time shows the contention.

Each node gets a fresh identity and log folder, so no address book or remembered port carries over.
Prints one line per run, the medians, and the load average before each run.

    .venv/bin/python bench/bench_startup.py --mode start --mode join --repeat 3 --model tiny-m

With ``--refusals`` it times instead how long each kind of bad start-up input takes to be refused (exec to
exit, status 2), beside a bare interpreter start: every one is checked before torch and hivemind load
(node.cli.preflight), so each should take well under a second.

    .venv/bin/python bench/bench_startup.py --refusals --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from node.observe.metrics import read_events

POLL_S = 0.01
TIMEOUT_S = 180.0
KEYS = ("listen", "up", "round", "cpu_listen", "cpu_round")


def free_port() -> int:
    """A port nothing listens on now (the node binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether 127.0.0.1:``port`` accepts a connection."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def node_command(mode: str, model: str, rounds: int, tmp: Path, port: int, peer: str | None) -> list[str]:
    """The node's command line (``python -m node`` is what the ``swarm-node`` script runs)."""
    cmd = [sys.executable, "-m", "node", mode, "--model", model, "--rounds", str(rounds)]
    cmd += ["--identity", str(tmp / "id.key"), "--log-dir", str(tmp / "runs"), "--host-port", f"127.0.0.1:{port}"]
    if peer is not None:
        cmd += ["--peer", peer]
    return cmd


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its threads included), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _watch_stdout(stream: IO[str], seen: dict[str, float], lines: list[str]) -> None:
    for line in stream:
        lines.append(line)
        if "listening on:" in line and "up" not in seen:
            seen["up"] = time.time()


def measure(mode: str, model: str, rounds: int, peer: str | None) -> dict[str, float]:
    """One start of one node: seconds from exec to ``listen``, ``up`` and ``round``; its CPU seconds then."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as d:
        tmp = Path(d)
        port = free_port()
        cmd = node_command(mode, model, rounds, tmp, port, peer)
        seen: dict[str, float] = {}
        cpu: dict[str, float] = {}
        lines: list[str] = []
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        reader = threading.Thread(target=_watch_stdout, args=(proc.stdout, seen, lines), daemon=True)
        reader.start()
        try:
            deadline = t0 + TIMEOUT_S
            while "round" not in seen and time.time() < deadline and proc.poll() is None:
                if "listen" not in seen and accepts(port):
                    seen["listen"] = time.time()
                    cpu["cpu_listen"] = cpu_seconds(proc.pid)
                for path in (tmp / "runs").glob("*/metrics.jsonl"):
                    first = next(read_events(path, "round"), None)
                    if first is not None:
                        seen["round"] = float(first["time"])
                        cpu["cpu_round"] = cpu_seconds(proc.pid)
                time.sleep(POLL_S)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(5)
        if set(seen) != {"listen", "up", "round"}:
            raise RuntimeError(f"{mode}: saw only {sorted(seen)}; output:\n{''.join(lines)[-3000:]}")
        return {**{k: v - t0 for k, v in seen.items()}, **cpu}


def start_founder(model: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A founder that runs one round and then idles until stopped (its rounds must not load the CPU the
    measured node starts on); returns it and its multiaddr once it is up."""
    ready = tmp / "ready.json"
    cmd = [*node_command("start", model, 1, tmp, free_port(), None), "--ready-file", str(ready), "--hold"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the founder did not start")
        time.sleep(0.1)
    addrs = json.loads(ready.read_text())["multiaddrs"]
    return proc, next(a for a in addrs if "/127.0.0.1/" in a)


def refusal_cases(tmp: Path, busy: int) -> dict[str, list[str]]:
    """name -> ``swarm-node`` arguments of one bad input each (the files they name are made here)."""
    (tmp / "afile").touch()
    (tmp / "folder").mkdir()
    (tmp / "bad.key").write_bytes(b"not a key")
    (tmp / "bad.key").chmod(0o600)
    peer = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJkHwJExtiW3QMDLqmbp3W"
    key = ["--identity", str(tmp / "id.key")]
    return {
        "log dir is a file": ["start", *key, "--log-dir", str(tmp / "afile")],
        "identity is a directory": ["start", "--identity", str(tmp / "folder")],
        "corrupt key file": ["start", "--identity", str(tmp / "bad.key")],
        "host-port out of range": ["start", *key, "--host-port", "99999"],
        "host-port in use": ["start", *key, "--host-port", f"127.0.0.1:{busy}"],
        "dashboard port in use": ["start", *key, "--dashboard-port", str(busy)],
        "truncated peer id": ["join", *key, "--peer", peer],
        "model folder without config.json": ["start", *key, "--model", str(tmp / "folder")],
        "client mode with announce": ["start", *key, "--client-mode", "--announce", "/ip4/1.2.3.4/tcp/5"],
        "abbreviated flag": ["start", *key, "--round", "1"],
    }


def time_refusal(argv: list[str]) -> float:
    """Seconds from exec to exit of one refused command; raises if it is not refused or leaves a process."""
    t0 = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, start_new_session=True)
    took = time.time() - t0
    if proc.returncode != 2 or not proc.stderr.startswith("swarm-node: error: "):
        raise RuntimeError(f"{argv[3:]} was not refused (status {proc.returncode}): {proc.stderr[-2000:]}")
    return took


def bench_refusals(repeat: int) -> None:
    """Median seconds of each refusal, beside ``python -c pass`` (the interpreter's own start)."""
    with tempfile.TemporaryDirectory(prefix="bench-refusals-") as d, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cases = refusal_cases(Path(d), busy.getsockname()[1])
        bare = statistics.median(_bare_start() for _ in range(repeat))
        print(f"{'python -c pass':34s} {bare:.2f}s  (load {' '.join(Path('/proc/loadavg').read_text().split()[:3])})")
        for name, args in cases.items():
            took = statistics.median(time_refusal([sys.executable, "-m", "node", *args]) for _ in range(repeat))
            print(f"{name:34s} {took:.2f}s", flush=True)


def _bare_start() -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", action="append", choices=("start", "join"), help="repeatable (default: both)")
    parser.add_argument("--model", default="tiny-m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--refusals", action="store_true", help="time the refusal of each kind of bad input")
    args = parser.parse_args()
    if args.refusals:
        bench_refusals(args.repeat)
        return
    results: dict[str, list[dict[str, float]]] = {}
    for mode in args.mode or ["start", "join"]:
        with tempfile.TemporaryDirectory(prefix="bench-founder-") as d:
            founder, peer = start_founder(args.model, Path(d)) if mode == "join" else (None, None)
            try:
                for i in range(args.repeat):
                    load = Path("/proc/loadavg").read_text().split()[:3]
                    r = measure(mode, args.model, args.rounds, peer)
                    results.setdefault(mode, []).append(r)
                    shown = "  ".join(f"{k} {r[k]:.2f}s" for k in KEYS)
                    print(f"{mode} #{i + 1}: {shown}  (load {' '.join(load)})", flush=True)
            finally:
                if founder is not None:
                    founder.send_signal(signal.SIGTERM)
                    founder.wait(30)
    for mode, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        print(f"{mode} median of {len(runs)}: " + "  ".join(f"{k} {v:.2f}s" for k, v in medians.items()))
    print(json.dumps({"loadavg_end": Path("/proc/loadavg").read_text().split()[:3], "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
