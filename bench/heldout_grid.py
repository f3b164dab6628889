"""Does GRPO teach a tiny model a skill it can use on held-out questions? One node, no network.

Trains one built-in model alone (the 8/0 setting of the swarm) from the shared
initial weights and an optional warm start, and prints its held-out greedy
accuracy and sampled reward every fifth of the run. Several settings run one
after another, each a line::

    python bench/heldout_grid.py --tasks max,pos --rounds 300 \\
        --grid "warm=0,lr=1e-3" "warm=640,lr=1e-3" "warm=640,lr=1e-3,beta=0.1" "warm=640,lr=1e-3,prompts=32"

A setting's keys: ``warm`` (warm-start steps), ``lr``, ``beta`` (KL to the
initial weights), ``temp`` (sampling temperature), ``prompts`` (questions per
round). Greedy accuracy equal to the sampled reward means the policy answers
each question the same way every time: it has stopped exploring.
"""

from __future__ import annotations

import argparse
import time

import torch

from node.tasks.registry import TaskMix, build_task
from node.tasks.verify import local_group
from node.training.adapters import SHARED_BASE_SEED
from node.training.evaluate import EvalConfig, eval_sets, evaluate
from node.training.grpo import GRPOConfig, GRPOTrainer
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy
from node.training.warmstart import warm_start

DEFAULTS = {"warm": 0.0, "lr": 1e-3, "beta": 0.0, "temp": 1.0, "prompts": 8.0}


def parse_setting(text: str) -> dict[str, float]:
    """``"warm=640,lr=1e-3"`` -> the setting with defaults filled in; ValueError naming a bad key."""
    out = dict(DEFAULTS)
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in DEFAULTS:
            raise ValueError(f"unknown key {key!r} in {text!r}; use {', '.join(DEFAULTS)}")
        out[key] = float(value)
    return out


def run(model_name: str, tasks: list[str], setting: dict[str, float], rounds: int, seed: int) -> str:
    """One setting's line: held-out accuracy / sampled reward at 0, 1/5, ..., all of the rounds."""
    families = {n: build_task(n) for n in tasks}
    model, tok, mid = load_model(model_name, seed=SHARED_BASE_SEED, device="cpu")
    policy = Policy(model, tok, mid)
    warm_start(policy, families, int(setting["warm"]))
    trainer = GRPOTrainer(policy, GRPOConfig(learning_rate=setting["lr"], beta=setting["beta"]))
    mix, sets = TaskMix(list(families.values()), seed=seed), eval_sets(families, 64)
    gen = GenerationConfig(max_new_tokens=1, temperature=setting["temp"])
    points, t0 = [], time.perf_counter()
    for rnd in range(rounds + 1):
        if rnd % max(1, rounds // 5) == 0 or rnd == rounds:
            e = evaluate(policy, families, sets, gen, EvalConfig(eval_samples=4))
            points.append(f"{rnd}:{e.accuracy:.2f}/{e.sample_reward or 0:.2f}")
        if rnd == rounds:
            break
        items = mix.sample(rnd + 1, int(setting["prompts"]))
        outs = policy.generate([it.prompt for it in items], 8, gen, seed=seed * 1_000_003 + rnd)
        trainer.step([local_group(families[it.ref.family], it, c) for it, c in zip(items, outs, strict=True)])
    shown = ",".join(f"{k}={v:g}" for k, v in setting.items())
    return f"{model_name} {'+'.join(tasks)} {shown} | {' '.join(points)} | {time.perf_counter() - t0:.0f}s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-m")
    p.add_argument("--tasks", default="max,pos", help="comma-separated built-in families")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--grid", nargs="+", default=["warm=0", "warm=640"], help="settings, e.g. warm=640,lr=1e-3")
    args = p.parse_args()
    torch.set_num_threads(1)
    print("# held-out greedy accuracy / sampled reward (4 samples) at rounds 0 .. --rounds")
    for text in args.grid:
        print(run(args.model, args.tasks.split(","), parse_setting(text), args.rounds, args.seed), flush=True)


if __name__ == "__main__":
    main()
