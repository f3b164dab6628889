"""How often a model solves each reasoning-gym family at several difficulties: where GRPO can learn.

GRPO learns from groups whose completions score differently; a family the model never solves (or
always solves) gives no signal, and neither do its groups when shared. For each ``rg:`` family and
each difficulty level below, this samples ``--questions`` questions x ``--generations`` completions
with the node's own policy and scoring and reports the success rate (mean reward), the format rate
(completions that contain an ``<answer>...</answer>`` tag, which the prompt asks for) and the share of
informative groups (rewards not all equal). The same seed, questions and sampling for every level.

    .venv/bin/python bench/bench_signal.py --model smollm2-135m --questions 16 --generations 4
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

LEVELS: dict[str, dict[str, dict[str, int]]] = {
    # the default of these two is their easiest level (two 1-digit terms), chosen with this bench
    "rg:basic_arithmetic": {
        "default": {},
        "medium": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        "hard": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2},
    },
    "rg:chain_sum": {
        "default": {},
        "medium": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        "hard": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    },
    "rg:leg_counting": {
        "easy": {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 2},
        "default": {},
        "hard": {"min_animals": 2, "max_animals": 3, "min_instances": 1, "max_instances": 3},
    },
    "rg:gcd": {"easy": {"min_value": 1, "max_value": 12}, "default": {}, "hard": {"min_value": 1, "max_value": 200}},
    "rg:lcm": {"easy": {"min_value": 1, "max_value": 6}, "default": {}, "hard": {"min_value": 1, "max_value": 30}},
    "rg:count_bits": {"easy": {"min_n": 1, "max_n": 15}, "default": {}, "hard": {"min_n": 1, "max_n": 4095}},
    "rg:letter_counting": {
        "easy": {"min_words": 1, "max_words": 3},
        "default": {},
        "hard": {"min_words": 6, "max_words": 10},
    },
    "rg:products": {"default": {}, "hard": {"min_digits": 1, "max_digits": 2}},
    "rg:spell_backward": {
        "easy": {"min_word_len": 3, "max_word_len": 3},
        "default": {},
        "hard": {"min_word_len": 5, "max_word_len": 7},
    },
}
"""Difficulty levels per family: config overrides of the family's default (``default``: none)."""

_TAG = re.compile(r"<answer>.*?</answer>", re.DOTALL)


def measure(policy: Any, family: str, config: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """Success, format and informative-group rates of one (family, config)."""
    from node.tasks.registry import build_task
    from node.training.policy import GenerationConfig

    fam = build_task(family, config)
    items = [fam.item(args.seed, i) for i in range(args.questions)]
    t0 = time.monotonic()
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    groups = policy.generate([it.prompt for it in items], args.generations, gen, seed=args.seed)
    rewards = [[fam.score(it, c) for c in comps] for it, comps in zip(items, groups, strict=True)]
    flat = [r for g in rewards for r in g]
    texts = [c for comps in groups for c in comps]
    return {
        "family": family,
        "config": dict(fam.config),
        "success": round(sum(flat) / len(flat), 3),
        "format": round(sum(1 for t in texts if _TAG.search(t)) / len(texts), 3),
        "informative_groups": round(sum(1 for g in rewards if len(set(g)) > 1) / len(rewards), 3),
        "seconds": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--family", action="append", default=[], help="only these families (repeatable)")
    p.add_argument(
        "--level", action="append", default=[], help="only these levels: easy, default, medium, hard (repeatable)"
    )
    p.add_argument(
        "--instruction",
        action="append",
        default=[],
        help="text appended to each question instead of the node's (repeatable: each is measured on the same "
        "questions); '\\n' is a newline",
    )
    args = p.parse_args()

    import torch

    import node.tasks.reasoning_gym as rg
    from node.training.models import load_model
    from node.training.policy import Policy

    torch.set_num_threads(args.threads)
    model, tok, model_id = load_model(args.model, seed=0, device="cpu")
    policy = Policy(model, tok, model_id)
    instructions = [i.replace("\\n", "\n") for i in args.instruction] or [rg.INSTRUCTION]
    rows = []
    for family, levels in LEVELS.items():
        if args.family and family not in args.family:
            continue
        for level, config in levels.items():
            if args.level and level not in args.level:
                continue
            for instruction in instructions:
                rg.INSTRUCTION = instruction  # read by each item as it is built: the same questions, another ending
                row = {"level": level, "instruction": instruction.strip(), **measure(policy, family, config, args)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("| family | level | config | instruction | success | format | informative groups |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in sorted(r["config"].items()))
        print(f"| {r['family']} | {r['level']} | {cfg} | {r['instruction']} | {r['success']:.2f} | "
              f"{r['format']:.2f} | {r['informative_groups']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
