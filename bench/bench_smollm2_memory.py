"""Round time and memory of one real-LM node over many rounds (CPU): full fine-tuning or an adapter.

Runs ``swarm-node start --model smollm2-135m`` as a subprocess on reasoning-gym
tasks and samples the node process's resident memory (``VmRSS``) and its peak
(``VmHWM``) from ``/proc`` whenever a round event is written, so the numbers
are those of the real program, not of a test harness. Prints one line per
round and a JSON summary; a steady RSS after the first rounds means no leak.

    .venv/bin/python bench/bench_smollm2_memory.py --rounds 24 --threads 2

``--train-every-round`` runs the model side in-process and trains every round (rewards alternate
1/0), so the peak holds gradients and optimiser state every time; ``--adapter lora`` trains a LoRA
adapter on the frozen base instead of every weight; ``--model`` takes ``smollm2-135m`` or a local
HF folder (e.g. one written by ``bench/make_shaped_model.py``: a Qwen2.5-0.5B-shaped model with
random weights, since no hub is reachable here).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node.observe.metrics import read_events

logger = logging.getLogger(__name__)

TASKS = ("rg:chain_sum", "rg:basic_arithmetic")  # the families SmolLM2-135M sometimes solves: rounds train


def proc_memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB, read from /proc (Linux)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def node_command(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The command line of the measured node."""
    cmd = [sys.executable, "-m", "node", "start", "--model", args.model, "--rounds", str(args.rounds)]
    cmd += ["--adapter", args.adapter, "--micro-batch", str(args.micro_batch)]
    if args.gradient_checkpointing:
        cmd.append("--gradient-checkpointing")
    cmd += ["--local", str(args.local), "--generations", str(args.generations), "--external", "0"]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--max-threads", str(args.threads)]
    cmd += ["--identity", str(tmp / "id.key"), "--log-dir", str(tmp / "runs"), "--host-port", "127.0.0.1:0"]
    for task in TASKS:
        cmd += ["--task", task]
    return cmd


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the node to completion and record memory at every round."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.monotonic()
        proc = subprocess.Popen(node_command(args, tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows: list[dict[str, Any]] = []
        try:
            while proc.poll() is None and len(rows) < args.rounds:
                time.sleep(0.2)
                files = list((tmp / "runs").glob("*/metrics.jsonl"))
                rounds = list(read_events(files[0], "round")) if files else []
                for r in rounds[len(rows) :]:
                    rss, hwm = proc_memory_mb(proc.pid)
                    keys = ("round", "round_s", "reward_mean", "trained_groups")
                    rows.append({**{k: r[k] for k in keys}, "rss_mb": round(rss), "peak_mb": round(hwm)})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(120)
        return summarise(rows, time.monotonic() - t0)


def summarise(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Median round time, peak RSS, and RSS growth from the first quarter of rounds to the last."""
    if not rows:
        return {"rounds": 0}
    times = sorted(r["round_s"] for r in rows)
    q = max(1, len(rows) // 4)
    early = sum(r["rss_mb"] for r in rows[q : 2 * q]) / q
    late = sum(r["rss_mb"] for r in rows[-q:]) / q
    return {
        "rounds": len(rows),
        "rounds_that_trained": sum(1 for r in rows if r["trained_groups"] > 0),
        "median_round_s": round(times[len(times) // 2], 1),
        "peak_rss_mb": round(max(r["peak_mb"] for r in rows)),
        "rss_first_round_mb": round(rows[0]["rss_mb"]),
        "rss_second_quarter_mb": round(early),
        "rss_last_quarter_mb": round(late),
        "wall_s": round(wall_s),
    }


def main() -> None:
    """Parse flags, measure, print the summary as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--local", type=int, default=2, help="questions per round")
    p.add_argument("--generations", type=int, default=4, help="completions per question")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-every-round", action="store_true", help="in-process loop that trains every round")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m or a local HF model folder")
    p.add_argument("--adapter", default="none", choices=("none", "lora"), help="train every weight or a LoRA adapter")
    p.add_argument("--lr", type=float, default=2e-6, help="learning rate (in-process loop)")
    p.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward pass")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    args = p.parse_args()
    if args.train_every_round:
        summary = train_loop(args)
        print(json.dumps({"summary": summary}), flush=True)
        return
    print(json.dumps({"summary": measure(args)}), flush=True)


def train_loop(args: argparse.Namespace) -> dict[str, Any]:
    """In-process: generate, then always train (rewards alternate 1/0), printing RSS after each round.

    Isolates the model side (sampling, GRPO step, AdamW state) from rewards: every round trains.
    """
    import os

    import torch

    from node.tasks.registry import build_task
    from node.tasks.verify import TrainGroup
    from node.training.adapters import AdapterConfig, attach_adapter
    from node.training.grpo import GRPOConfig, GRPOTrainer
    from node.training.models import load_model
    from node.training.policy import GenerationConfig, Policy

    torch.set_num_threads(args.threads)
    t_start = time.monotonic()
    model, tok, mid = load_model(args.model, seed=0, device="cpu")
    if args.adapter != "none":
        model = attach_adapter(model, AdapterConfig(adapter=args.adapter), seed=0)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    policy = Policy(model, tok, mid)
    grpo = GRPOConfig(args.lr, micro_batch_size=args.micro_batch, gradient_checkpointing=args.gradient_checkpointing)
    trainer = GRPOTrainer(policy, grpo)
    fam, g = build_task("rg:chain_sum"), args.generations
    rows: list[dict[str, Any]] = []
    for r in range(1, args.rounds + 1):
        t0 = time.monotonic()
        items = [fam.item(0, r * 1000 + i) for i in range(args.local)]
        gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
        comps = policy.generate([it.prompt for it in items], g, gen, seed=r)
        rewards = tuple(float(i % 2) for i in range(g))
        groups = [
            TrainGroup(it.prompt, tuple(c), rewards, "self", fam.name, it.ref)
            for it, c in zip(items, comps, strict=True)
        ]
        stats = trainer.step(groups)
        rss, hwm = proc_memory_mb(os.getpid())
        row = {"round": r, "round_s": round(time.monotonic() - t0, 1), "trained_groups": stats["n_groups"]}
        rows.append({**row, "rss_mb": round(rss), "peak_mb": round(hwm), "reward_mean": 0.5})
        print(json.dumps(rows[-1]), flush=True)
    params = sum(p.numel() for p in model.parameters())
    return {"model": mid, "adapter": args.adapter, "params": params, "trainable": trainable,
            "micro_batch": args.micro_batch, "gradient_checkpointing": args.gradient_checkpointing,
            **summarise(rows, time.monotonic() - t_start)}  # fmt: skip


if __name__ == "__main__":
    main()
