"""One peer of hivemind's own ``DecentralizedAverager`` on 127.0.0.1: bench/bench_sync.py's reference all-reduce.

Holds tensors shaped as tests/sync_worker.py's benchmark model (one ``nn.Linear(w, w)``:
a w x w weight and a w bias) and averages them ``--rounds-per`` times with each of
``--encodings`` (none, fp16, int8: hivemind's ``NoCompression``, ``Float16Compression``,
``Uniform8BitQuantization``), one averager (prefix) per encoding, in groups of exactly
``--peers``. Before every round the tensors get fresh random values (seeded by
``--seed``, the encoding and the round), as every round of training averages new
pseudo-gradients.

Each round is pre-scheduled as hivemind's Optimizer does it:
``step(wait=False, require_trigger=True)``, wait until the step is
``AWAITING_TRIGGER`` (matchmaking done), then a file barrier across the peers
so that all trigger together; only ``allow_allreduce()`` to ``result()`` is timed.
An averager is shut down only once every peer has its last result.

JSON lines to ``--report``: ``ready`` (with the DHT's multiaddrs, for the
others' ``--initial-peer``), one ``round`` per round (``seconds``,
``group_size``, ``hash`` of the averaged tensors, ``sum_before`` and
``sum_after`` of all their values, or ``error``) and ``done`` (``peak_rss_mb``
of this process, ``averager_peak_rss_mb`` of its averager processes, which do
the all-reduce). hivemind's 8-bit decoding fails on NumPy 2; unless
``--stock-int8``, it is patched first (see :func:`fix_int8_extract`).
Started by bench/bench_sync.py; no side effects at import.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.procs import Reporter

REPO = Path(__file__).resolve().parents[1]


def _parse(argv: list[str]) -> argparse.Namespace:
    from bench.peer_common import group_parser

    p = group_parser(__doc__ or "")
    p.add_argument("--width", type=int, required=True, help="w: a w x w weight and a w bias")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--barrier-dir", required=True, help="folder of the per-round file barriers")
    p.add_argument("--initial-peer", action="append", default=[])
    p.add_argument("--match-timeout", type=float, default=60.0, help="bound on finding a group, s")
    p.add_argument("--stock-int8", action="store_true", help="leave hivemind's 8-bit decoding unpatched")
    p.add_argument("--allreduce-timeout", type=float, default=120.0, help="bound on one all-reduce, s")
    return p.parse_args(argv)


def _compression(encoding: str) -> Any:
    from hivemind.compression import Float16Compression, NoCompression, Uniform8BitQuantization

    return {"none": NoCompression, "fp16": Float16Compression, "int8": Uniform8BitQuantization}[encoding]()


def _tensors(width: int) -> list[Any]:
    import torch

    return [torch.zeros(width, width), torch.zeros(width)]  # their values are drawn before every round


def _digest(tensors: list[Any]) -> str:
    """Hash of the averaged values: the bench counts distinct ones per round (1 = every peer got the same bits)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy())  # the buffer itself: a bytes copy would add the model's size to the peak RSS
    return h.hexdigest()[:16]


