"""Protocol fuzzer: mutated messages and streams against every parser a hostile peer can reach.

Each target (:mod:`bench.fuzz_targets`) takes genuine messages (descriptors,
batches, sync records, DHT records, payload streams, rollout groups) and
mutates them (:mod:`bench.fuzz_mutate`): bit flips, truncation, extension,
splices, random bytes, and msgpack-aware changes (another type, huge ints,
NaN/inf, deep nesting, long strings and lists, duplicate keys, wrong kinds,
bodies re-signed by their owner so that the signature holds). Allowed
outcomes are a value or the target's documented refusal (``MessageRejected``,
``FetchError``, ``IncompleteReadError``). A crash is anything else: another
exception, a result that breaks the target's contract, more than ``--slow-ms``
of CPU on one message, a call the CPU watchdog stops at ``--hang-s``, or RSS
growth over ``--max-growth-mb`` across a target's run.

A case is a pure function of (seed, target, index): every crash is printed
with the command that replays it.

Usage::

    .venv/bin/python bench/fuzz_protocol.py                  # 120k messages, at most --budget-s
    .venv/bin/python bench/fuzz_protocol.py --targets protocol.open_batch --replay 123
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import resource
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script: bench/ and the packages import from the repository root

from bench.fuzz_corpus import Target, UnexpectedResult  # noqa: E402
from bench.fuzz_targets import all_targets  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class FuzzConfig:
    """How much to fuzz and what counts as a crash."""

    seed: int = field(default=1, metadata={"help": "Seed of every case: (seed, target, index) fixes a case."})
    count: int = field(default=120_000, metadata={"help": "Messages in total, split over targets by share."})
    budget_s: float = field(default=270.0, metadata={"help": "Wall-clock bound on the whole run, seconds."})
    slow_ms: float = field(default=100.0, metadata={"help": "CPU time on one message above which it is a crash."})
    hang_s: float = field(default=2.0, metadata={"help": "CPU time at which the watchdog stops one call."})
    max_growth_mb: float = field(default=64.0, metadata={"help": "RSS growth over one target's run that is a crash."})
    max_crashes: int = field(default=0, metadata={"help": "Stop a target after this many crashes (0: never)."})

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count={self.count}; fuzz at least 1 message (e.g. --count 120000)")
        for name in ("budget_s", "slow_ms", "hang_s", "max_growth_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}; use a positive value")
        if self.hang_s * 1000 < self.slow_ms:
            raise ValueError(f"hang_s={self.hang_s} is below slow_ms={self.slow_ms}; set --hang-s >= slow-ms / 1000")
        if self.max_crashes < 0:
            raise ValueError(f"max_crashes={self.max_crashes}; use 0 (never stop) or a positive count")


class Outcome(StrEnum):
    """What one call came to; all but the first two are crashes (MEMORY is one of a whole target run)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    EXCEPTION = "unexpected exception"
    WRONG_RESULT = "wrong result"
    SLOW = "slow"
    HANG = "stopped by the watchdog"
    MEMORY = "memory growth"


CRASHES = frozenset(Outcome) - {Outcome.ACCEPTED, Outcome.REJECTED}


class Hang(BaseException):
    """Raised into a call by the CPU watchdog; a BaseException so that no target's ``except Exception`` hides it."""


@dataclass(frozen=True)
class Crash:
    """One crash: which case of which target, what happened, and the case as a reproducer line."""

    target: str
    index: int
    outcome: Outcome
    detail: str
    case: str

    def replay_command(self, seed: int) -> str:
        target = shlex.quote(self.target)  # "tasks.verify_external[long]" is a glob to the shell
        return f".venv/bin/python bench/fuzz_protocol.py --seed {seed} --targets {target} --replay {self.index}"


@dataclass
class TargetReport:
    """Counts by outcome, crashes, and the cost of one target's run."""

    name: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    crashes: list[Crash] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_cpu_ms: float = 0.0
    rss_growth_mb: float = 0.0

    @property
    def messages(self) -> int:
        return sum(self.counts.values())


@dataclass
class FuzzReport:
    """Every target's report, the run's wall time and the process's peak RSS."""

    targets: list[TargetReport]
    wall_s: float
    peak_rss_mb: float

    @property
    def messages(self) -> int:
        return sum(t.messages for t in self.targets)

    @property
    def crashes(self) -> list[Crash]:
        return [c for t in self.targets for c in t.crashes]


def case_rng(seed: int, target: str, index: int) -> random.Random:
    """The rng of one case (string seeds hash with sha512: stable across processes and hash seeds)."""
    return random.Random(f"{seed}:{target}:{index}")


