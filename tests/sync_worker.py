"""A sync peer process for fault-injection tests and the sync benchmark.

Trains a deterministic fake model (an ``nn.Linear`` stack; each inner step adds
seeded noise) and calls ``OuterSync.maybe_sync`` every step. It writes JSON
lines to ``--report``: ``ready`` (with its multiaddrs), every sync report,
``phase`` when an injected fault fires, and ``done``. Faults
(``--fault PHASE:REVISION:ACTION``, PHASE one of matchmade, send, sent,
reduced, allreduced, voted): ``stop`` makes the process SIGSTOP itself at that
phase (the test then SIGKILLs or SIGSTOPs/SIGCONTs its whole process group),
``leave`` asks its sync to leave
(``OuterSync.cancel``, what a node does when a signal asks it to leave).

``--eager`` drives the sync through :class:`swarm.sync.runner.SyncRunner`
(the sync runs on a thread while the loop keeps stepping); ``--period S``
syncs on wall-time epochs of S seconds. Every sync record carries the step
(and time) at which its sync started, ``step`` (the step at which it was
applied) and ``waited_s`` (the loop's total time inside sync calls so far);
``done`` adds the loop's wall time, this process's peak RSS (``peak_rss_mb``)
and, with ``--dump``, this worker's own total progress and what of it is still
pending (not yet in any average).

Started by tests/faults.py (and bench/bench_sync.py, bench/bench_eager.py); not imported by anything
(no side effects at import).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.procs import Reporter


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--identity", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--swarm", default="test-sync")
    p.add_argument("--initial-peer", action="append", default=[])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (a rate-limited link's, bench/links.py)")
    p.add_argument("--arch", default="32,32,8", help="layer widths of the Linear stack")
    p.add_argument("--init-seed", type=int, default=0)
    p.add_argument("--update-seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--sync-every", type=int, default=4)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--compression", default="none", help="one encoding, or a comma list to cycle (bench)")
    p.add_argument("--rounds-per", type=int, default=1, help="syncs per encoding when cycling")
    p.add_argument("--timeouts", default="1.5,4,2,4,6", help="matchmaking,allreduce,commit,dht,state[,chunk] seconds")
    p.add_argument("--ping-timeout", type=float, default=1.0, help="liveness ping bound (s)")
    p.add_argument("--max-group", type=int, default=64, help="max_group_size")
    p.add_argument("--go-file", default="")
    p.add_argument("--stop-file", default="")
    p.add_argument("--linger", type=float, default=30.0, help="keep serving state this long after training")
    p.add_argument("--fault", action="append", default=[], help="PHASE:REVISION:ACTION (stop|leave)")
    p.add_argument("--aggregator", default="mean")
    p.add_argument("--outer-lr", type=float, default=0.7, help="outer_lr")
    p.add_argument("--outer-momentum", type=float, default=0.9, help="outer_momentum (0: the state keeps none)")
    p.add_argument(
        "--poison",
        default="",
        choices=["", "huge", "noise", "liar", "veto", "flip", "takeover", "shrink"],
        help="be a hostile member",
    )
    p.add_argument("--drift", type=float, default=0.0, help="add this x a direction shared by all peers to each step")
    p.add_argument("--step-scale", type=float, default=0.01, help="standard deviation of each inner step's noise")
    p.add_argument("--dump", action="store_true", help="add own pseudo-gradient and applied average to reports")
    p.add_argument("--eager", action="store_true", help="sync beside training through SyncRunner")
    p.add_argument("--period", type=float, default=0.0, help="sync_period_s: sync on wall-time epochs")
    p.add_argument("--halt-file", default="", help="stop stepping (before --steps) once this file exists")
    p.add_argument("--claim-steps", type=int, default=0, help="be a hostile member claiming this many inner steps")
    p.add_argument("--max-weight-ratio", type=float, default=4.0, help="max_weight_ratio")
    args = p.parse_args(argv)
    if args.dump and args.outer_momentum == 0:
        p.error("--dump recovers the applied average from the momentum; use --outer-momentum above 0")
    return args


def _observer(faults: list[str], out: Reporter, leave: list[Any]) -> Any:
    """What the sync tells at each round point (swarm.sync.points): the process acts out its faults there."""
    from swarm.sync.points import RoundPoint

    pending = {(RoundPoint(f.split(":")[0]), int(f.split(":")[1])): f.split(":")[2] for f in faults}

    def observe(point: RoundPoint, revision: int) -> None:
        phase = point.value
        action = pending.get((point, revision))
        if action == "leave":  # the leave request arrives mid-round (as the node's signal watcher sends it)
            del pending[(point, revision)]
            out.write(event="phase", phase=phase, revision=revision, pid=os.getpid(), time=time.time())
            leave[0].cancel()
        if action == "stop":
            del pending[(point, revision)]
            out.write(event="phase", phase=phase, revision=revision, pid=os.getpid(), time=time.time())
            os.kill(os.getpid(), signal.SIGSTOP)

    return observe


def _sync_config(args: argparse.Namespace, cls: Any) -> Any:
    m_s, a_s, c_s, d_s, s_s, k_s = (float(x) for x in [*args.timeouts.split(","), "2"][:6])
    return cls(
        sync_every=args.sync_every,
        sync_period_s=args.period,
        eager=args.eager,
        compression=args.compression.split(",")[0],
        matchmaking_timeout_s=m_s,
        allreduce_timeout_s=a_s,
        chunk_timeout_s=min(k_s, a_s),
        commit_timeout_s=c_s,
        dht_timeout_s=d_s,
        state_timeout_s=s_s,
        poll_s=0.05,
        aggregator=args.aggregator,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        ping_timeout_s=args.ping_timeout,
        max_group_size=args.max_group,
        max_weight_ratio=args.max_weight_ratio,
    )


def _garbage(mode: str, n: int, seed: int) -> Any:
    """What a hostile member sends: finite 1e30 everywhere, or Gaussian noise of norm ~1e6 per element."""
    import torch

    if mode == "huge":
        return torch.full((n,), 1e30)
    return 1e6 * torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _be_hostile() -> None:
    """Make this process's reducer return huge noise for its slice (an attacker runs whatever code it likes)."""
    import swarm.sync.pieces as pieces

    def lying_reduce(rows: Any, n: int, rule: str, trim_fraction: float, weights: list[float]) -> Any:
        return _garbage("noise", n, n).numpy()

    pieces.reduce_piece = lying_reduce


