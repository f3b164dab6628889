"""Task families: determinism, gold answers, config validation, re-derivation from references, the mix."""

from __future__ import annotations

import dataclasses
import random

import pytest

from node.tasks.registry import (
    BUILTIN_TASKS,
    BadTaskConfig,
    TaskDigestMismatch,
    TaskMix,
    UnknownTask,
    build_task,
    rollout_group,
    task_from_ref,
)
from protocol.schema import RolloutGroup, TaskRef


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_family_is_deterministic_and_gold_scores_one(name: str) -> None:
    fam = build_task(name)
    state = random.getstate()
    items = [fam.item(seed=3, index=i) for i in range(50)]
    assert random.getstate() == state  # never touches the global RNG
    assert items == [build_task(name).item(seed=3, index=i) for i in range(50)]
    assert len({it.prompt for it in items}) > 5  # items vary with the index
    assert items != [fam.item(seed=4, index=i) for i in range(50)]
    for it in items:
        assert it.ref == TaskRef.make(name, fam.config, 3, it.ref.index)
        assert 1 <= len(it.answer) <= 2 and len(it.prompt) <= 24
        assert fam.score(it, it.answer) == 1.0
        assert fam.score(it, f" {it.answer}\n") == 1.0  # surrounding whitespace is ignored
        wrong = "x" if it.answer != "x" else "y"
        assert fam.score(it, wrong) == 0.0
        assert fam.score(it, it.answer + "7") == 0.0
        assert fam.score(it, "") == 0.0


def test_known_answers() -> None:
    cases = {"max": ("max ", max), "min": ("min ", min)}
    for name, (prefix, fn) in cases.items():
        it = build_task(name, {"digits": 6}).item(0, 9)
        digits = it.prompt.removeprefix(prefix).removesuffix("=")
        assert len(digits) == 6 and it.answer == fn(digits)
    it = build_task("parity").item(1, 2)
    assert it.answer == str(sum(map(int, it.prompt[4:-1])) % 2)
    it = build_task("summod", {"terms": 3}).item(1, 2)
    assert it.answer == str(sum(map(int, it.prompt.removesuffix("%10=").split("+"))) % 10)
    it = build_task("pos").item(5, 5)
    k, digits = it.prompt[3:-1].split(" ")
    assert it.answer == digits[int(k) - 1]
    it = build_task("count").item(5, 5)
    d, digits = it.prompt[5], it.prompt[7:-1]
    assert it.answer == str(digits.count(d))


def test_config_defaults_and_validation() -> None:
    assert build_task("max").config == {"digits": 4}
    assert build_task("max", {"digits": 6}).digest != build_task("max").digest
    for bad in ({"digits": 1}, {"digits": 99}, {"digits": True}, {"digits": "4"}, {"digits": 4.0}, {"depth": 2}):
        with pytest.raises(BadTaskConfig):
            build_task("max", bad)
    with pytest.raises(UnknownTask):
        build_task("chess")


def test_task_from_ref_rederives_and_rejects() -> None:
    fam = build_task("count", {"digits": 7})
    item = fam.item(seed=11, index=42)
    family, again = task_from_ref(item.ref)
    assert family.name == "count" and again == item
    with pytest.raises(TaskDigestMismatch):
        task_from_ref(dataclasses.replace(item.ref, config_digest="0" * 16))
    with pytest.raises(UnknownTask):
        task_from_ref(TaskRef.make("chess", {"digits": 7}, 11, 42))
    with pytest.raises(BadTaskConfig):
        task_from_ref(TaskRef.make("count", {"digits": 1000}, 11, 42))  # out of range
    with pytest.raises(BadTaskConfig):
        task_from_ref(TaskRef.make("count", {}, 11, 42))  # incomplete: digest would not be canonical
    with pytest.raises(UnknownTask):
        task_from_ref(TaskRef.make("count", {"digits": 7}, -1, 42))


def test_task_mix_is_deterministic_per_round() -> None:
    fams = [build_task("max"), build_task("parity"), build_task("summod", {"terms": 3})]
    mix = TaskMix(fams, seed=5)
    r3 = mix.sample(3, 16)
    assert r3 == TaskMix(fams, seed=5).sample(3, 16)
    assert r3 != mix.sample(4, 16) and r3 != TaskMix(fams, seed=6).sample(3, 16)
    assert {it.ref.family for it in mix.sample(0, 64)} == {"max", "parity", "summod"}
    assert len({it.ref.index for r in range(3) for it in mix.sample(r, 16)}) == 48  # no repeats
    only_max = TaskMix(fams, seed=5, weights=[1.0, 0.0, 0.0]).sample(1, 20)
    assert {it.ref.family for it in only_max} == {"max"}
    with pytest.raises(ValueError):
        TaskMix([], seed=0)


def test_rollout_group_round_trips_the_wire() -> None:
    item = build_task("min").item(0, 0)
    group = rollout_group(item, ["1", "2"], [1.0, 0.0], "tiny-s")
    assert RolloutGroup.from_wire(group.to_wire()) == group
