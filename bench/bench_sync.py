"""Outer-sync benchmark: our all-reduce beside hivemind's and beside a raw TCP mesh, 4 peers on a link.

For each model size (``--sizes``, millions of float32 parameters: one
``nn.Linear(w, w)``, w = int(sqrt(M * 1e6))) and each encoding (none, fp16,
int8), up to three parts run one after the other, each as 4 peer processes:

* ``ours``: ``tests/sync_worker.py`` runs ``--rounds-per`` syncs per encoding;
  ``sync_s`` is the whole ``sync_now`` (gather window, all-reduce, vote,
  apply), ``ar_s`` reduce-scatter + all-gather + assembling, ``MB/peer`` the
  tensor bytes one peer sent, ``states/rnd`` the distinct (revision, state
  hash) per committed round across peers (1 = bit-identical everywhere);
* ``hivemind``: ``bench/hivemind_avg_worker.py``, hivemind's own
  ``DecentralizedAverager`` on the same tensor shapes (``NoCompression``,
  ``Float16Compression``, ``Uniform8BitQuantization``), pre-scheduled as
  hivemind's Optimizer does it: matchmaking first, then only trigger to result
  is timed (``hm_s``). ``hm_ok`` counts peer-rounds that formed a group of 4 and
  really averaged (every peer's sum of values after the round is the mean of
  the sums before it: hivemind reports success even when it dropped parts);
  ``hm_states`` the distinct hashes of the averaged tensors per round across
  peers (1 = bit-identical);
* ``mesh``: ``bench/mesh_worker.py``, the same bytes per element moved over
  plain sockets in the butterfly pattern (slice j to its owner j, then each
  owner's slice to every other peer), no arithmetic: the floor (``mesh_s``;
  ``MBmesh`` the bytes one peer sent).

Times are medians over peer-rounds after each encoding's first ``--warmup``
rounds (cold connections, first-touch memory: shown as ``ar1_s`` / ``hm1_s``).
``ar/hm`` and ``ar/mesh`` are our ``ar_s`` over theirs. ``rss_*`` is the largest
peak RSS of a peer (MB, ru_maxrss over the whole run of all encodings, so one value per size; the DHT child and p2pd are
not counted for either; for hivemind the larger of the peer's main process and
its averager process, the forked child that runs the all-reduce on the shared
tensors); ``/mdl`` divides by the model's float32 size ``mdl_MB``. ``+ours`` is
our peak RSS minus the worker's RSS with everything imported and no model yet:
the model, the sync's state (the anchor, and the momentum where ``--outer-momentum``
is above 0) and every round's buffers. The outer step is a node's default (plain
averaging: ``--outer-lr 1 --outer-momentum 0``) unless told otherwise.

Links (``--links``): ``lo`` runs the 4 peers on 127.0.0.1, where bytes are
nearly free; a rate such as ``100`` or ``1000`` (Mbit/s) puts each peer in its
own network namespace behind a veth shaped to that rate each way
(bench/links.py: needs root; without it the bench says so and runs ``lo``
only); ``veth`` is the same namespaces unshaped. On a shaped link
``floor_s`` is the time a peer's ``MB/peer`` takes at the rate (upload and
download run in parallel, so one of them), and ``ar/flr``, ``hm/flr`` and
``msh/flr`` are each part's time over it. ``t/bytes`` is an encoding's
``ar_s`` over the uncompressed one's, divided by its bytes over theirs: 1.0
when time is proportional to bytes.

Usage::

    .venv/bin/python bench/bench_sync.py --sizes 1,10,50 --rounds-per 2 [--only ours,hivemind,mesh] [--keep DIR]
        [--aggregator RULE] [--outer-lr 0.7 --outer-momentum 0.9] [--links lo,1000,100]

``--keep DIR`` leaves every peer's JSON-lines report and log in DIR (a new folder).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: tests/ is importable from the repository root

from bench import links as netlinks  # noqa: E402
from bench.peer_common import ENCODINGS  # noqa: E402
from swarm.identity import load_or_create  # noqa: E402
from swarm.sync import OuterSyncConfig  # noqa: E402
from tests.procs import PYTHON, Procs, wait_for  # noqa: E402

WORKER = REPO / "tests" / "sync_worker.py"
HM_WORKER = REPO / "bench" / "hivemind_avg_worker.py"
MESH_WORKER = REPO / "bench" / "mesh_worker.py"
PARTS = ("ours", "hivemind", "mesh")
PEERS = 4
Records = list[dict[str, Any]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Net:
    """Where the peers run: all on 127.0.0.1 (``links`` None), or each in its namespace of ``links``."""

    def __init__(self, links: netlinks.Links | None) -> None:
        self.links = links

    def host(self, i: int) -> str:
        return self.links.host(i) if self.links else "127.0.0.1"

    def cmd(self, i: int, cmd: list[str]) -> list[str]:
        return [*self.links.prefix(i), *cmd] if self.links else cmd


def run_ours(
    width: int, rounds_per: int, root: Path, timeout_s: float, aggregator: str, outer: tuple[float, float], net: Net
) -> Records:
    """Run 4 sync peers with a width x width (+ bias) Linear model; return all their records."""
    port = _free_port()
    boot = f"/ip4/{net.host(0)}/tcp/{port}/p2p/{load_or_create(root / 'p0.key').peer_id}"
    n_syncs = rounds_per * len(ENCODINGS)
    procs = Procs(root)  # each peer in its own session, logs in root/pI.log; all reaped below
    try:
        for i in range(PEERS):
            cmd = [PYTHON, str(WORKER), "--identity", str(root / f"p{i}.key")]
            cmd += ["--report", str(root / f"p{i}.jsonl"), "--go-file", str(root / "go")]
            cmd += ["--stop-file", str(root / "stop"), "--arch", f"{width},{width}", "--update-seed", str(i + 1)]
            cmd += ["--steps", str(n_syncs), "--sync-every", "1", "--step-sleep", "0", "--linger", "5"]
            cmd += ["--compression", ",".join(ENCODINGS), "--rounds-per", str(rounds_per)]
            # the node's 5 s gather window: 4 peers on 2 cores reach a round up to ~1.6 s apart at 50M
            cmd += ["--timeouts", "5.0,120,15,5,300,15", "--aggregator", aggregator]
            cmd += ["--outer-lr", str(outer[0]), "--outer-momentum", str(outer[1])]
            cmd += ["--port", str(port)] if i == 0 else ["--initial-peer", boot]
            procs.start(f"p{i}", net.cmd(i, [*cmd, "--host", net.host(i)]))
        _wait_ready(procs, timeout_s)
        (root / "go").touch()
        _wait_done(procs, timeout_s)  # finished peers linger 5 s, then exit
    finally:
        (root / "stop").touch()
        procs.reap(settle=20.0, grace=2.0)
    return _all_records(root)


def run_hivemind(width: int, rounds_per: int, root: Path, timeout_s: float, net: Net) -> Records:
    """Run 4 hivemind averager peers (the first one bootstraps the others' DHTs); return their records."""
    procs = Procs(root)
    try:
        procs.start("p0", net.cmd(0, _hm_cmd(0, width, rounds_per, root, [], net.host(0))))
        ready = wait_for(lambda: _first(root / "p0.jsonl", "ready"), timeout_s, "p0 ready", watch=procs.groups)
        for i in range(1, PEERS):
            procs.start(f"p{i}", net.cmd(i, _hm_cmd(i, width, rounds_per, root, ready["maddrs"], net.host(i))))
        _wait_done(procs, timeout_s)
    finally:
        procs.reap(settle=20.0, grace=2.0)
    return _all_records(root)


def _hm_cmd(rank: int, width: int, rounds_per: int, root: Path, boot: list[str], host: str) -> list[str]:
    cmd = [PYTHON, str(HM_WORKER), "--rank", str(rank), "--peers", str(PEERS), "--width", str(width), "--host", host]
    cmd += ["--seed", str(rank + 1), "--rounds-per", str(rounds_per), "--encodings", ",".join(ENCODINGS)]
    cmd += ["--report", str(root / f"p{rank}.jsonl"), "--barrier-dir", str(root)]
    return cmd + [arg for maddr in boot for arg in ("--initial-peer", maddr)]


def run_mesh(numel: int, rounds_per: int, root: Path, timeout_s: float, net: Net) -> Records:
    """Run the 4-peer raw TCP mesh; return its records."""
    procs = Procs(root)
    try:
        for i in range(PEERS):
            cmd = [PYTHON, str(MESH_WORKER), "--rank", str(i), "--peers", str(PEERS), "--numel", str(numel)]
            cmd += ["--rounds-per", str(rounds_per), "--encodings", ",".join(ENCODINGS), "--dir", str(root)]
            procs.start(f"p{i}", net.cmd(i, [*cmd, "--report", str(root / f"p{i}.jsonl"), "--host", net.host(i)]))
        _wait_done(procs, timeout_s)
    finally:
        procs.reap(settle=10.0, grace=2.0)
    return _all_records(root)


def _records(path: Path) -> Records:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _all_records(root: Path) -> Records:
    return [r for i in range(PEERS) for r in _records(root / f"p{i}.jsonl")]


def _first(path: Path, event: str) -> dict[str, Any] | None:
    return next((r for r in _records(path) if r.get("event") == event), None)


def _wait_ready(procs: Procs, timeout_s: float) -> None:
    def reported() -> bool:
        return all(_first(procs.root / f"p{i}.jsonl", "ready") for i in range(PEERS))

    # a peer that exits before it is up has crashed
    wait_for(reported, timeout_s, "every peer to report 'ready'", poll=0.2, watch=procs.groups)


def _wait_done(procs: Procs, timeout_s: float) -> None:
    """Wait for every peer's 'done'; fail at once when a peer exits without it (they exit right after theirs)."""

    def reported() -> bool:
        done = [_first(procs.root / f"{g.name}.jsonl", "done") is not None for g in procs.groups]
        dead = [g for g, d in zip(procs.groups, done, strict=True) if not d and not g.alive()]
        if dead and _first(procs.root / f"{dead[0].name}.jsonl", "done") is None:  # it may have just written it
            raise AssertionError(f"{dead[0].name} exited before 'done':\n{dead[0].log_tail()}")
        return all(done) and len(done) == PEERS

    wait_for(reported, timeout_s, "every peer to report 'done'", poll=0.2)


def _peak_rss(records: Records, *fields: str) -> float | None:
    """The largest of ``fields`` over every peer's ``done`` record (None if no peer got that far)."""
    values = [r.get(f, 0.0) for r in records if r.get("event") == "done" for f in fields]
    return max(values) if values else None


def _split_warmup(rounds: Records, key: str, warmup: int) -> tuple[Records, Records]:
    """(later rounds, first ``warmup`` rounds) of one encoding, rounds told apart by ``key``.

    The first round of a run pays for cold connections and first-touch memory on both sides (ours:
    0.6-0.9 s against 0.25 s at 10M; hivemind's 0.9 s against 0.6 s), so medians use the later ones,
    and the first is shown beside them.
    """
    first = set(sorted({r[key] for r in rounds})[:warmup])
    return [r for r in rounds if r[key] not in first], [r for r in rounds if r[key] in first]


def summarize_ours(records: Records, params: int, warmup: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    rss = _peak_rss(records, "peak_rss_mb")
    for enc in ENCODINGS:
        mine = [r for r in records if r.get("event") == "sync" and r.get("compression") == enc]
        ok = [r for r in mine if r["committed"]]
        failed = sorted({r["reason"] for r in mine if not r["committed"]})
        if failed:
            print(f"# {params / 1e6:.1f}M {enc}: not committed: {failed}", file=sys.stderr, flush=True)
        row: dict[str, Any] = {"ok": f"{len(ok)}/{len(mine)}", "rss_ours": rss}
        ready = [r for r in records if r.get("event") == "ready" and "base_rss_mb" in r]
        if ready and rss is not None:
            # what the model, the sync state and every round's buffers add to a process with everything imported
            row["added_ours"] = rss - min(r["base_rss_mb"] for r in ready)
        ok, cold = _split_warmup(ok, "step", warmup)
        if cold:
            row["ar1_s"] = statistics.median(r["allreduce_s"] for r in cold)
        if ok:
            rounds = {r["step"] for r in ok}
            row["sync_s"] = statistics.median(r["sync_s"] for r in ok)
            row["ar_s"] = statistics.median(r["allreduce_s"] for r in ok)
            row["mb_peer"] = statistics.median(r["bytes_sent"] for r in ok) / 1e6
            row["states"] = len({(r["revision"], r["state_hash"]) for r in ok}) / len(rounds)
        out[enc] = row
    return out


def summarize_hivemind(records: Records, params: int, warmup: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    rss = _peak_rss(records, "peak_rss_mb", "averager_peak_rss_mb")
    if any(r.get("int8_extract_patched") for r in records):
        print("# hivemind: its 8-bit decoding was patched for NumPy 2 (bench/hivemind_avg_worker.py)", file=sys.stderr)
    for enc in ENCODINGS:
        mine = [r for r in records if r.get("event") == "round" and r.get("encoding") == enc]
        for r in mine:
            if "error" in r:
                print(f"# {params / 1e6:.1f}M hivemind {enc}: {r['error']}", file=sys.stderr, flush=True)
        ok = [r for r in mine if r.get("group_size") == PEERS and _averaged(r, mine, params)]
        row: dict[str, Any] = {"hm_ok": f"{len(ok)}/{len(mine)}", "rss_hm": rss}
        ok, cold = _split_warmup(ok, "round", warmup)
        if cold:
            row["hm1_s"] = statistics.median(r["seconds"] for r in cold)
        if ok:
            row["hm_s"] = statistics.median(r["seconds"] for r in ok)
            row["hm_states"] = len({(r["round"], r["hash"]) for r in ok}) / len({r["round"] for r in ok})
        out[enc] = row
    return out


def _averaged(record: dict[str, Any], rounds: Records, params: int) -> bool:
    """Whether this peer's values after the round are the mean of all peers' before it (checked on their sums).

    The values are N(0, 1), so a sum's spread is about sqrt(params). fp16 and int8 rounding moved the sum of
    the mean by up to 6e-4 sqrt(params) (measured, 1M and 10M); one dropped part of k values moves it by about
    sqrt(k): hivemind's parts are up to 131072 values, and the smallest it dropped here, a 1000-value bias, is
    0.026 sqrt(params) at 1M. (Those drops came from a peer shutting its averager down right after its last
    round, while a slower peer still downloaded its slice; the worker now waits for all first.)
    """
    same = [r for r in rounds if r["round"] == record["round"] and "sum_before" in r]
    if "sum_after" not in record or len(same) != PEERS:
        return False
    mean = statistics.fmean(float(r["sum_before"]) for r in same)
    return abs(float(record["sum_after"]) - mean) <= 5e-3 * math.sqrt(params)


def summarize_mesh(records: Records, params: int, warmup: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    rss = _peak_rss(records, "peak_rss_mb")
    for enc in ENCODINGS:
        mine = [r for r in records if r.get("event") == "round" and r.get("encoding") == enc]
        for r in mine:
            if "error" in r:
                print(f"# {params / 1e6:.1f}M mesh {enc}: {r['error']}", file=sys.stderr, flush=True)
        ok, _ = _split_warmup([r for r in mine if "seconds" in r], "round", warmup)
        row: dict[str, Any] = {"rss_mesh": rss}
        if ok:
            row["mesh_s"] = statistics.median(r["seconds"] for r in ok)
            row["mesh_mb"] = statistics.median(r["bytes_sent"] for r in ok) / 1e6
        out[enc] = row
    return out


def _run_part(name: str, run: Callable[[], Records]) -> Records:
    """One part's records; a part that fails (a crashed peer, a timeout) is reported and the others still run."""
    t = time.monotonic()
    try:
        records = run()
    except AssertionError as e:
        print(f"# {name} failed: {e}", file=sys.stderr, flush=True)
        return []
    print(f"# {name} done in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
    return records


def run_size(
    millions: float, args: argparse.Namespace, parts: set[str], tmp: Path, link: str, net: Net
) -> list[dict[str, Any]]:
    """Every selected part at one size over one kind of link; one merged row per encoding."""
    width = int((millions * 1e6) ** 0.5)
    params = width * width + width
    base: dict[str, dict[str, Any]] = {enc: {"link": link, "params": params, "enc": enc} for enc in ENCODINGS}
    outer = (args.outer_lr, args.outer_momentum)
    runs: dict[str, tuple[Callable[[Path], Records], Callable[[Records, int, int], dict[str, dict[str, Any]]]]] = {
        "ours": (
            lambda root: run_ours(width, args.rounds_per, root, args.timeout, args.aggregator, outer, net),
            summarize_ours,
        ),
        "hivemind": (lambda root: run_hivemind(width, args.rounds_per, root, args.timeout, net), summarize_hivemind),
        "mesh": (lambda root: run_mesh(params, args.rounds_per, root, args.timeout, net), summarize_mesh),
    }
    for part in (p for p in PARTS if p in parts):
        run, summarize = runs[part]
        root = tmp / link / f"m{millions:g}" / part
        root.mkdir(parents=True)
        records = _run_part(f"{link} {params / 1e6:.1f}M {part}", functools.partial(run, root))
        for enc, row in summarize(records, params, args.warmup).items():
            base[enc].update(row)
    rows = [_ratios(row, _rate_mbit(link)) for row in base.values()]
    return _proportions(rows)


def _rate_mbit(link: str) -> float | None:
    """The link's rate in Mbit/s; None for loopback and for unshaped veths."""
    return None if link in ("lo", "veth") else float(link)


def _proportions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each encoding's time over the uncompressed one's, divided by its bytes over theirs: 1.0 is proportional."""
    plain = next((r for r in rows if r["enc"] == "none"), {})
    for row in rows:
        if row.get("ar_s") and plain.get("ar_s") and row.get("mb_peer") and plain.get("mb_peer"):
            row["t_per_b"] = (row["ar_s"] / plain["ar_s"]) / (row["mb_peer"] / plain["mb_peer"])
    return rows


def _ratios(row: dict[str, Any], rate_mbit: float | None) -> dict[str, Any]:
    ar, model_mb = row.get("ar_s"), row["params"] * 4 / 1e6
    row["model_mb"] = model_mb
    if rate_mbit is not None and row.get("mb_peer"):
        # a peer's upload and download each carry its bytes_sent at the rate, in parallel: the floor is one of them
        row["floor_s"] = row["mb_peer"] * 8 / rate_mbit
        if ar is not None:
            row["ar_floor"] = ar / row["floor_s"]
        if row.get("hm_s"):
            row["hm_floor"] = row["hm_s"] / row["floor_s"]
        if row.get("mesh_s"):
            row["mesh_floor"] = row["mesh_s"] / row["floor_s"]
    if ar is not None and row.get("hm_s"):
        row["ar_hm"] = ar / row["hm_s"]
    if ar is not None and row.get("mesh_s"):
        row["ar_mesh"] = ar / row["mesh_s"]
    for part in ("ours", "hm", "mesh"):
        if row.get(f"rss_{part}") is not None:
            row[f"{part}_mdl"] = row[f"rss_{part}"] / model_mb
    if row.get("added_ours") is not None:
        row["added_mdl"] = row["added_ours"] / model_mb
    return row


# (header, row key, width, format): one table, "-" where a part did not run or had no good round
COLUMNS = [
    ("link", "link", 5, ""),
    ("params", "params", 8, ""),
    ("enc", "enc", 5, ""),
    ("ok", "ok", 5, ""),
    ("sync_s", "sync_s", 7, ".2f"),
    ("ar_s", "ar_s", 7, ".3f"),
    ("hm_s", "hm_s", 7, ".3f"),
    ("ar1_s", "ar1_s", 7, ".3f"),
    ("hm1_s", "hm1_s", 7, ".3f"),
    ("mesh_s", "mesh_s", 7, ".4f"),
    ("ar/hm", "ar_hm", 6, ".2f"),
    ("ar/mesh", "ar_mesh", 7, ".1f"),
    ("floor_s", "floor_s", 7, ".2f"),
    ("ar/flr", "ar_floor", 6, ".2f"),
    ("hm/flr", "hm_floor", 6, ".2f"),
    ("msh/flr", "mesh_floor", 7, ".2f"),
    ("t/bytes", "t_per_b", 7, ".2f"),
    ("MB/peer", "mb_peer", 8, ".1f"),
    ("MBmesh", "mesh_mb", 7, ".1f"),
    ("mdl_MB", "model_mb", 7, ".1f"),
    ("rss_ours", "rss_ours", 8, ".0f"),
    ("/mdl", "ours_mdl", 5, ".1f"),
    ("+ours", "added_ours", 6, ".0f"),
    ("/mdl", "added_mdl", 5, ".1f"),
    ("rss_hm", "rss_hm", 7, ".0f"),
    ("/mdl", "hm_mdl", 5, ".1f"),
    ("rss_mesh", "rss_mesh", 8, ".0f"),
    ("/mdl", "mesh_mdl", 5, ".1f"),
    ("hm_ok", "hm_ok", 5, ""),
    ("states/rnd", "states", 10, ".0f"),
    ("hm_states", "hm_states", 9, ".1f"),
]


def _cell(row: dict[str, Any], key: str, width: int, spec: str) -> str:
    value = row.get(key)
    if value is None:
        return f"{'-':>{width}}"
    if key == "params":
        return f"{value / 1e6:>{width - 1}.1f}M"
    return f"{value:>{width}{spec}}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(" ".join(f"{header:>{width}}" for header, _, width, _ in COLUMNS))
    for row in rows:
        print(" ".join(_cell(row, key, width, spec) for _, key, width, spec in COLUMNS), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,50", help="millions of parameters")
    parser.add_argument("--rounds-per", type=int, default=2, help="syncs (rounds) per encoding")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound per size and part, seconds")
    parser.add_argument(
        "--warmup", type=int, default=1, help="first rounds of each encoding left out of the medians (shown as *1_s)"
    )
    parser.add_argument("--only", default=",".join(PARTS), help="comma list of parts to run: ours,hivemind,mesh")
    parser.add_argument("--keep", default="", help="keep the peers' reports and logs in this folder")
    parser.add_argument(
        "--aggregator", default=OuterSyncConfig().aggregator, help="our reducers' rule (default: the node's default)"
    )
    parser.add_argument(
        "--outer-lr", type=float, default=1.0, help="our outer step's rate (default: the node's, plain averaging)"
    )
    parser.add_argument(
        "--outer-momentum",
        type=float,
        default=0.0,
        help="our outer momentum (default: the node's, 0: the state holds no momentum; DiLoCo's is 0.9, lr 0.7)",
    )
    parser.add_argument(
        "--links",
        default="lo",
        help="comma list of links: lo (127.0.0.1), veth (namespaces, unshaped) or a rate in Mbit/s (e.g. 100,1000)",
    )
    args = parser.parse_args()
    links = _parse_links(parser, args.links)
    parts = set(args.only.split(","))
    if not parts <= set(PARTS):
        parser.error(f"--only takes parts among {','.join(PARTS)}, not {','.join(sorted(parts - set(PARTS)))}")
    if not 0 <= args.warmup < args.rounds_per:
        parser.error(
            f"--warmup {args.warmup}: use 0 up to --rounds-per - 1 ({args.rounds_per - 1}), so a round is left"
        )
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        parser.error("--keep needs a new or empty folder: old port and barrier files would mislead the peers")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        work = Path(args.keep or tmp)
        for link in links:
            rows += run_link(link, args, parts, work)
            print_table(rows)  # so far: a long run shows each link's results as they come
    return 0


def _parse_links(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The links to run, loopback only (said once) where namespaces cannot be made."""
    links = [x.strip() for x in text.split(",") if x.strip()]
    for link in links:
        if link not in ("lo", "veth"):
            try:
                if not float(link) > 0:
                    raise ValueError(link)
            except ValueError:
                parser.error(f"--links {link}: use lo, veth or a positive rate in Mbit/s, e.g. --links lo,1000,100")
    why = netlinks.unavailable() if any(x != "lo" for x in links) else None
    if why:
        print(f"# {why}", file=sys.stderr, flush=True)
        return ["lo"]
    return links


def run_link(link: str, args: argparse.Namespace, parts: set[str], work: Path) -> list[dict[str, Any]]:
    """Every size over one link; the namespaces (if any) live exactly as long as the link's runs."""
    rows: list[dict[str, Any]] = []
    made = None if link == "lo" else netlinks.Links(PEERS, _rate_mbit(link))
    with made or contextlib.nullcontext():
        for millions in (float(s) for s in args.sizes.split(",")):
            rows += run_size(millions, args, parts, work, link, Net(made))
    return rows


if __name__ == "__main__":
    sys.exit(main())