SHRINK = 0.45
"""A ``--poison shrink`` reducer returns this x its slice of the anchor as the average (inside max_update)."""


def _shrink_reducer(sync: Any) -> None:
    """Reduce this member's slice to SHRINK x the anchor's slice, and vote for it (its checks switched off).

    A lying reducer: the outer step then subtracts lr x SHRINK of the slice, a step
    of 0.45 of the slice's anchor norm, inside the ``max_update`` floor (0.5) a member without evidence keeps.
    """
    from dataclasses import replace

    import swarm.sync.allreduce as allreduce
    import swarm.sync.outer as outer
    import swarm.sync.pieces as pieces

    honest_init, honest_reduce, honest_piece = (
        allreduce._Round.__init__,
        pieces.SliceReduction._reduce,
        pieces.reduce_piece,
    )

    def init(self: Any, plan: Any, index: int, me: str, dest: Any, remaining: Any) -> None:
        honest_init(self, plan, index, me, dest, remaining)
        lo, hi = plan.bounds()[index]
        self.red.lie = (SHRINK * sync._snap.anchor[lo:hi]).numpy().copy()

    def reduce(self: Any, k: int) -> None:
        a, b = self.pieces[k]
        pieces.reduce_piece = lambda *_: self.lie[a:b].copy()
        try:
            honest_reduce(self, k)
        finally:
            pieces.reduce_piece = honest_piece

    # an attacker runs whatever code it likes: its reducer lies and its own checks pass everything
    setattr(allreduce._Round, "__init__", init)  # noqa: B010
    setattr(pieces.SliceReduction, "_reduce", reduce)  # noqa: B010
    honest_assemble, honest_next = getattr(outer, "assemble"), getattr(outer, "next_state")  # noqa: B009
    setattr(outer, "assemble", lambda *a, **k: replace(honest_assemble(*a, **k), suspects={}, refusal=None))  # noqa: B010
    setattr(outer, "next_state", lambda *a, **k: (lambda r: (r[0], None, r[2]))(honest_next(*a, **k)))  # noqa: B010


def _always_veto(sync: Any) -> None:
    """Make this member vote abort in every round it joins, whatever its average (the records are its own)."""
    from swarm.sync.records import ABORT_DIGEST

    records = sync._records
    honest = records.vote
    records.vote = lambda plan, _digest: honest(plan, ABORT_DIGEST)


