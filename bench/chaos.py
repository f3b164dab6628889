"""Chaos run: real ``swarm-node`` processes on 127.0.0.1 killed, frozen, stopped and spawned at random.

N same-model tiny nodes (``--model tiny-s``, outer sync on) train while, every
1-3 s (seeded), one random action hits the swarm: SIGKILL a live node (the
bootstrap peer included), SIGSTOP one (SIGCONT a few seconds later), SIGTERM
one (it must leave cleanly within 30 s), restart a dead node with its identity
and ``--resume``, or add a new node. The run fails if any 60 s pass without a
completed round, any 300 s without a committed sync (a run shorter than that
needs at least one commit), a committed revision has two state hashes, a node
exits with a status we did not cause, or a SIGTERM takes longer than 30 s (at
the end every node is SIGTERMed and timed). The verdict is computed from the
nodes' own ``metrics.jsonl`` by the pure functions below.

Usage::

    .venv/bin/python bench/chaos.py --duration-s 1800 --nodes 4 --seed 1 --out runs/chaos
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: tests/ is importable from the repository root

from bench.chaos_forks import apart_at_end, classify_forks, genesis  # noqa: E402
from node.observe.metrics import read_events  # noqa: E402
from protocol import short_id  # noqa: E402
from swarm.identity import load_or_create  # noqa: E402
from tests.procs import PYTHON, Proc, Procs, poll_until  # noqa: E402

Event = dict[str, Any]
SIGTERM_STATUSES = (0, 128 + 15, -15)  # a clean leave; a signal during start-up (handled; or before Python ran)
GAVE_UP_STATUS = 2  # a joiner that reached none of its peers: one sentence, status 2
TICK_S = 0.2


class Action(Enum):
    KILL = "kill"
    STOP = "stop"
    TERM = "term"
    RESTART = "restart"
    ADD = "add"


class Cause(Enum):
    """What the harness did to a node's current process: decides which exit statuses are expected."""

    NONE = "none"
    KILLED = "killed"
    TERMED = "termed"


@dataclass
class ChaosConfig:
    """One run: where its files go (``out``), how long, how many nodes, the seed; the limits it judges by."""

    out: Path
    duration_s: float = 180.0
    nodes: int = 4
    seed: int = 0
    min_gap_s: float = 1.0
    max_gap_s: float = 3.0
    stop_s: tuple[float, float] = (2.0, 6.0)
    sync_every: int = 4
    checkpoint_every: int = 5
    round_gap_s: float = 60.0
    commit_gap_s: float = 300.0
    term_bound_s: float = 30.0
    forks_fail: bool = True
    """A fork fails the run when its groups could reach each other, or when islands that met did not merge
    within 60 s (:mod:`bench.chaos_forks`); off, forks are only counted and classified. One group with two
    hashes (a half-applied round) always fails."""
    start_timeout_s: float = 120.0
    node_args: tuple[str, ...] = ("--model", "tiny-s", "--rounds", "0", "--local", "2", "--external", "2")
    node_args_more: tuple[str, ...] = ("--generations", "4", "--max-threads", "1")
    script: tuple[tuple[float, Action, str], ...] = ()
    """A fixed schedule instead of the seeded one: (seconds after the first node is ready, action, member
    name; ``add`` takes any name). Replays a path a seeded run took on another machine's timing."""


