"""The protocol fuzzer (bench/fuzz_protocol.py), small: ~2k mutated messages, no crash in any target.

Each target runs :data:`PER_TARGET` deterministic cases (seed 1) and must end
every one in a value or its documented refusal, reach both the accept and the
refuse path, and stay within the CPU limits. Targets with an open finding are
strict xfails naming the reproducer: they start failing (XPASS) once the bug is
fixed, which is the cue to drop the mark. The harness itself is tested on fake
targets that crash, hang, burn CPU, lie or leak.
"""

from __future__ import annotations

import mmap
import time
from typing import Any

import pytest

import swarm.validation
from bench.fuzz_corpus import Target, UnexpectedResult
from bench.fuzz_protocol import CRASHES, FuzzConfig, Outcome, call_once, case_rng, cpu_watchdog, fuzz, run_target
from bench.fuzz_targets import all_targets
from protocol.errors import MessageRejected
from protocol.messages import open_descriptor

PER_TARGET = 200
CFG = FuzzConfig(seed=1, count=PER_TARGET, budget_s=60.0, slow_ms=100.0, hang_s=0.5, max_crashes=1)

DEEP_KIND = b"\x83\xa4kind" + b"\x91" * 1000 + b"\xc0" + b"\xa4body\xc4\x00\xa3sig\xc4\x00"
"""A 1012-byte descriptor envelope whose kind is a list nested 1000 deep (msgpack decodes it)."""

OPEN_FINDINGS: dict[str, str] = {}
"""Targets with a known, unfixed crash (strict xfail); fixed: a deep envelope kind and a deep subkey were
repr()'d into RecursionError (protocol/signing.py open_envelope, swarm/exchange.py), found by this fuzzer."""
TARGET_NAMES = (
    "protocol.codec.unpack",
    "protocol.open_descriptor",
    "protocol.open_batch",
    "sync.open_record",
    "swarm.validator.validate",
    "sync.open_records",
    "exchange.select_descriptors",
    "payload_stream._read_response",
    "payload_stream.serve_one",
    "tasks.verify_external",
    "tasks.verify_external[long]",
)


@pytest.fixture(scope="module")
def targets() -> dict[str, Target[Any]]:
    return {t.name: t for t in all_targets()}


def _param(name: str) -> Any:
    finding = OPEN_FINDINGS.get(name)
    marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=finding)] if finding else []
    return pytest.param(name, marks=marks, id=name)


def test_every_target_is_fuzzed(targets: dict[str, Target[Any]]) -> None:
    assert tuple(targets) == TARGET_NAMES


@pytest.mark.parametrize("name", [_param(n) for n in TARGET_NAMES])
def test_target_survives_mutated_messages(name: str, targets: dict[str, Target[Any]]) -> None:
    report = run_target(targets[name], PER_TARGET, time.monotonic() + CFG.budget_s, CFG)
    crashes = [f"#{c.index} {c.outcome}: {c.detail}\n  {c.case[:300]}" for c in report.crashes]
    assert not crashes, "\n".join(crashes)
    assert report.messages == PER_TARGET
    # both paths are reached: the fuzzer is not only feeding garbage that dies in the first check
    assert report.counts[Outcome.ACCEPTED] > 0
    assert report.counts[Outcome.REJECTED] > 0


def test_deep_envelope_kind_is_a_rejection() -> None:
    with pytest.raises(MessageRejected):
        open_descriptor(DEEP_KIND)


def test_validator_target_catches_the_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    # validate() turns any exception into a refusal and a WARNING: the target must still call that a crash
    def broken(*_: Any) -> Any:
        raise RuntimeError("bug in a check")

    monkeypatch.setattr(swarm.validation, "open_envelope", broken)
    # a fresh validator: the shared one remembers the envelopes it opened in earlier tests, and would not open them
    fresh = next(t for t in all_targets() if t.name == "swarm.validator.validate")
    report = run_target(fresh, 50, time.monotonic() + 30, CFG)
    assert report.crashes and report.crashes[0].outcome == Outcome.WRONG_RESULT
    assert "catch-all" in report.crashes[0].detail


# ---- the harness ---------------------------------------------------------------------------------


def _fake(run: Any, name: str = "fake") -> Target[bytes]:
    return Target(name, lambda rng: rng.randbytes(8), run, share=1.0)


def _crash_on_high_byte(data: bytes) -> bool:
    if data[0] > 250:
        raise KeyError("boom")
    if data[0] % 2:
        raise MessageRejected("odd")
    return True


def test_harness_counts_a_crashing_target_with_a_replayable_case() -> None:
    report = fuzz([_fake(_crash_on_high_byte, "fake.crashing")], FuzzConfig(count=400, budget_s=30.0))
    assert report.messages == 400 and report.crashes
    crash = report.crashes[0]
    assert crash.outcome == Outcome.EXCEPTION and crash.detail.startswith("KeyError")
    replayed = case_rng(1, "fake.crashing", crash.index).randbytes(8)
    assert replayed[0] > 250 and f"hex={replayed.hex()}" in crash.case
    assert "--targets fake.crashing --replay" in crash.replay_command(1)
    assert {Outcome.ACCEPTED, Outcome.REJECTED} <= {o for o, n in report.targets[0].counts.items() if n}


def test_harness_stops_a_hang_and_flags_slow_and_wrong_results() -> None:
    def spin(_: bytes) -> bool:
        while True:
            pass

    def burn(_: bytes) -> bool:
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        return True

    def lie(_: bytes) -> bool:
        raise UnexpectedResult("returned nonsense")

    cfg = FuzzConfig(slow_ms=10.0, hang_s=0.2)
    with cpu_watchdog(cfg.hang_s) as watchdog:
        outcomes = [call_once(_fake(f), b"x", watchdog, cfg.slow_ms)[0] for f in (spin, burn, lie)]
    assert outcomes == [Outcome.HANG, Outcome.SLOW, Outcome.WRONG_RESULT]
    assert set(outcomes) <= CRASHES


def test_harness_flags_memory_growth() -> None:
    kept: list[mmap.mmap] = []

    def leak(_: bytes) -> bool:
        # fresh anonymous pages, touched: a bytes object could reuse heap memory that earlier tests freed
        # (glibc raises its mmap threshold after large frees), and then RSS would not grow
        page = mmap.mmap(-1, 1 << 20)
        page.write(b"\x01" * (1 << 20))
        kept.append(page)
        return True

    report = run_target(_fake(leak), 60, time.monotonic() + 30, FuzzConfig(max_growth_mb=8.0))
    assert [c.outcome for c in report.crashes] == [Outcome.MEMORY]


def test_config_names_the_fix() -> None:
    with pytest.raises(ValueError, match="--hang-s"):
        FuzzConfig(slow_ms=5000.0, hang_s=1.0)
    with pytest.raises(ValueError, match="count"):
        FuzzConfig(count=0)