def _claim_steps(sync: Any, steps: int) -> None:
    """Make every part this process sends claim ``steps`` inner steps, whatever it trained."""
    from dataclasses import replace

    honest = sync.prepare

    def prepare(inner_step: int | None = None) -> Any:
        return replace(honest(inner_step), steps=steps)

    sync.prepare = prepare


def _poison_model(sync: Any, model: Any, mode: str, step: int) -> None:
    """Set the weights so that this member's pseudo-gradient (anchor - weights) is the garbage."""
    from swarm.sync.tensors import load_flat

    anchor = sync.state_dict()["anchor"]
    load_flat(model, anchor - _garbage(mode, anchor.numel(), step))


def _flip_model(sync: Any, model: Any) -> None:
    """Send minus the progress this member shares with the honest ones, just inside the 4x clip bound."""
    from swarm.sync.tensors import flatten, load_flat

    anchor = sync.state_dict()["anchor"]
    load_flat(model, anchor + 3.9 * (anchor - flatten(model)))  # pseudo-gradient (anchor - weights) reversed


TAKEOVER_REVISION = 1_000_000
"""How far past its real revision a ``--poison takeover`` member claims the state it serves is."""


class _TakeOver(threading.Thread):
    """After one honest commit: sign state records one revision past the others', serve a made-up state.

    A catch-up takeover: as a partner of a committed round this member is trusted, so
    its record one revision ahead of every honest peer's is followed on its word (contested, or lone); the
    state it then serves claims revision +1,000,000, which must not widen the distance bound a millionfold.
    """

    def __init__(self, sync: Any, out: Any, report: str, halt: float) -> None:
        import torch

        from swarm.sync.allreduce import Snapshot
        from swarm.sync.tensors import state_hash

        super().__init__(daemon=True)
        snap = sync._snap
        n = snap.anchor.numel()
        anchor = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(666))  # a made-up model's scale
        momentum = torch.zeros(snap.momentum.numel())
        revision = snap.revision + TAKEOVER_REVISION
        self.fake = Snapshot(revision, state_hash(anchor, momentum, snap.origin), anchor, momentum, snap.origin)
        self.sync, self.out, self.end = sync, out, time.time() + halt
        sync._snap = self.fake  # what its sync service serves from now on
        torch.save(anchor, report + ".fake.pt")  # the test measures honest anchors' distance to it
        out.write(event="hijack", time=time.time(), revision=revision, state_hash=self.fake.state_hash)

    def run(self) -> None:
        records, claimed = self.sync._records, -1
        while time.time() < self.end:
            states = records.read_states()
            others = [
                r.revision for p, r in states.items() if p != self.sync.peer_id and r.revision < TAKEOVER_REVISION
            ]
            ahead = max(others, default=0) + 1
            if ahead != claimed:  # one record just past every honest peer's: theirs is the state it "moved on" from
                records.publish_state(ahead, os.urandom(32).hex(), self.fake.origin)
                claimed = ahead
                self.out.write(event="claim", time=time.time(), revision=ahead)
            time.sleep(0.1)


def _wait_file(path: str, timeout: float) -> None:
    """Wait (polling, bounded) for the test's go file: the condition that releases all peers at once."""
    end = time.time() + timeout
    while path and not Path(path).exists() and time.time() < end:
        time.sleep(0.05)