@dataclass
class ChaosReport:
    """What a run did and saw; ``failures`` (one sentence each, with times from the start) decide ``ok``."""

    duration_s: float
    nodes: int
    seed: int
    actions: dict[str, int] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    rounds: dict[str, int] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)
    revisions: dict[int, list[str]] = field(default_factory=dict)
    forks: dict[int, list[str]] = field(default_factory=dict)
    """Revisions committed with two or more state hashes (by different groups)."""
    fork_kinds: list[dict[str, Any]] = field(default_factory=list)
    """Each fork classified: connected (a bug), or an island with when it met the other branch and merged."""
    window: tuple[float, float] = (0.0, 0.0)
    """Wall-clock start and end of the chaos (``bench/chaos.py --rejudge`` judges a run's files again)."""
    apart_at_end: list[list[str]] = field(default_factory=list)
    """Pairs of nodes running at the end on different histories though they reached each other a minute before."""
    islands_at_end: list[list[str]] = field(default_factory=list)
    """Pairs running at the end on different histories whose current processes did not reach each other."""
    genesis: list[str] = field(default_factory=list)
    """The revision-0 states committed histories grew from: one when the swarm started as one."""
    branches: dict[str, list[str]] = field(default_factory=dict)
    """Parent states extended by two or more commits (forks, and dead branches skipped past)."""
    split: dict[str, list[str]] = field(default_factory=dict)
    """Groups applied by some members and aborted by others (see :func:`split_groups`)."""
    merges: list[str] = field(default_factory=list)
    """Syncs that began by merging into another history ("<peer> t=<s>", swarm.sync.merge)."""
    longest_round_gap_s: float = 0.0
    longest_commit_gap_s: float = 0.0
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)
    term_exits: list[dict[str, Any]] = field(default_factory=list)
    tracebacks: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=1, default=str)


# ---- pure judges ---------------------------------------------------------------------------