def _refill(averager: Any, seed: int) -> float:
    """Fresh random values in place (each round averages new pseudo-gradients, as a training run does); their sum.

    The bench compares every peer's sum after the round with the mean of the sums before it: hivemind drops
    the parts it failed to exchange and still reports success, so timing alone does not show a round averaged.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with averager.get_tensors() as tensors:
        for t in tensors:
            t.normal_(generator=gen)
        return _total(tensors)


def _total(tensors: Any) -> float:
    import torch

    return sum(float(t.sum(dtype=torch.float64)) for t in tensors)  # accumulates in float64 without a copy


def fix_int8_extract() -> bool:
    """Make hivemind's 8-bit decoding work on NumPy 2; whether it had to be patched.

    hivemind 1.1.12's ``Quantization.extract`` calls ``int()`` on a 1-element array, a TypeError since
    NumPy 2.x. In an all-reduce that error only drops the part (a warning "received 0.0% results") and the
    step still succeeds with the tensors untouched: int8 rounds would time no decoding at all. The patch
    changes that one conversion; everything else is hivemind's. Forked averager processes inherit it.
    """
    import numpy as np
    import torch
    from hivemind.compression import CompressionInfo, Uniform8BitQuantization
    from hivemind.compression.quantization import Quantization

    probe = torch.ones(4)
    codec = Uniform8BitQuantization()
    try:
        codec.extract(codec.compress(probe, CompressionInfo.from_tensor(probe)))
        return False
    except TypeError:
        pass
    stock = Quantization.extract

    def extract(self: Any, serialized: Any) -> Any:
        codebook_size = int(np.frombuffer(serialized.buffer, count=1, dtype=np.int64)[0])
        codebook = np.frombuffer(serialized.buffer, offset=8, count=codebook_size, dtype=self.codebook_dtype)
        quantized = np.frombuffer(serialized.buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        indices = torch.as_tensor(quantized, dtype=torch.int64).reshape(tuple(serialized.size))
        values = torch.as_tensor(codebook).to(dtype=getattr(torch, serialized.dtype))
        return values[indices].requires_grad_(serialized.requires_grad)

    extract.__doc__ = stock.__doc__
    Quantization.extract = extract
    return True


def _wait_matched(control: Any, timeout: float) -> str:
    """Wait (bounded) until matchmaking is over and the step waits for its trigger; '' or why not."""
    from hivemind.averaging.control import AveragingStage

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if control.stage == AveragingStage.AWAITING_TRIGGER:
            return ""
        if control.done():  # matchmaking failed for good (the step holds the exception)
            return f"step ended before a group: {control.exception()!r}"
        time.sleep(0.005)
    return f"no group within {timeout:.0f} s (stage {control.stage.name})"


def _round(args: argparse.Namespace, averager: Any, encoding: str, rnd: int) -> dict[str, Any]:
    """One pre-scheduled averaging round; what the report line says about it."""
    from bench.peer_common import ENCODINGS, file_barrier

    record: dict[str, Any] = {"event": "round", "encoding": encoding, "round": rnd}
    record["sum_before"] = _refill(averager, args.seed * 1_000_003 + ENCODINGS.index(encoding) * 1000 + rnd)
    control = averager.step(wait=False, require_trigger=True, timeout=args.match_timeout)
    t0 = time.perf_counter()
    why = _wait_matched(control, args.match_timeout + 5.0)
    record["match_s"] = time.perf_counter() - t0
    if why:
        control.cancel()  # a step left untriggered would hold its group mates until their timeout
        return {**record, "error": why}
    # trigger together: a peer triggered late makes the others wait, which is skew, not all-reduce
    barrier = file_barrier(Path(args.barrier_dir), f"hm.{encoding}.{rnd}", args.rank, args.peers, 60.0)
    t0 = time.perf_counter()
    control.allow_allreduce()
    try:
        gathered = control.result(timeout=args.allreduce_timeout)
    except Exception as e:  # hivemind raises its own and concurrent.futures errors alike: report, go on
        return {**record, "error": f"{type(e).__name__}: {e}", "barrier": barrier}
    record["seconds"] = time.perf_counter() - t0
    record["group_size"] = len(gathered) if gathered is not None else 0
    with averager.get_tensors() as averaged:
        record["hash"], record["sum_after"] = _digest(list(averaged)), _total(averaged)
    return {**record, "barrier": barrier}


def _run_encoding(args: argparse.Namespace, dht: Any, tensors: list[Any], encoding: str, out: Reporter) -> float:
    """All rounds of one encoding on a fresh averager (compression is fixed per averager); its peak RSS in MB."""
    from hivemind.averaging import DecentralizedAverager

    from bench.peer_common import file_barrier, pid_peak_rss_mb

    averager = DecentralizedAverager(
        tensors,
        dht,
        start=True,
        prefix=f"bench_{encoding}",  # one matchmaking key per encoding: rounds of different encodings never mix
        target_group_size=args.peers,
        min_group_size=args.peers,
        min_matchmaking_time=5.0,  # hivemind's defaults (it warns when request_timeout >= this); a full
        request_timeout=3.0,  # group is assembled at once, so neither delays a round of 4 ready peers
        allreduce_timeout=args.allreduce_timeout,
        compression=_compression(encoding),
    )
    try:
        for rnd in range(args.rounds_per):
            out.write(**_round(args, averager, encoding, rnd), time=time.time())
        # a step returns once this peer has its own results, while it may still be streaming its averaged
        # slice to a slower peer: shutting down now would drop that part there (hivemind still reports success)
        file_barrier(Path(args.barrier_dir), f"hm.{encoding}.end", args.rank, args.peers, args.allreduce_timeout)
        return pid_peak_rss_mb(averager.pid)  # before shutdown: the process must still exist to be read
    finally:
        averager.shutdown()


def main(argv: list[str]) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # run as a script: bench/ is importable from the repository root
    args = _parse(argv)
    import hivemind
    import torch

    from bench.peer_common import self_peak_rss_mb
    from tests.procs import Reporter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)  # as tests/sync_worker.py: 4 peers share the machine's cores
    out = Reporter(args.report)
    patched = False if args.stock_int8 else fix_int8_extract()
    dht = hivemind.DHT(start=True, host_maddrs=[f"/ip4/{args.host}/tcp/0"], initial_peers=args.initial_peer)
    maddrs = [str(m) for m in dht.get_visible_maddrs()]
    tensors = _tensors(args.width)
    out.write(event="ready", rank=args.rank, maddrs=maddrs, int8_extract_patched=patched, time=time.time())
    averager_rss = 0.0
    try:
        for encoding in args.encodings.split(","):
            averager_rss = max(averager_rss, _run_encoding(args, dht, tensors, encoding, out))
    finally:
        out.write(event="done", peak_rss_mb=self_peak_rss_mb(), averager_peak_rss_mb=averager_rss, time=time.time())
        dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