def _start_membership(cls: Any, identity: Any, mcfg: Any) -> Any:
    """Start, retrying while the first peer (started at the same time) is not listening yet.

    Membership.start retries only p2pd's bootstrap error; hivemind's DHTNode raises
    RuntimeError("DHTNode bootstrap failed") when p2pd connected but no DHT answered.
    """
    for attempt in range(8):
        try:
            return cls(identity, mcfg).start()
        except RuntimeError as e:
            if "bootstrap" not in str(e) or attempt == 7:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _digest(model: Any) -> bytes:
    """sha256 of the model's parameters, read in place: a copy of the weights held through every blocking
    sync would be counted in the bench's peak memory as if the sync held it."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().data)
    return h.digest()


class _Loop:
    """The training loop: inner steps, the sync at every step boundary, and what the tests read of both.

    Blocking (default): ``OuterSync.maybe_sync`` in the loop. ``--eager``: a
    :class:`~swarm.sync.runner.SyncRunner`, whose sync runs on a thread while
    the loop keeps stepping; its outcome is applied at a later boundary.
    """

    def __init__(self, args: argparse.Namespace, cfg: Any, model: Any, sync: Any, out: Reporter) -> None:
        from swarm.sync.runner import SyncRunner
        from swarm.sync.tensors import flatten

        self.args, self.cfg, self.model, self.sync, self.out = args, cfg, model, sync, out
        self.runner = SyncRunner(sync) if args.eager else None
        self.steps, self.train_s, self.waited_s = 0, 0.0, 0.0
        self.started: dict[str, Any] = {}
        """The sync under way: the step and time it started at (and, with --dump, its pseudo-gradient)."""
        # every inner update this worker made, summed: the progress that must end up in an average or pending
        self.own_total = flatten(model).zero_() if args.dump else None
        self.takeover: _TakeOver | None = None

    def run(self) -> None:
        t0 = time.time()
        for step in range(1, self.args.steps + 1):
            if self.args.halt_file and Path(self.args.halt_file).exists():
                break
            if self.takeover is not None:  # the hijacker stops syncing and only serves its made-up state
                break
            self._inner_step(step)
            self._boundary(step)
            self.steps = step
        self.train_s = time.time() - t0
        if self.runner is not None:  # leaving: wait (bounded) for the sync under way and apply it
            report = self.runner.finish(self.sync.max_sync_seconds())
            if report is not None:
                self._write(report, self.steps)

    def summary(self) -> dict[str, Any]:
        """What the ``done`` record adds: steps, the loop's wall time, its time waiting on syncs, peak RSS."""
        from swarm.sync.tensors import flatten

        out: dict[str, Any] = {"steps": self.steps, "train_s": self.train_s, "waited_s": self.waited_s}
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux
        out["skipped_busy"] = self.runner.skipped_busy if self.runner is not None else 0
        if self.own_total is not None:
            out["own_total"] = self.own_total.tolist()
            out["pending"] = (flatten(self.model) - self.sync.state_dict()["anchor"]).tolist()
        return out

    def _inner_step(self, step: int) -> None:
        import torch

        args = self.args
        gen = torch.Generator().manual_seed(args.update_seed * 100_003 + step)
        shared = torch.Generator().manual_seed(7)  # one direction for every peer: the progress they share
        offset = 0
        with torch.no_grad():
            # one parameter-sized temporary at a time, as hivemind_avg_worker.py refills in place: the bench's
            # peak memory is the sync's, not this simulated step's
            for p in self.model.parameters():
                u = torch.randn(p.shape, generator=gen)
                if args.drift:
                    u.add_(torch.randn(p.shape, generator=shared), alpha=args.drift)
                u.mul_(args.step_scale)
                p.add_(u)
                if self.own_total is not None:
                    self.own_total[offset : offset + u.numel()] += u.reshape(-1)
                offset += u.numel()
                del u
        time.sleep(args.step_sleep)  # the simulated step time is the workload, not synchronisation
        encodings = args.compression.split(",")
        if self.runner is None or not self.runner.busy:  # never under a sync that is running
            self.cfg.compression = encodings[(step // args.sync_every - 1) // args.rounds_per % len(encodings)]
        if args.poison in ("huge", "noise") and step % args.sync_every == 0:
            _poison_model(self.sync, self.model, args.poison, step)
        if args.poison == "flip" and step % args.sync_every == 0:
            _flip_model(self.sync, self.model)

    def _boundary(self, step: int) -> None:
        """One step boundary: call the sync, time the call, record which sync started and which was applied."""

        runner = self.runner
        before = self._job_view(step) if runner is None and self.args.dump else {}
        busy = runner is not None and runner.busy
        weights = _digest(self.model) if runner is None else None
        t0 = time.time()
        report = self.sync.maybe_sync(step) if runner is None else runner.maybe_sync(step)
        self.waited_s += time.time() - t0
        if runner is None:
            self.started = {"step": step, "time": t0, **before}
        if report is not None:
            if report.merged and not report.committed and weights is not None:
                # a merge keeps the weights: they are this peer's part in the new history's next average
                self.started["weights_kept"] = weights == _digest(self.model)
            self._write(report, step)
            if self.args.poison == "takeover" and report.committed and self.takeover is None:
                self.takeover = _TakeOver(self.sync, self.out, self.args.report, self.args.linger)
                self.takeover.start()
        # a sync started in this call: none ran before it, or the one that ran was just applied
        if runner is not None and runner.busy and (report is not None or not busy):
            self.started = {"step": step, "time": t0, **(self._job_view(step) if self.args.dump else {})}

    def _job_view(self, step: int) -> dict[str, Any]:
        """The job as the sync takes it at ``step``: own pseudo-gradient (applied anchor - weights), momentum,
        and the weight its part claims (the inner steps since the anchor; prepare() only reads)."""
        from swarm.sync.tensors import flatten

        state = self.sync.state_dict()
        weight = self.sync.prepare(step).weight
        return {"pseudo": state["anchor"] - flatten(self.model), "momentum": state["momentum"], "weight": weight}

    def _write(self, report: Any, step: int) -> None:
        started, self.started = self.started, {}
        extra: dict[str, Any] = {}
        if "pseudo" in started:  # the test recomputes the honest mean from these; g = m_new - mu * m_old
            state = self.sync.state_dict()
            applied = state["momentum"] - self.cfg.outer_momentum * started["momentum"]
            extra = {"pseudo": started["pseudo"].tolist(), "applied": applied.tolist(), "weight": started["weight"]}
            extra["anchor_finite"] = bool(state["anchor"].isfinite().all())
            extra["partners"] = sorted(self.sync.trusted())
        if "weights_kept" in started:
            extra["weights_kept"] = started["weights_kept"]
        self.out.write(
            **report.to_metrics(),
            step=step,
            started_step=started.get("step", step),
            started_time=started.get("time"),
            waited_s=self.waited_s,
            compression=self.cfg.compression,
            **extra,
        )


def _rss_mb() -> float:
    """This process's resident set now (VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def main(argv: list[str]) -> int:
    # run as a script, sys.path[0] is tests/, whose protocol/ and swarm/ test folders would
    # shadow the real packages: put the repository root first instead.
    repo = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [repo, *(p for p in sys.path if p not in (repo, str(Path(__file__).parent)))]
    import logging

    import torch

    from swarm.identity import load_or_create
    from swarm.membership import Membership, MembershipConfig
    from swarm.sync import OuterSync, OuterSyncConfig
    from tests.procs import Reporter

    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    if os.environ.get("SYNC_WORKER_DEBUG"):
        logging.getLogger("swarm.sync.allreduce").setLevel(logging.DEBUG)
    torch.set_num_threads(1)
    out = Reporter(args.report)
    cfg = _sync_config(args, OuterSyncConfig)
    widths = [int(w) for w in args.arch.split(",")]
    torch.manual_seed(args.init_seed)
    base_rss_mb = _rss_mb()  # everything imported, no model yet: what the sync's memory is measured from
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in itertools.pairwise(widths)))
    mcfg = MembershipConfig(swarm_id=args.swarm, host=args.host, port=args.port, initial_peers=tuple(args.initial_peer))
    membership = _start_membership(Membership, load_or_create(args.identity), mcfg)
    leave: list[Any] = []
    sync = OuterSync(membership, model, cfg, observe=_observer(args.fault, out, leave))
    leave.append(sync)
    if args.poison == "liar":
        _be_hostile()
    if args.poison == "veto":
        _always_veto(sync)
    if args.poison == "shrink":
        _shrink_reducer(sync)
    if args.claim_steps:
        _claim_steps(sync, args.claim_steps)
    out.write(
        event="ready",
        peer=membership.peer_id,
        maddrs=membership.visible_multiaddrs(),
        fingerprint=sync.fingerprint,  # the sync namespace: the model's fingerprint and the outer rule
        revision=sync.revision,
        state_hash=sync.state_hash,
        bound_s=sync.max_sync_seconds(),
        base_rss_mb=base_rss_mb,
        rest_rss_mb=_rss_mb(),
        time=time.time(),
    )
    _wait_file(args.go_file, 120.0)
    loop = _Loop(args, cfg, model, sync, out)
    loop.run()
    stored = membership.dht_storage_stats()["storage"]
    out.write(
        event="done",
        peer=membership.peer_id,
        revision=sync.revision,
        state_hash=sync.state_hash,
        dht_storage_events=stored.events,
        dht_entries=stored.entries,
        **loop.summary(),
    )
    end = time.time() + args.linger  # serve state to late peers until the test's stop file (bounded)
    while time.time() < end and not (args.stop_file and Path(args.stop_file).exists()):
        time.sleep(0.1)
    sync.close()
    membership.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
