"""Built-in tiny causal LMs, and loading of local Hugging Face model folders.

The built-ins are defined from a transformers config in code (Llama and GPT-2,
so that architectures and fingerprints differ) and use the character tokenizer
of :mod:`node.tokenizer`; no file is downloaded. Their initial weights depend
only on the seed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from node.tokenizer import char_tokenizer

logger = logging.getLogger(__name__)

MAX_POSITIONS = 256
"""Context length of the built-in models (prompt + completion tokens)."""


class ModelNotFound(ValueError):
    """The model name is neither a built-in tiny model nor an existing local folder."""


def _llama(hidden: int, layers: int, heads: int, ffn: int) -> Callable[[int], PretrainedConfig]:
    def make(vocab: int) -> PretrainedConfig:
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=MAX_POSITIONS,
            tie_word_embeddings=False,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )

    return make


def _gpt2(hidden: int, layers: int, heads: int) -> Callable[[int], PretrainedConfig]:
    def make(vocab: int) -> PretrainedConfig:
        return GPT2Config(
            vocab_size=vocab,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=MAX_POSITIONS,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )

    return make


BUILTIN_MODELS: dict[str, Callable[[int], PretrainedConfig]] = {
    "tiny-s": _llama(hidden=64, layers=2, heads=4, ffn=128),  # ~95K parameters
    "tiny-m": _llama(hidden=128, layers=4, heads=4, ffn=256),  # ~0.68M
    "tiny-l": _llama(hidden=160, layers=6, heads=5, ffn=384),  # ~1.75M
    "tiny-gpt2": _gpt2(hidden=96, layers=3, heads=4),  # ~0.37M
}
"""Built-in model name -> config factory (argument: vocabulary size)."""

_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}


def builtin_config(name: str, vocab_size: int) -> PretrainedConfig:
    """The transformers config of a built-in model."""
    if name not in BUILTIN_MODELS:
        raise ModelNotFound(_not_found_message(name))
    return BUILTIN_MODELS[name](vocab_size)


def _not_found_message(name: str) -> str:
    valid = ", ".join(sorted(BUILTIN_MODELS))
    return f"Unknown model {name!r}: use a built-in model ({valid}) or the path of a local Hugging Face model folder."


def _build_builtin(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = char_tokenizer()
    config = builtin_config(name, len(tokenizer))
    cls = _MODEL_CLASSES[config.model_type]
    # Seed a forked RNG so that init is a function of `seed` alone and the
    # caller's global RNG state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model, tokenizer


def _load_folder(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def load_model(name_or_path: str, seed: int, device: str) -> tuple[Any, Any, str]:
    """Build a built-in tiny model or load a local HF model folder.

    Returns ``(model, tokenizer, model_id)``: the model (float32, eval mode, on
    ``device``), its tokenizer (left padding, a pad token set), and a short id
    naming the model (the built-in name, or the folder's base name). ``seed``
    sets the initial weights of a built-in model; a folder's weights are loaded
    as saved. Raises :class:`ModelNotFound` for anything else.
    """
    if name_or_path in BUILTIN_MODELS:
        model, tokenizer = _build_builtin(name_or_path, seed)
        model_id = name_or_path
    elif os.path.isdir(name_or_path):
        model, tokenizer = _load_folder(name_or_path)
        model_id = os.path.basename(os.path.normpath(os.path.abspath(name_or_path)))[:128] or "local-model"
    else:
        raise ModelNotFound(_not_found_message(name_or_path))
    model.to(device)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("loaded model %s (%s, %d parameters) on %s", model_id, model.config.model_type, n_params, device)
    return model, tokenizer, model_id
