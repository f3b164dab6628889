"""reasoning-gym families: regenerated exactly from their reference, gold scores 1.0, bad configs refused."""

from __future__ import annotations

import pytest

from node.tasks import reasoning_gym as rg
from node.tasks.reasoning_gym import INSTRUCTION, RG_SPECS, RG_TASK_NAMES
from node.tasks.registry import BadTaskConfig, TaskMix, UnknownTask, build_task, task_from_ref, task_names
from node.tasks.verify import RejectReason, verify_external
from protocol.schema import RolloutGroup, TaskRef

pytest.importorskip("reasoning_gym")


def test_at_least_six_families_including_the_required_ones() -> None:
    assert len(RG_TASK_NAMES) >= 6
    for name in ("rg:basic_arithmetic", "rg:chain_sum", "rg:leg_counting"):
        assert name in RG_TASK_NAMES and name in task_names()
    assert "rg:propositional_logic" not in RG_TASK_NAMES  # no single gold answer


@pytest.mark.parametrize("name", RG_TASK_NAMES)
def test_regenerates_from_reference_and_gold_scores_one(name: str) -> None:
    import reasoning_gym

    fam = build_task(name)
    for seed, index in [(0, 0), (7, 3), (123, 5 * 2**20 + 1), (2**62, 2**40)]:
        item = fam.item(seed, index)
        wire = TaskRef.from_wire(item.ref.to_wire())  # what a receiver gets
        fam2, again = task_from_ref(wire)
        assert again == item and fam2.name == name
        assert item.prompt.endswith(INSTRUCTION)
        assert fam.score(item, item.answer) == 1.0
        assert fam.score(item, f"Let me think.\n<answer>{item.answer}</answer>") == 1.0
        assert fam.score(item, item.answer + "0") == 0.0
        # reasoning-gym's own generator and scorer agree: same entry, gold scores 1.0
        dataset = name.removeprefix("rg:")
        ds = reasoning_gym.create_dataset(dataset, seed=seed, size=10, **RG_SPECS[dataset][1], **item.ref.config)
        entry = ds[index]
        assert str(entry["answer"]) == item.answer
        assert item.prompt.startswith(str(entry["question"]).rstrip())
        assert ds.score_answer(item.answer, entry) == 1.0


def test_items_vary_and_mix_with_builtins() -> None:
    fam = build_task("rg:chain_sum")
    assert len({fam.item(1, i).prompt for i in range(20)}) > 10
    mix = TaskMix([build_task("max"), fam], seed=3)
    items = mix.sample(round=2, n=8)
    assert items == TaskMix([build_task("max"), build_task("rg:chain_sum")], seed=3).sample(round=2, n=8)


def test_config_is_bounded_and_checked() -> None:
    assert build_task("rg:chain_sum", {"max_digits": 3}).config["max_digits"] == 3
    for bad in ({"max_digits": 99}, {"size": 10}, {"data_file": "/etc/passwd"}, {"max_terms": "3"}):
        with pytest.raises(BadTaskConfig):
            build_task("rg:chain_sum", bad)
    with pytest.raises(BadTaskConfig, match="reasoning-gym rejects"):
        build_task("rg:chain_sum", {"min_terms": 5, "max_terms": 2})
    with pytest.raises(UnknownTask, match="rg:chain_sum"):
        build_task("rg:propositional_logic")


def test_peer_group_is_rescored_locally() -> None:
    item = build_task("rg:leg_counting").item(4, 9)
    completions = (f"<answer>{item.answer}</answer>", "Answer: 1000000", "no idea")
    group = RolloutGroup(item.ref, item.prompt, completions, (0.0, 1.0, 0.0), "smollm2-135m")
    verdict = verify_external(group, source_peer="peer")
    assert verdict.group is not None and verdict.group.rewards == (1.0, 0.0, 0.0)
    assert verdict.reward_mismatches == 2
    forged = RolloutGroup(item.ref, item.prompt + " ", completions, (1.0, 0.0, 0.0), "m")
    assert verify_external(forged).reason is RejectReason.PROMPT_MISMATCH


def test_dataset_cache_is_bounded_and_says_what_a_seed_would_build(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = rg.DatasetCache(2)
    monkeypatch.setattr(rg, "_DATASETS", cache)
    fam = build_task("rg:chain_sum")  # builds (and caches) its seed-0 dataset to check the config
    assert not fam.needs_build(0) and fam.needs_build(1) and len(cache) == 1
    fam.item(1, 0)
    fam.item(0, 0)  # seed 0 is now the most recent
    fam.item(2, 0)  # evicts seed 1, the least recently used
    assert len(cache) == 2 and fam.needs_build(1) and not fam.needs_build(0) and not fam.needs_build(2)
    assert not build_task("max").needs_build(12345)  # a built-in item costs a hash and a few draws
    with pytest.raises(ValueError, match="at least 1"):
        rg.DatasetCache(0)