class Watchdog:
    """Interrupts the call after :meth:`arm` with :class:`Hang` once it has used ``limit_s`` of CPU time.

    ITIMER_VIRTUAL counts CPU time, not wall time, so other processes on a busy machine do not trip
    it, and SIGALRM stays free for pytest-timeout. Off the main thread (no signals there) it does nothing.
    """

    def __init__(self, limit_s: float, active: bool) -> None:
        self.limit_s, self.active = limit_s, active

    def arm(self) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_VIRTUAL, self.limit_s)

    def disarm(self) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)


@contextmanager
def cpu_watchdog(limit_s: float) -> Iterator[Watchdog]:
    """A :class:`Watchdog` whose signal handler is installed for the duration of the block."""
    if threading.current_thread() is not threading.main_thread():
        yield Watchdog(limit_s, active=False)
        return

    def on_timer(_signum: int, frame: FrameType | None) -> None:
        where = f"{_relative(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})" if frame else "?"
        raise Hang(f"more than {limit_s}s of CPU time, interrupted in {where}")

    previous = signal.signal(signal.SIGVTALRM, on_timer)
    watchdog = Watchdog(limit_s, active=True)
    try:
        yield watchdog
    finally:
        watchdog.disarm()
        signal.signal(signal.SIGVTALRM, previous)


def call_once(target: Target[Any], case: Any, watchdog: Watchdog, slow_ms: float) -> tuple[Outcome, str, float]:
    """Run one case: (outcome, detail for a crash, CPU milliseconds)."""
    detail = ""
    start = time.thread_time()
    try:
        watchdog.arm()
        try:
            outcome = Outcome.ACCEPTED if target.run(case) else Outcome.REJECTED
        finally:
            watchdog.disarm()
    except Hang as e:
        outcome, detail = Outcome.HANG, str(e)
    except UnexpectedResult as e:
        outcome, detail = Outcome.WRONG_RESULT, str(e)
    except target.handled:
        outcome = Outcome.REJECTED
    except Exception as e:
        outcome, detail = Outcome.EXCEPTION, f"{type(e).__name__}: {str(e)[:200]} at {_where(e)}"
    cpu_ms = (time.thread_time() - start) * 1e3
    if outcome not in CRASHES and cpu_ms > slow_ms:
        outcome, detail = Outcome.SLOW, f"{cpu_ms:.0f} ms of CPU (limit {slow_ms:.0f} ms), {outcome.value}"
    return outcome, detail, cpu_ms


def _where(e: BaseException) -> str:
    """The innermost frame of ``e``'s traceback, as path:line (function)."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{_relative(frame.filename)}:{frame.lineno} ({frame.name})"


def _relative(path: str) -> str:
    return path.removeprefix(str(REPO) + "/")


def _render(target: Target[Any], case: Any) -> str:
    try:
        return target.render(case)
    except Exception as e:  # a reproducer line must not end the run: the replay command still works
        return f"(could not render the case: {type(e).__name__})"


def _rss_mb(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / 2**20


def run_target(
    target: Target[Any], count: int, deadline: float, cfg: FuzzConfig, clock: Callable[[], float] = time.monotonic
) -> TargetReport:
    """Up to ``count`` cases of ``target`` until ``deadline`` (on ``clock``); every crash is kept."""
    report, process = TargetReport(target.name), psutil.Process()
    # a full collection walks every object torch and hivemind left behind (~100 ms): freezing them keeps
    # those pauses from being billed, as "slow", to whichever case happened to trigger one
    gc.collect()
    gc.freeze()
    warm_up = min(200, count // 10)  # caches (task datasets, imports) fill first: growth is measured after
    base_rss = peak_rss = _rss_mb(process)
    start = clock()
    with cpu_watchdog(cfg.hang_s) as watchdog:
        for index in range(count):
            if clock() >= deadline or (cfg.max_crashes and len(report.crashes) >= cfg.max_crashes):
                break
            case = target.make(case_rng(cfg.seed, target.name, index))
            outcome, detail, cpu_ms = call_once(target, case, watchdog, cfg.slow_ms)
            report.counts[outcome] += 1
            report.cpu_s += cpu_ms / 1e3
            report.max_cpu_ms = max(report.max_cpu_ms, cpu_ms)
            if outcome in CRASHES:
                report.crashes.append(Crash(target.name, index, outcome, detail, _render(target, case)))
                logger.warning("CRASH %s #%d: %s: %s", target.name, index, outcome.value, detail)
            if index == warm_up:
                base_rss = peak_rss = _rss_mb(process)
            elif index % 256 == 0:
                peak_rss = max(peak_rss, _rss_mb(process))
    report.wall_s = clock() - start
    report.rss_growth_mb = max(peak_rss, _rss_mb(process)) - base_rss
    if report.rss_growth_mb > cfg.max_growth_mb:
        detail = f"RSS grew {report.rss_growth_mb:.0f} MB (limit {cfg.max_growth_mb:.0f} MB)"
        report.crashes.append(Crash(target.name, report.messages, Outcome.MEMORY, detail, "(whole run)"))
    return report


def fuzz(targets: Sequence[Target[Any]], cfg: FuzzConfig, clock: Callable[[], float] = time.monotonic) -> FuzzReport:
    """Run every target in turn: counts by share; a target's time is its share of what is left of the budget."""
    start = clock()
    end = start + cfg.budget_s
    total_share = sum(t.share for t in targets)
    reports: list[TargetReport] = []
    for i, target in enumerate(targets):
        count = max(1, round(cfg.count * target.share / total_share))
        left_share = sum(t.share for t in targets[i:])
        deadline = clock() + (end - clock()) * target.share / left_share
        reports.append(run_target(target, count, deadline, cfg, clock))
        logger.info("%s: %d messages in %.1fs", target.name, reports[-1].messages, reports[-1].wall_s)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return FuzzReport(reports, clock() - start, peak)


