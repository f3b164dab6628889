"""Write a local HF folder holding a model of a known architecture's shape with random weights.

No hub is reachable here, so a model "shaped like" Qwen2.5-0.5B (same config: 24 layers, hidden 896,
14 heads / 2 KV heads, MLP 4864, a 151,936-row tied embedding; 494M parameters) is built from its
config with random float32 weights, beside SmolLM2's tokenizer (from the packaged model; its ids fit
the larger vocabulary, and the policy never samples an id past the tokenizer's). Memory and speed
depend on the shapes, not on the weights' values, so it measures what a volunteer's node needs.

    .venv/bin/python bench/make_shaped_model.py --shape qwen2.5-0.5b --out /tmp/qwen-shape
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
}  # fmt: skip
"""Published configs (architecture only) of the shapes this can build."""


def build(shape: str, out: Path, seed: int = 0) -> int:
    """Write the folder; returns the parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from node.training.models import load_model

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape]))
    _, tokenizer, _ = load_model("smollm2-135m", seed=0, device="cpu")
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    print(f"{args.shape}: {build(args.shape, args.out):,} parameters written to {args.out}")


if __name__ == "__main__":
    main()