def longest_gap(times: Iterable[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch of ``[start, end]`` without a time in ``times``, and when it began."""
    points = sorted(t for t in times if start <= t <= end)
    best, at, prev = 0.0, start, start
    for t in [*points, end]:
        if t - prev > best:
            best, at = t - prev, prev
        prev = t
    return best, at


def group_hashes(syncs: Iterable[Event]) -> dict[str, set[str]]:
    """Committed group id -> the state hashes its members reported (one each unless a round was half-applied)."""
    by_group: dict[str, set[str]] = defaultdict(set)
    for e in syncs:
        if e.get("committed"):
            by_group[str(e.get("group_id") or "")].add(str(e["state_hash"]))
    return dict(by_group)


def split_groups(syncs: Iterable[Event]) -> dict[str, list[str]]:
    """Groups some members applied and others aborted: group id -> each reporting member's outcome.

    The vote cannot rule this out when a member gives up on a silent one (``member lost before
    voting``) after another read every digest; it is counted, and a fork it leads to fails the run.
    """
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    for e in syncs:
        if e.get("group_id"):
            outcome = "committed" if e.get("committed") else str(e.get("cause") or "aborted")
            outcomes[str(e["group_id"])][str(e.get("peer", ""))[-6:]] = outcome
    return {
        gid: sorted(f"{peer}: {o}" for peer, o in members.items())
        for gid, members in sorted(outcomes.items())
        if "committed" in members.values() and set(members.values()) != {"committed"}
    }


def revision_hashes(syncs: Iterable[Event]) -> dict[int, set[str]]:
    """Committed revision -> the state hashes nodes reported for it (one each when the swarm agrees)."""
    by_rev: dict[int, set[str]] = defaultdict(set)
    for e in syncs:
        if e.get("committed"):
            by_rev[int(e["revision"])].add(str(e["state_hash"]))
    return dict(by_rev)


def child_hashes(syncs: Iterable[Event]) -> dict[str, set[str]]:
    """Parent state hash -> the committed states extending it (one each in a linear history)."""
    by_parent: dict[str, set[str]] = defaultdict(set)
    for e in syncs:
        if e.get("committed") and e.get("parent"):
            by_parent[str(e["parent"])].add(str(e["state_hash"]))
    return dict(by_parent)


def exit_expected(status: int, cause: Cause, gave_up_alone: bool) -> bool:
    """Whether a node's exit status is one the harness caused (or a joiner's documented give-up)."""
    if cause is Cause.KILLED:
        return True
    if cause is Cause.TERMED:
        return status in SIGTERM_STATUSES
    return status == GAVE_UP_STATUS and gave_up_alone


def judge(
    report: ChaosReport,
    syncs: Sequence[Event],
    rounds: Sequence[float],
    window: tuple[float, float],
    cfg: ChaosConfig,
    round_events: Sequence[Event] = (),
    starts: Mapping[str, float] | None = None,
) -> None:
    """Fill the report's verdict from the nodes' events over the chaos ``window`` (wall-clock times).

    A fork fails the run when its groups could reach each other, or when islands that met did not
    merge within 60 s; ``round_events`` (with ``external_peers``) tell which (:mod:`bench.chaos_forks`);
    ``starts`` (short peer id -> its current process's start) limits reach to the current processes.
    """
    start, end = window
    report.window = window
    gap, at = longest_gap(rounds, start, end)
    report.longest_round_gap_s = round(gap, 1)
    if gap > cfg.round_gap_s:
        report.failures.append(f"no round on any node for {gap:.0f}s from t={at - start:.0f}s")
    commits = [float(e["time"]) for e in syncs if e.get("committed")]
    cgap, cat = longest_gap(commits, start, end)
    report.longest_commit_gap_s = round(cgap, 1)
    if not commits:
        report.failures.append(f"no committed sync in {end - start:.0f}s")
    elif cgap > cfg.commit_gap_s:
        report.failures.append(f"no committed sync for {cgap:.0f}s from t={cat - start:.0f}s")
    for gid, group in sorted(group_hashes(syncs).items()):
        if len(group) > 1:
            report.failures.append(f"group {gid[:8]} committed with {len(group)} state hashes: {sorted(group)}")
    by_rev = revision_hashes(syncs)
    report.revisions = {r: sorted(h) for r, h in sorted(by_rev.items())}
    report.forks = {r: h for r, h in report.revisions.items() if len(h) > 1}
    report.genesis = sorted(genesis(syncs))
    classified = classify_forks(syncs, round_events, start, end)
    report.fork_kinds = [{**asdict(f), "kind": f.kind.value, "problem": f.problem(end - start)} for f in classified]
    for fork in classified:
        problem = fork.problem(end - start)
        if problem is not None and cfg.forks_fail:
            report.failures.append(problem)
    report.apart_at_end, report.islands_at_end = apart_at_end(syncs, round_events, end, starts)
    if report.apart_at_end and cfg.forks_fail:
        report.failures.append(f"nodes connected for over a minute ended on different histories: {report.apart_at_end}")
    # a state extended twice: a fork, or a dead branch (every holder of the first child gone, the
    # survivors committed past it under a later revision number); counted, the revisions judge above
    report.branches = {p[:8]: sorted(h)[:4] for p, h in child_hashes(syncs).items() if len(h) > 1}
    report.split = {gid[:8]: members for gid, members in split_groups(syncs).items()}
    report.merges = [
        f"{str(e.get('peer', ''))[-6:]} t={float(e['time']) - start:.0f}s" for e in syncs if e.get("merged")
    ]


def choose_action(rng: random.Random, running: int, alive: int, dead: int, limit: int) -> Action | None:
    """The next action, given how many nodes run (ready, not frozen), live at all, and lie dead.

    Killing, stopping or terminating needs two running nodes, so one keeps
    training; killing or terminating also keeps at least two alive. Spawning
    keeps at most ``limit`` + 1 alive, a new identity only while fewer than ``limit``.
    """
    weights: dict[Action, int] = {}
    if running >= 2:
        weights[Action.STOP] = 2
        if alive >= 3:
            weights[Action.KILL] = 3
            weights[Action.TERM] = 1
    if running >= 1 and alive <= limit:
        if dead:
            weights[Action.RESTART] = 3
        if alive < limit:
            weights[Action.ADD] = 1 if dead else 3
    if not weights:
        return None
    kinds = sorted(weights, key=lambda a: a.value)
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


# ---- the processes ------------------------------------------------------------------------


def group_alive(pgid: int) -> bool:
    """Whether any process of a node's session still runs (zombies aside): its identity lock may be held."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@dataclass
class Member:
    """One identity of the run and its current process (a restart is a new process with the same key)."""

    name: str
    key: Path
    short: str
    proc: Proc | None = None
    incarnation: int = 0
    cause: Cause = Cause.NONE
    ready: dict[str, Any] | None = None
    ready_file: Path | None = None
    termed_at: float | None = None
    term_phase: str = ""  # "mid-run" or "end"
    stopped_until: float | None = None
    given: list[str] = field(default_factory=list)
    """The members whose addresses it was started with (``--peer``)."""
    harmed: set[str] = field(default_factory=set)
    """Those of ``given`` killed, frozen or stopped since: a joiner left with none of them may give up."""
    recorded: bool = True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def running(self) -> bool:
        """Ready, not frozen, not leaving: it trains and others can join through it."""
        return self.alive() and self.ready is not None and self.stopped_until is None and self.termed_at is None


class Chaos:
    """One run: starts the nodes, acts at random, records exits; :meth:`verdict` reads their metrics."""

    def __init__(self, cfg: ChaosConfig, procs: Procs) -> None:
        self.cfg, self.procs = cfg, procs
        self.rng = random.Random(cfg.seed)
        self.members: list[Member] = []
        self.report = ChaosReport(cfg.duration_s, cfg.nodes, cfg.seed)
        self.actions: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self.window = (time.time(), time.time())  # wall-clock span of the chaos, for the judge
        self.started = False

    def log(self, line: str) -> None:
        stamped = f"t={time.monotonic() - self.t0:6.1f}s {line}"
        self.report.timeline.append(stamped)
        print(stamped, flush=True)

    def spawn(self, m: Member, resume: bool) -> None:
        peers = [p for p in self.members if p is not m and p.running()]
        m.incarnation += 1
        m.ready_file = self.cfg.out / "ready" / f"{m.name}.{m.incarnation}.ready"
        m.ready_file.unlink(missing_ok=True)
        cmd = [PYTHON, "-m", "node", "join" if peers else "start"]
        for p in peers:
            assert p.ready is not None
            cmd += ["--peer", p.ready["multiaddrs"][0]]
        cmd += ["--identity", str(m.key), "--log-dir", str(self.cfg.out / "runs"), "--host-port", "127.0.0.1:0"]
        cmd += ["--ready-file", str(m.ready_file), "--seed", str(len(self.members) + m.incarnation)]
        cmd += [*self.cfg.node_args, *self.cfg.node_args_more, "--sync-every", str(self.cfg.sync_every)]
        cmd += ["--checkpoint-every", str(self.cfg.checkpoint_every), *(["--resume"] if resume else [])]
        cmd += ["-v"]  # a line per round: bench/chaos_dials.py tells a live donor from its log's line times
        log = self.cfg.out / "logs" / f"{m.name}.{m.incarnation}.log"
        m.proc = self.procs.start(f"{m.name}.{m.incarnation}", cmd, log=log)
        m.cause, m.ready, m.termed_at, m.stopped_until, m.recorded = Cause.NONE, None, None, None, False
        m.given, m.harmed = [p.name for p in peers], set()
        self.log(f"{'restart' if resume else 'spawn'} {m.name} (pid {m.proc.pid}) via {m.given or 'nobody'}")

    def new_member(self) -> Member:
        name = f"n{len(self.members)}"
        key = self.cfg.out / "keys" / f"{name}.key"
        m = Member(name, key, short_id(load_or_create(key).peer_id))
        self.members.append(m)
        return m

    def tick(self, now: float) -> None:
        """Resume frozen nodes whose time is up, notice ready files, record exits, bound SIGTERMs."""
        for m in self.members:
            if m.stopped_until is not None and now >= m.stopped_until and m.proc is not None:
                m.proc.cont()
                m.stopped_until = None
            if m.ready is None and m.ready_file is not None and m.ready_file.exists() and m.alive():
                m.ready = json.loads(m.ready_file.read_text())
            if m.proc is not None and not m.recorded and not m.proc.alive():
                self.record_exit(m, now)
            elif m.termed_at is not None and now - m.termed_at > self.cfg.term_bound_s and m.proc is not None:
                self.report.failures.append(f"{m.name} still running {now - m.termed_at:.0f}s after SIGTERM")
                self.report.unexpected_exits.append(self.exit_record(m, "no exit after SIGTERM", now))
                m.cause = Cause.KILLED
                m.termed_at = None
                m.proc.kill()

    def record_exit(self, m: Member, now: float) -> None:
        assert m.proc is not None
        m.recorded = True
        status = m.proc.returncode
        assert status is not None
        if m.termed_at is not None:
            took = now - m.termed_at
            entry = {"node": m.name, "phase": m.term_phase, "status": status, "s": round(took, 2)}
            self.report.term_exits.append(entry)
            self.log(f"{m.name} left after SIGTERM in {took:.1f}s (status {status})")
            if took > self.cfg.term_bound_s:
                self.report.failures.append(f"{m.name} took {took:.0f}s to leave after SIGTERM")
        # giving up is documented only for a joiner whose every --peer went away, in one sentence, no traceback
        alone = bool(m.given) and set(m.given) <= m.harmed and "Traceback" not in m.proc.output()
        if not exit_expected(status, m.cause, gave_up_alone=alone):
            self.report.failures.append(f"{m.name} exited with status {status} at t={now - self.t0:.0f}s")
            self.report.unexpected_exits.append(self.exit_record(m, f"status {status}", now))
            self.log(f"UNEXPECTED: {m.name} exited with status {status}")
        elif m.cause is Cause.NONE:
            self.report.gave_up.append(f"{m.name} at t={now - self.t0:.0f}s")
        m.termed_at = None

    def exit_record(self, m: Member, what: str, now: float) -> dict[str, Any]:
        assert m.proc is not None
        tail = m.proc.output().splitlines()[-20:]
        return {"node": m.name, "incarnation": m.incarnation, "t": round(now - self.t0, 1), "what": what, "log": tail}

    def act(self, now: float) -> None:
        live = [m for m in self.members if m.alive() and m.termed_at is None and m.cause is not Cause.KILLED]
        running = [m for m in live if m.running()]
        dead = [m for m in self.members if not m.alive() and m.recorded and not group_alive_of(m)]
        action = choose_action(self.rng, len(running), len(live), len(dead), self.cfg.nodes)
        if action is None:
            return
        self.actions[action.value] += 1
        if action is Action.RESTART:
            self.spawn(self.rng.choice(dead), resume=True)
            return
        if action is Action.ADD:
            self.spawn(self.new_member(), resume=False)
            return
        # a frozen or starting node can crash too; only a running node is frozen; a frozen one cannot leave
        pool = {Action.KILL: live, Action.STOP: running}.get(action, [m for m in live if m.stopped_until is None])
        self.hit(self.rng.choice(pool), action, now)

    def hit(self, target: Member, action: Action, now: float) -> None:
        """Kill, stop (for a seeded few seconds) or terminate ``target``."""
        assert target.proc is not None
        for m in self.members:
            if target.name in m.given:
                m.harmed.add(target.name)
        if action is Action.KILL:
            target.cause, target.stopped_until = Cause.KILLED, None
            target.proc.kill()
        elif action is Action.STOP:
            target.stopped_until = now + self.rng.uniform(*self.cfg.stop_s)
            target.proc.stop()
        else:
            target.cause, target.termed_at, target.term_phase = Cause.TERMED, now, "mid-run"
            target.proc.term()
        self.log(f"{action.value} {target.name}")

    def act_on(self, now: float, step: tuple[Action, str]) -> None:
        """One scripted action on the named member (skipped, and logged, when that member cannot take it)."""
        action, name = step
        self.actions[action.value] += 1
        if action is Action.ADD:
            self.spawn(self.new_member(), resume=False)
            return
        target = next((m for m in self.members if m.name == name), None)
        if action is Action.RESTART and target is not None and not target.alive():
            self.spawn(target, resume=True)
            return
        if target is None or not target.alive() or target.termed_at is not None or target.proc is None:
            self.log(f"script: {action.value} {name} skipped (not live)")
            return
        self.hit(target, action, now)

    def run(self) -> None:
        """Start the first nodes, then act every 1-3 s until the duration is up; SIGTERM everyone at the end."""
        end = self.t0 + self.cfg.duration_s
        first = self.new_member()
        self.spawn(first, resume=False)

        def first_settled() -> bool:
            self.tick(time.monotonic())
            return first.ready is not None or first.recorded

        poll_until(first_settled, self.cfg.start_timeout_s, poll=TICK_S)
        if first.ready is None:
            self.report.failures.append(f"{first.name} did not start within {self.cfg.start_timeout_s:.0f}s")
            return
        self.started = True
        self.window = (time.time(), time.time())
        for _ in range(self.cfg.nodes - 1):
            self.spawn(self.new_member(), resume=False)
        next_at = time.monotonic() + self.rng.uniform(self.cfg.min_gap_s, self.cfg.max_gap_s)
        script, begun = list(self.cfg.script), time.monotonic()
        while (now := time.monotonic()) < end:
            self.tick(now)
            while script and now - begun >= script[0][0]:
                self.act_on(now, script.pop(0)[1:])
            if not self.cfg.script and now >= next_at:
                self.act(now)
                next_at = now + self.rng.uniform(self.cfg.min_gap_s, self.cfg.max_gap_s)
            time.sleep(TICK_S)
        self.window = (self.window[0], time.time())
        self.finish()

    def finish(self) -> None:
        """SIGCONT the frozen, SIGTERM every live node at once and time each exit (bounded)."""
        now = time.monotonic()
        for m in self.members:
            if m.stopped_until is not None:
                m.stopped_until = now  # the next tick sends SIGCONT
        self.tick(now)
        for m in self.members:
            # a node SIGKILLed just before may not be reaped yet: it is dying, and its -9 stays expected
            if m.alive() and m.termed_at is None and m.cause is not Cause.KILLED and m.proc is not None:
                m.cause, m.termed_at, m.term_phase = Cause.TERMED, now, "end"
                m.proc.term()
        self.log(f"SIGTERM to {sum(m.termed_at is not None for m in self.members)} nodes")
        deadline = now + self.cfg.term_bound_s + 1
        while any(not m.recorded for m in self.members) and time.monotonic() < deadline:
            self.tick(time.monotonic())
            time.sleep(TICK_S)
        self.tick(time.monotonic())  # past the deadline, whoever is left overran the bound and is killed

    def verdict(self) -> ChaosReport:
        """Read every node's metrics and judge the run (also fills counts and traceback tallies)."""
        r = self.report
        r.actions = dict(self.actions)
        syncs: list[Event] = []
        rounds: list[float] = []
        round_events: list[Event] = []
        starts: dict[str, float] = {}
        for m in self.members:
            events = list(read_events(self.cfg.out / "runs" / m.short / "metrics.jsonl"))
            round_events += [e for e in events if e.get("event") == "round"]
            starts[m.short] = max((float(e["time"]) for e in events if e.get("event") == "start"), default=0.0)
            node_rounds = [float(e["time"]) for e in events if e.get("event") == "round"]
            node_syncs = [e for e in events if e.get("event") == "sync"]
            r.rounds[m.name] = len(node_rounds)
            r.commits[m.name] = sum(bool(e.get("committed")) for e in node_syncs)
            rounds += node_rounds
            syncs += node_syncs
            logs = (self.cfg.out / "logs").glob(f"{m.name}.*.log")
            r.tracebacks[m.name] = sum(p.read_text(errors="replace").count("Traceback") for p in logs)
        if self.started:  # else the failure to start is the verdict
            judge(r, syncs, rounds, self.window, self.cfg, round_events, starts)
        return r


def rejudge(out: Path) -> ChaosReport:
    """Judge a finished run's files again (its report's window and counts; every node's metrics)."""
    old = json.loads((out / "chaos-report.json").read_text())
    report = ChaosReport(old["duration_s"], old["nodes"], old["seed"], actions=old.get("actions", {}))
    report.timeline, report.unexpected_exits = old.get("timeline", []), old.get("unexpected_exits", [])
    judged = ("state hashes", "no committed", "no round", "different histories")  # judged again below
    report.failures = [f for f in old.get("failures", []) if not any(j in f for j in judged)]
    events = [e for p in sorted((out / "runs").glob("*/metrics.jsonl")) for e in read_events(p)]
    syncs = [e for e in events if e.get("event") == "sync"]
    round_events = [e for e in events if e.get("event") == "round"]
    times = [float(e["time"]) for e in events]
    window = tuple(old["window"]) if old.get("window", [0, 0])[1] else (min(times), max(times))
    cfg = ChaosConfig(out=out, duration_s=report.duration_s, nodes=report.nodes, seed=report.seed)
    for e in syncs:
        short = str(e.get("peer", ""))[-6:]
        report.commits[short] = report.commits.get(short, 0) + bool(e.get("committed"))
    starts: dict[str, float] = {}
    for e in events:
        if e.get("event") == "start":
            short = str(e.get("peer", ""))[-6:]
            starts[short] = max(starts.get(short, 0.0), float(e["time"]))
    rounds = [float(e["time"]) for e in round_events]
    judge(report, syncs, rounds, (window[0], window[1]), cfg, round_events, starts)
    return report


def group_alive_of(m: Member) -> bool:
    return m.proc is not None and group_alive(m.proc.pid)


def run_chaos(cfg: ChaosConfig) -> ChaosReport:
    """One chaos run; every process it started is reaped on the way out (an exception or Ctrl-C included)."""
    (cfg.out / "ready").mkdir(parents=True, exist_ok=True)
    procs = Procs(cfg.out)
    try:
        chaos = Chaos(cfg, procs)
        chaos.run()
    finally:
        procs.reap(grace=5.0)
    report = chaos.verdict()
    (cfg.out / "chaos-report.json").write_text(report.to_json())
    return report


def parse_script(text: str) -> tuple[tuple[float, Action, str], ...]:
    """``"14:stop:n0,20:add:-"`` -> ((14.0, STOP, "n0"), (20.0, ADD, "-")), sorted by time.

    >>> parse_script("20:add:-,14:stop:n0")
    ((14.0, <Action.STOP: 'stop'>, 'n0'), (20.0, <Action.ADD: 'add'>, '-'))
    """
    steps = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"--script: {item!r} is not T:ACTION:NODE (e.g. 14:stop:n0)")
        try:
            steps.append((float(parts[0]), Action(parts[1]), parts[2]))
        except ValueError:
            raise ValueError(f"--script: {item!r}: T is seconds, ACTION one of {[a.value for a in Action]}") from None
    return tuple(sorted(steps, key=lambda s: s[0]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--duration-s", type=float, default=180.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs") / "chaos")
    ap.add_argument("--rejudge", type=Path, help="judge the files of a finished run in this --out folder again")
    ap.add_argument("--script", default="", help="a fixed schedule: comma-separated T:ACTION:NODE, e.g. 14:stop:n0")
    args = ap.parse_args(argv)
    if args.rejudge is not None:
        again = rejudge(args.rejudge)
        print(again.to_json())
        return 0 if again.ok else 1
    try:
        script = parse_script(args.script)
    except ValueError as e:
        ap.error(str(e))
    cfg = ChaosConfig(out=args.out, duration_s=args.duration_s, nodes=args.nodes, seed=args.seed, script=script)
    report = run_chaos(cfg)
    print(report.to_json())
    return 0 if report.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
