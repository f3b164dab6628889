"""Supervised learning rate of the warm start: held-out accuracy of each built-in model per learning rate.

Trains each model from the shared initial weights on gold answers (Adam, batches of 128
training items, one thread) and prints its held-out greedy accuracy every fifth of the run::

    python bench/warm_lr.py --models tiny-s,tiny-m,tiny-l,tiny-gpt2 --lrs 1e-3,3e-3 --tasks max --steps 300

The warm start (node/training/warmstart.py) uses one learning rate for every built-in model;
this is how that rate is chosen: the highest at which every model still converges.
"""

from __future__ import annotations

import argparse
import time

import torch

from node.tasks.registry import TaskMix, build_task
from node.training.adapters import SHARED_BASE_SEED
from node.training.evaluate import EvalConfig, eval_sets, evaluate
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy

BATCH = 128


def run(model_name: str, tasks: list[str], lr: float, steps: int) -> str:
    """One line: held-out accuracy at 0, 1/5, ..., all of the steps, and the last batch's loss."""
    families = {n: build_task(n) for n in tasks}
    model, tok, mid = load_model(model_name, seed=SHARED_BASE_SEED, device="cpu")
    policy = Policy(model, tok, mid)
    mix, sets = TaskMix(list(families.values()), seed=1), eval_sets(families, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    points, loss, t0 = [], float("nan"), time.perf_counter()
    for step in range(steps + 1):
        if step % max(1, steps // 5) == 0 or step == steps:
            e = evaluate(policy, families, sets, GenerationConfig(max_new_tokens=1), EvalConfig(eval_samples=0))
            points.append(f"{step}:{e.accuracy:.2f}")
        if step == steps:
            break
        items = mix.sample(step + 1, BATCH)
        logp, _ = policy.token_logprobs([it.prompt for it in items], [it.answer for it in items])
        batch_loss = -logp.sum(-1).mean()
        optimizer.zero_grad()
        batch_loss.backward()
        optimizer.step()
        loss = float(batch_loss.item())
    took = time.perf_counter() - t0
    return f"{model_name} lr={lr:g} {'+'.join(tasks)} | {' '.join(points)} | loss {loss:.3f} | {took:.0f}s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-s,tiny-m,tiny-l,tiny-gpt2")
    p.add_argument("--lrs", default="1e-3,3e-3")
    p.add_argument("--tasks", default="max", help="comma-separated built-in families")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("# held-out greedy accuracy at steps 0 .. --steps")
    for name in args.models.split(","):
        for lr in args.lrs.split(","):
            print(run(name, args.tasks.split(","), float(lr), args.steps), flush=True)


if __name__ == "__main__":
    main()
