"""Train one tiny policy alone with GRPO on a built-in task family and print its reward per round.

No network, no peers: this is the "8/0" baseline of SAPO (all groups local).
Copy it as a starting point for research code::

    python examples/train_alone.py --task max --rounds 150
    python examples/train_alone.py --task pos --model tiny-gpt2 --rounds 200 --quiet

Each round samples ``--prompts`` questions, ``--gens`` completions each, scores
them with the task's verifier and takes one GRPO step. At the end a greedy
evaluation on held-out items is printed twice: with the training budget of
new tokens, and with ``--eval-tokens`` (there the policy must also have
learned to stop, i.e. to emit eos right after the answer).

A from-scratch character model succeeds by chance only if one token suffices
(a correct digit is ~1/100 per try; a digit *and* eos ~1/10000), hence
``--max-new-tokens 1``: the answer is then scored exactly and eos is still
trained, because the policy appends eos to every completion it scores.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from node.tasks.heldout import eval_items
from node.tasks.registry import BUILTIN_TASKS, TaskFamily, TaskMix, build_task
from node.tasks.verify import local_group
from node.training.grpo import GRPOConfig, GRPOTrainer
from node.training.models import BUILTIN_MODELS, load_model
from node.training.policy import GenerationConfig, Policy

logger = logging.getLogger(__name__)


def evaluate(policy: Policy, family: TaskFamily, n: int, max_new_tokens: int) -> float:
    """Greedy accuracy on ``n`` held-out items (prompts no training stream draws: node.tasks.heldout)."""
    items = eval_items(family, n)
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    outs = policy.generate([it.prompt for it in items], 1, cfg, seed=0)
    return sum(family.score(it, o[0]) for it, o in zip(items, outs, strict=True)) / len(items)


def train(args: argparse.Namespace) -> list[float]:
    """Run the rounds; returns the mean reward of each round."""
    torch.set_num_threads(args.threads)
    model, tokenizer, model_id = load_model(args.model, seed=args.seed, device="cpu")
    policy = Policy(model, tokenizer, model_id)
    trainer = GRPOTrainer(policy, GRPOConfig(learning_rate=args.lr, loss_type=args.loss_type))
    family = build_task(args.task, {"digits": args.digits} if args.digits else None)
    mix = TaskMix([family], seed=args.seed)
    gen_cfg = GenerationConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# {model_id} ({n_params} params) on {family.name} {family.config}, {args.prompts}x{args.gens}/round")
    curve: list[float] = []
    t_start = time.perf_counter()
    for rnd in range(args.rounds):
        t0 = time.perf_counter()
        items = mix.sample(rnd, args.prompts)
        outs = policy.generate([it.prompt for it in items], args.gens, gen_cfg, seed=args.seed * 1_000_003 + rnd)
        groups = [local_group(family, it, comps) for it, comps in zip(items, outs, strict=True)]
        stats = trainer.step(groups)
        curve.append(stats["mean_reward"])
        if not args.quiet:
            print(
                f"round {rnd:4d} reward {stats['mean_reward']:.3f} kept {stats['n_groups']}/{len(groups)} "
                f"clip {stats['clip_frac']:.3f} gnorm {stats['grad_norm']:.2f} {time.perf_counter() - t0:.3f}s"
            )
    elapsed = time.perf_counter() - t_start
    k = max(1, min(10, args.rounds // 5))
    acc = evaluate(policy, family, args.eval_items, args.max_new_tokens)
    acc_stop = evaluate(policy, family, args.eval_items, args.eval_tokens)
    print(
        f"# reward first {k} rounds {sum(curve[:k]) / k:.3f}, last {k} rounds {sum(curve[-k:]) / k:.3f}; "
        f"greedy eval {acc:.3f} ({args.max_new_tokens} tokens), {acc_stop:.3f} ({args.eval_tokens} tokens); "
        f"{elapsed:.1f}s total, {elapsed / args.rounds * 1000:.0f} ms/round"
    )
    return curve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-s", help=f"built-in ({', '.join(BUILTIN_MODELS)}) or a folder")
    p.add_argument("--task", default="max", choices=sorted(BUILTIN_TASKS))
    p.add_argument("--digits", type=int, default=0, help="task 'digits' config (0: the family's default)")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--prompts", type=int, default=8, help="questions per round")
    p.add_argument("--gens", type=int, default=8, help="completions per question (G)")
    p.add_argument("--max-new-tokens", type=int, default=1, help="1 suits a from-scratch model (see README)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--loss-type", default="bnpo", choices=["grpo", "bnpo", "dr_grpo"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-items", type=int, default=200)
    p.add_argument("--eval-tokens", type=int, default=4, help="new tokens allowed in the greedy evaluation")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    train(parse_args())
