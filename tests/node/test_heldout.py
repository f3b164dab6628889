"""The held-out split: no training stream and no peer's group ever reaches an evaluation prompt."""

from __future__ import annotations

import itertools

import pytest

from node.tasks.builtin import BUILTIN_TASKS
from node.tasks.heldout import HELD_OUT_SHARE, eval_items, is_held_out
from node.tasks.reasons import FAULTS, RejectReason
from node.tasks.registry import TaskMix, build_task, rollout_group
from node.tasks.verify import verify_external


def test_every_family_has_an_evaluation_set_of_held_out_distinct_prompts() -> None:
    for name in BUILTIN_TASKS:
        items = eval_items(build_task(name), 64)
        assert items, name
        assert all(is_held_out(name, it.prompt) for it in items)
        assert len({it.prompt for it in items}) == len(items)


def test_the_evaluation_set_is_the_same_on_every_node() -> None:
    """A pure function of family and config: two nodes building it apart get the same questions."""
    a = [(it.prompt, it.answer) for it in eval_items(build_task("pos"), 32)]
    b = [(it.prompt, it.answer) for it in eval_items(build_task("pos"), 32)]
    assert a == b and len(a) == 32
    other = [it.prompt for it in eval_items(build_task("pos", {"digits": 5}), 32)]
    assert other != [p for p, _ in a]  # another config is another family: its own set


def test_a_small_family_gives_all_it_holds_out_without_hanging() -> None:
    """``summod`` with 2 terms has 100 prompts: the set is every held-out one, found by enumeration."""
    fam = build_task("summod", {"terms": 2})
    everything = {f"{a}+{b}%10=" for a, b in itertools.product(range(10), repeat=2)}
    held = {p for p in everything if is_held_out("summod", p)}
    got = {it.prompt for it in eval_items(fam, 64)}
    assert got == held and 0 < len(held) < 20


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_no_training_stream_ever_samples_a_held_out_prompt(name: str) -> None:
    fam = build_task(name)
    held = {it.prompt for it in eval_items(fam, 64)}
    for seed in (0, 1, 100, 2**40):
        mix = TaskMix([fam], seed=seed)
        seen = [it.prompt for r in range(1, 61) for it in mix.sample(r, 8)]
        assert not any(is_held_out(name, p) for p in seen)
        assert not held & set(seen)


def test_the_split_reserves_about_its_share_of_prompts() -> None:
    prompts = [f"max {n:04d}=" for n in range(10_000)]  # every prompt of max with 4 digits
    share = sum(is_held_out("max", p) for p in prompts) / len(prompts)
    assert abs(share - HELD_OUT_SHARE) < 0.01


def test_a_peer_group_on_a_held_out_prompt_is_refused_and_not_a_fault() -> None:
    """A peer cannot train a node on the questions it is measured on (nor be banned for an older split)."""
    fam = build_task("max")
    item = eval_items(fam, 1)[0]
    bad = verify_external(rollout_group(item, [item.answer, "0"], [1.0, 0.0], "tiny-s"), source_peer="p")
    assert bad.group is None and bad.reason is RejectReason.HELD_OUT
    assert RejectReason.HELD_OUT not in FAULTS
    ok_item = TaskMix([fam], seed=5).sample(1, 1)[0]
    good = verify_external(rollout_group(ok_item, [ok_item.answer, "0"], [1.0, 0.0], "tiny-s"), source_peer="p")
    assert good.group is not None