def replay(target: Target[Any], index: int, cfg: FuzzConfig) -> str:
    """Re-run one case and describe it (the case, its outcome and the traceback of a crash)."""
    case = target.make(case_rng(cfg.seed, target.name, index))
    with cpu_watchdog(cfg.hang_s) as watchdog:
        outcome, detail, cpu_ms = call_once(target, case, watchdog, cfg.slow_ms)
    lines = [f"{target.name} #{index}: {outcome.value} in {cpu_ms:.1f} ms CPU", f"case: {target.render(case)}"]
    if outcome in CRASHES:
        lines.append(f"detail: {detail}")
    if outcome == Outcome.EXCEPTION:
        try:  # again without the harness, for the full traceback (not for a hang: it would spin unstopped)
            target.run(case)
        except Exception:
            lines.append(traceback.format_exc())
    return "\n".join(lines)


def format_report(report: FuzzReport) -> str:
    """The summary as a markdown table, one row per target and a total."""
    rows = [
        "| target | messages | accepted | rejected | crashes | msg/s | mean CPU us | max CPU ms | RSS growth MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in report.targets:
        rate = t.messages / t.wall_s if t.wall_s > 0 else 0.0
        mean_us = 1e6 * t.cpu_s / max(t.messages, 1)
        rows.append(
            f"| {t.name} | {t.messages} | {t.counts[Outcome.ACCEPTED]} | {t.counts[Outcome.REJECTED]} "
            f"| {len(t.crashes)} | {rate:,.0f} | {mean_us:,.0f} | {t.max_cpu_ms:,.1f} | {t.rss_growth_mb:+.1f} |"
        )
    rate = report.messages / report.wall_s if report.wall_s > 0 else 0.0
    rows.append(f"| **total** | {report.messages} | | | {len(report.crashes)} | {rate:,.0f} | | | |")
    rows.append(f"\nwall {report.wall_s:.1f} s, peak RSS {report.peak_rss_mb:.0f} MB")
    return "\n".join(rows)


def format_crashes(report: FuzzReport, seed: int, per_kind: int = 3) -> str:
    """Reproducers: the first ``per_kind`` crashes of each (target, outcome, exception type)."""
    shown: dict[tuple[str, str, str], int] = {}
    lines: list[str] = []
    for c in report.crashes:
        kind = (c.target, str(c.outcome), c.detail.split(":", 1)[0])
        shown[kind] = shown.get(kind, 0) + 1
        if shown[kind] <= per_kind:
            lines += [f"- {c.target} #{c.index}: {c.outcome}: {c.detail}", f"  case: {c.case}"]
            lines.append(f"  replay: {c.replay_command(seed)}")
    hidden = sum(max(0, n - per_kind) for n in shown.values())
    return "\n".join(lines + ([f"({hidden} more of the same kinds)"] if hidden else []))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    for f in fields(FuzzConfig):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default, help=f.metadata["help"]
        )
    parser.add_argument("--targets", default="", help="Comma-separated target names (default: all).")
    parser.add_argument("--replay", type=int, default=None, help="Re-run case INDEX of the one target named.")
    args = parser.parse_args(argv)
    cfg = FuzzConfig(**{f.name: getattr(args, f.name) for f in fields(FuzzConfig)})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    targets = all_targets()
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - {t.name for t in targets})
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {[t.name for t in targets]}")
    chosen = [t for t in targets if not names or t.name in names]
    if args.replay is not None:
        if len(chosen) != 1:
            parser.error("--replay needs exactly one --targets name")
        print(replay(chosen[0], args.replay, cfg))
        return 0
    report = fuzz(chosen, cfg)
    print(format_report(report))
    if report.crashes:
        print(f"\n{len(report.crashes)} crashes:\n{format_crashes(report, cfg.seed)}")
    return 1 if report.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
