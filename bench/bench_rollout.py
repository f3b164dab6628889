"""Rollout speed of a real LM against the machine's floors: the node's sampler, the previous one, HF ``generate``.

Prints, measured side by side in one process, for SmolLM2-135M with every weight and with a LoRA
adapter (the node's default r = 16), at each batch of rows and each number of new tokens:

- tokens per second and milliseconds per decode step of: the previous sampler (one prefill per row,
  ``torch.multinomial``, float32: :func:`previous_sample`, kept here as the reference), HF
  ``model.generate(do_sample=True)``, and the node's sampler (:mod:`node.training.sampler`) in float32
  and at ``--sample-precision auto``;
- the floors of one decode step, measured on this machine first: memory (the sampling weights' bytes
  at the bandwidth a large matrix-vector product reaches) and compute (2 x matmul parameters x rows at
  the rate of a large product, float32 and bf16); the done-when bound of issue 56 is
  ``max(2 x memory floor, 3 x compute floor)`` at the machine's best dtype;
- one training pass (forward and backward over the rows' prompt + completion) in tokens per second
  against its compute floor (6 x parameters x tokens with every weight, 4 x with an adapter), with
  one prompt pass per row and one per group of rows that share it;
- a round of the node's default shape (4 prompts x 4 completions, 32 tokens, eos allowed): the
  previous sampler, its scoring pass for the behaviour log-probabilities and a training pass with one
  prompt pass per row, against the node's sampler, the scoring of the completions it has no claim for
  and a training pass with one prompt pass per group (:meth:`Policy.token_logprobs`).

Rows run to their full length (eos is never drawn) except in the round, so tokens per second compare.

    .venv/bin/python bench/bench_rollout.py --threads 1 --cells 8x32,32x32,64x32,32x128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from node.tasks.heldout import eval_items
from node.tasks.registry import build_task
from node.training.adapters import AdapterConfig, attach_adapter
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy

GROUP = 8
"""Completions per prompt in the decode cells (the node's default ``--generations``)."""

NEVER = -1
"""An eos id no row draws: every row runs its full length."""


def timed(fn: Callable[[], Any], repeat: int = 1, warm: bool = True) -> float:
    """The median seconds of ``repeat`` calls of ``fn`` (after one untimed call, with ``warm``)."""
    if warm:
        fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def machine_floors() -> dict[str, float]:
    """Bandwidth (GB/s) of a large matrix-vector product; GFLOP/s of a large product, float32 and bf16."""
    w = torch.randn(8192, 8192)
    v = torch.randn(8192)
    bandwidth = w.numel() * 4 / timed(lambda: w @ v, 5) / 1e9
    rates = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a, b = torch.randn(512, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)

        def product(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return a @ b

        rates[name] = 2 * 512 * 576 * 1536 / timed(product, 20) / 1e9
    return {"bandwidth_gb_s": bandwidth, "gflops_float32": rates["float32"], "gflops_bfloat16": rates["bfloat16"]}


def matmul_params(model: Any) -> int:
    """Parameters that multiply every token: all but an input embedding that is not also the output layer."""
    total = int(sum(p.numel() for p in model.parameters()))
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.weight.data_ptr()
    return total if tied else total - int(emb.weight.numel())


@torch.no_grad()
def previous_sample(policy: Policy, prompts: list[str], n: int, cfg: GenerationConfig, seed: int) -> list[str]:
    """The sampler the node had before :mod:`node.training.sampler`: every row prefilled, multinomial draws."""
    gen = torch.Generator().manual_seed(seed)
    rows = [ids for ids in (policy.encode_prompt(p) for p in prompts) for _ in range(n)]
    ids, mask = policy._pad(rows, left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = torch.full((len(rows), cfg.max_new_tokens), policy.pad_id, dtype=torch.long)
    done = torch.zeros(len(rows), dtype=torch.bool)
    past = None
    for step in range(cfg.max_new_tokens):
        res = policy.model(
            input_ids=ids, attention_mask=mask, position_ids=positions,
            past_key_values=past, use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        logits = res.logits[:, -1, :].float()
        logits[:, policy._banned] = float("-inf")
        logits[:, policy.vocab_size :] = float("-inf")
        probs = torch.softmax(logits / max(cfg.temperature, 1e-6), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1).masked_fill(done, policy.pad_id)
        out[:, step] = nxt
        done |= nxt == policy.eos_id
        if bool(done.all()):
            break
        past, ids = res.past_key_values, nxt[:, None]
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
    texts = []
    for row in out.tolist():
        cut = row.index(policy.eos_id) if policy.eos_id in row else len(row)
        texts.append(policy.tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts


@torch.no_grad()
def hf_generate(policy: Policy, prompts: list[str], n: int, tokens: int) -> None:
    """transformers' own sampling loop over the same rows, every row ``tokens`` long."""
    rows = [ids for ids in (policy.encode_prompt(p) for p in prompts) for _ in range(n)]
    ids, mask = policy._pad(rows, left=True)
    policy.model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=tokens, min_new_tokens=tokens,
        pad_token_id=policy.pad_id, top_k=0,
    )  # fmt: skip


def load(adapter: str) -> Policy:
    model, tokenizer, model_id = load_model("smollm2-135m", 0, "cpu")
    if adapter == "lora":
        model = attach_adapter(model, AdapterConfig(adapter="lora"), seed=0)
    return Policy(model, tokenizer, model_id, "cpu")


def decode_rows(
    policy: Policy, floors: dict[str, float], batch: int, tokens: int, prompts: list[str]
) -> dict[str, Any]:
    """One (batch, tokens) cell: every sampler's seconds, and the floors of one step."""
    n = min(GROUP, batch)  # the node's default G: each prompt's rows share its prefill
    ps = prompts[: max(1, batch // n)]
    rows = len(ps) * n
    cfg = {p: GenerationConfig(max_new_tokens=tokens, sample_precision=p) for p in ("float32", "auto")}
    eos, policy.eos_id = policy.eos_id, NEVER
    try:
        # a short call of each first (allocation, the bf16 copy's build), then one timed call each
        short = GenerationConfig(max_new_tokens=2, sample_precision="auto")
        previous_sample(policy, ps, n, short, 1)
        hf_generate(policy, ps, n, 2)
        policy.sample(ps, n, short, 1)
        secs = {
            "previous": timed(lambda: previous_sample(policy, ps, n, cfg["float32"], 1), warm=False),
            "hf_generate": timed(lambda: hf_generate(policy, ps, n, tokens), warm=False),
            "node_float32": timed(lambda: policy.sample(ps, n, cfg["float32"], 1), warm=False),
            "node_auto": timed(lambda: policy.sample(ps, n, cfg["auto"], 1), warm=False),
        }
    finally:
        policy.eos_id = eos
    weights = matmul_params(policy.model)
    best = max(floors["gflops_float32"], floors["gflops_bfloat16"])
    memory_ms = 2 * weights / floors["bandwidth_gb_s"] / 1e6  # bf16 bytes: the smaller of the two floors
    compute_ms = 2 * weights * rows / best / 1e6
    bound_ms = max(2 * memory_ms, 3 * compute_ms)
    step_ms = {k: 1000 * v / tokens for k, v in secs.items()}
    return {
        "rows": rows, "tokens": tokens, "tokens_per_s": {k: rows * tokens / v for k, v in secs.items()},
        "step_ms": step_ms, "memory_floor_ms": memory_ms, "compute_floor_ms": compute_ms, "bound_ms": bound_ms,
        "node_auto_over_bound": step_ms["node_auto"] / bound_ms,
    }  # fmt: skip


def train_step(policy: Policy, floors: dict[str, float], rows: int, tokens: int, prompts: list[str]) -> dict[str, Any]:
    """Forward and backward over ``rows`` completions of up to ``tokens`` tokens, prompts passed per row and
    per group: seconds, and tokens per second of the tokens a per-row pass computes, against its floor."""
    texts = policy.generate(prompts, max(1, rows // len(prompts)), GenerationConfig(max_new_tokens=tokens), seed=2)
    ps = [p for p, row in zip(prompts, texts, strict=True) for _ in row]
    cs = [c for row in texts for c in row]

    def step() -> None:
        logp, mask = policy.token_logprobs(ps, cs)
        (logp.sum() / mask.sum()).backward()

    seconds = {}
    policy.model.train()
    try:
        for shared in (False, True):
            policy.share_prefill = shared
            before = policy.meter.scored
            seconds[shared] = timed(step)
            if not shared:
                seen = (policy.meter.scored - before) // 2
    finally:
        policy.share_prefill = True
        policy.model.eval()
        policy.model.zero_grad(set_to_none=True)
    adapted = any(not p.requires_grad for p in policy.model.parameters())
    floor_s = (4 if adapted else 6) * matmul_params(policy.model) * seen / floors["gflops_float32"] / 1e9
    return {
        "rows": len(cs), "tokens": seen, "per_row_s": seconds[False], "per_group_s": seconds[True],
        "tokens_per_s": seen / seconds[True], "per_row_over_floor": seconds[False] / floor_s,
        "per_group_over_floor": seconds[True] / floor_s,
    }  # fmt: skip


def round_shape(policy: Policy, prompts: list[str]) -> dict[str, float]:
    """A round of the node's default shape, before and now: sampling 4 prompts x 4 completions (32 tokens,
    eos allowed), the behaviour log-probabilities, and one training pass (forward and backward) over all 16
    rows, as when every group has signal."""
    ps, n = prompts[:4], 4
    cfg = GenerationConfig(max_new_tokens=32, sample_precision="auto")

    def train(texts: list[str]) -> None:
        policy.model.train()
        try:
            logp, mask = policy.token_logprobs([p for p in ps for _ in range(n)], texts)
            (logp.sum() / mask.sum()).backward()
        finally:
            policy.model.eval()
            policy.model.zero_grad(set_to_none=True)

    def previous() -> None:
        texts = previous_sample(policy, ps, n, GenerationConfig(max_new_tokens=32), 3)
        policy.sequence_logprobs([p for p in ps for _ in range(n)], texts, batch_rows=16)
        policy.share_prefill = False
        try:
            train(texts)
        finally:
            policy.share_prefill = True

    def now() -> None:
        out = policy.sample(ps, n, cfg, 3, claims=True)
        missing = [(p, c.text) for p, row in zip(ps, out, strict=True) for c in row if c.logprob is None]
        if missing:
            policy.sequence_logprobs([m[0] for m in missing], [m[1] for m in missing], batch_rows=16)
        train([c.text for row in out for c in row])

    before, after = timed(previous, 2), timed(now, 2)
    return {"previous_s": before, "node_s": after, "speedup": before / after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the node's --max-threads)")
    ap.add_argument(
        "--cells", default="8x32,32x32,64x32,32x128", help="rows x new tokens of each decode cell, comma-separated"
    )
    ap.add_argument("--adapters", default="none,lora", help="none (every weight) and/or lora")
    ap.add_argument("--json", default="", help="also write every figure to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    floors = machine_floors()
    print(f"floors: {json.dumps({k: round(v, 1) for k, v in floors.items()})} ({args.threads} thread(s))")
    prompts = [it.prompt for it in eval_items(build_task("rg:basic_arithmetic"), 16)]
    results: dict[str, Any] = {"floors": floors, "threads": args.threads}
    for adapter in args.adapters.split(","):
        policy = load(adapter)
        cells = []
        for batch, tokens in (tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")):
            cell = decode_rows(policy, floors, batch, tokens, prompts)
            cells.append(cell)
            tps = "  ".join(f"{k} {v:7.1f}" for k, v in cell["tokens_per_s"].items())
            print(
                f"{adapter:4s} rows {cell['rows']:3d} x {tokens:3d} tokens | tokens/s: {tps} | step ms: node "
                f"{cell['step_ms']['node_auto']:.0f}, bound {cell['bound_ms']:.0f} (memory floor "
                f"{cell['memory_floor_ms']:.0f}, compute {cell['compute_floor_ms']:.0f}): "
                f"{cell['node_auto_over_bound']:.2f}x the bound",
                flush=True,
            )
        train = train_step(policy, floors, 16, 32, prompts[:4])
        print(f"{adapter:4s} train pass, {train['rows']} rows, {train['tokens']} tokens: prompt per row "
              f"{train['per_row_s']:.2f} s ({train['per_row_over_floor']:.2f}x its float32 compute floor), per group "
              f"{train['per_group_s']:.2f} s ({train['per_group_over_floor']:.2f}x)", flush=True)  # fmt: skip
        shape = round_shape(policy, prompts)
        print(f"{adapter:4s} round (4 x 4, 32 tokens, sample + claims + train): previous "
              f"{shape['previous_s']:.2f} s, node {shape['node_s']:.2f} s: {shape['speedup']:.2f}x",
              flush=True)  # fmt: skip
        results[adapter] = {"decode": cells, "train": train, "round": shape}
        del policy
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
