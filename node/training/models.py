"""The model registry: built-in tiny causal LMs, packaged real LMs, and local HF folders.

``--model`` accepts three kinds of names:

- a built-in tiny model (``tiny-s``, ``tiny-m``, ``tiny-l``, ``tiny-gpt2``, ``tiny-bpe``):
  defined from a transformers config in code (Llama and GPT-2, so that
  architectures and fingerprints differ), with a tokenizer of
  :mod:`node.training.tokenizer` built in code: the character tokenizer, or for
  ``tiny-bpe`` a byte-pair encoding (so that a mixed swarm's receivers really
  re-tokenise the text they get); no file is downloaded and the initial weights depend
  only on the seed;
- a packaged model (``smollm2-135m``): shipped as a GGUF file in a pip
  package and converted once into a cache folder (see :mod:`node.training.model_cache`);
- the path of a local Hugging Face causal-LM folder (e.g. a Qwen2.5-0.5B you
  have on disk).

Weights are always float32 (the optimiser's master copy); the policy computes
in bfloat16 on a CUDA device that supports it (see :class:`node.training.policy.Policy`).
With ``--adapter lora`` the frozen base is then stored in bfloat16 (see :mod:`node.training.adapters`).
:func:`recommended_defaults` gives per-model generation and learning-rate
defaults that the CLI uses for flags the user did not pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from node.tasks.reasoning_gym import RG_TASK_NAMES
from node.training.model_cache import (
    PACKAGED_MODELS,
    ModelError,
    ModelPackageMissing,
    ensure_converted,
)
from node.training.names import model_name_error
from node.training.tokenizer import bpe_tokenizer, char_tokenizer

if TYPE_CHECKING:
    # transformers takes seconds to import (torch.distributed, its model code): a node imports it when it
    # builds or loads its model, after it listens, never at import
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

MAX_POSITIONS = 256
"""Context length of the built-in models (prompt + completion tokens)."""


__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_TOKENIZERS",
    "PACKAGED_MODELS",
    "ModelError",
    "ModelNotFound",
    "ModelPackageMissing",
    "NotACausalLM",
    "load_model",
    "recommended_defaults",
]


class ModelNotFound(ModelError):
    """The model name is neither a registry name nor an existing local folder."""


class NotACausalLM(ModelError):
    """A local folder that is not a Hugging Face causal language model with a tokenizer."""


def _llama(hidden: int, layers: int, heads: int, ffn: int) -> Callable[[int], PretrainedConfig]:
    def make(vocab: int) -> PretrainedConfig:
        from transformers import LlamaConfig

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
        from transformers import GPT2Config

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
    "tiny-bpe": _llama(hidden=96, layers=3, heads=4, ffn=192),  # ~0.35M, 384 BPE tokens
}
"""Built-in model name -> config factory (argument: vocabulary size)."""

BUILTIN_TOKENIZERS: dict[str, Callable[[], PreTrainedTokenizerFast]] = {"tiny-bpe": bpe_tokenizer}
"""A built-in model's tokenizer, where it is not :func:`~node.training.tokenizer.char_tokenizer`."""


def builtin_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The tokenizer a built-in model is built with: it follows the model's name."""
    return BUILTIN_TOKENIZERS.get(name, char_tokenizer)()


def builtin_config(name: str, vocab_size: int) -> PretrainedConfig:
    """The transformers config of a built-in model."""
    if name not in BUILTIN_MODELS:
        raise ModelNotFound(_not_found_message(name))
    return BUILTIN_MODELS[name](vocab_size)


def _not_found_message(name: str) -> str:
    return model_name_error(name) or f"--model {name}: unknown model"


def _model_class(model_type: str) -> type[PreTrainedModel]:
    """A built-in's model class; only its own architecture's code is imported."""
    cls: type[PreTrainedModel]
    if model_type == "gpt2":
        from transformers import GPT2LMHeadModel

        cls = GPT2LMHeadModel
    else:
        from transformers import LlamaForCausalLM

        cls = LlamaForCausalLM
    return cls


def _build_builtin(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = builtin_tokenizer(name)
    config = builtin_config(name, len(tokenizer))
    cls = _model_class(config.model_type)
    # Seed a forked RNG so that init is a function of `seed` alone and the
    # caller's global RNG state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model, tokenizer


def _load_folder(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local causal-LM folder (float32) and its tokenizer; :class:`NotACausalLM` otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    shown = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise NotACausalLM(f"{shown} is not a Hugging Face model folder (it has no config.json).")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise NotACausalLM(f"{shown} has a config.json that transformers cannot read ({_first_line(e)}).") from e
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise NotACausalLM(f"{shown} holds a {config.model_type!r} model, not a causal language model.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise NotACausalLM(f"{shown} could not be loaded as a causal LM with its tokenizer ({_first_line(e)}).") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def import_model_code() -> None:
    """Import the transformers code that building or loading a model runs (a node does so after it listens).

    For a fork server: its children then share this code instead of each importing it.
    """
    from transformers import (  # noqa: F401
        AutoModelForCausalLM,
        AutoTokenizer,
        GPT2LMHeadModel,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )


def check_model_name(name_or_path: str) -> None:
    """Raise :class:`ModelNotFound` or :class:`NotACausalLM` if ``name_or_path`` names no model or folder.

    Reads nothing and converts nothing: a node checks its ``--model`` before it joins the swarm and
    loads the model after.
    """
    problem = model_name_error(name_or_path)
    if problem is None:
        return
    raise (NotACausalLM if os.path.exists(name_or_path) else ModelNotFound)(problem)


def resolve_model_path(name_or_path: str, cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The folder a non-built-in model loads from (converting a packaged model once); None for built-ins."""
    check_model_name(name_or_path)
    if name_or_path in BUILTIN_MODELS:
        return None
    if name_or_path in PACKAGED_MODELS:
        return str(ensure_converted(PACKAGED_MODELS[name_or_path], cache_dir))
    return name_or_path


def load_model(
    name_or_path: str, seed: int, device: str, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Any, str]:
    """Build a built-in tiny model, or load a packaged model or a local HF causal-LM folder.

    Returns ``(model, tokenizer, model_id)``: the model (float32, eval mode, on
    ``device``), its tokenizer (left padding, a pad token set), and a short id
    naming the model (the registry name, or the folder's base name). ``seed``
    sets the initial weights of a built-in model; other weights are loaded as
    saved. ``cache_dir`` is where packaged models are converted (default
    ``~/.cache/swarm-node/models``). Raises a :class:`ModelError` subclass
    (:class:`ModelNotFound`, :class:`NotACausalLM`, :class:`ModelPackageMissing`).
    """
    path = resolve_model_path(name_or_path, cache_dir)
    if path is None:
        model, tokenizer = _build_builtin(name_or_path, seed)
        model_id = name_or_path
    else:
        model, tokenizer = _load_folder(path)
        if name_or_path in PACKAGED_MODELS:
            model_id = name_or_path
        else:
            model_id = os.path.basename(os.path.normpath(os.path.abspath(path)))[:128] or "local-model"
    model.to(device)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("loaded model %s (%s, %d parameters) on %s", model_id, model.config.model_type, n_params, device)
    return model, tokenizer, model_id


@dataclass(frozen=True)
class ModelDefaults:
    """Per-model defaults for the settings that depend on the model; the CLI uses them for flags not given."""

    max_new_tokens: int
    learning_rate: float
    micro_batch_size: int
    # Low-rank adapters start at zero and have few parameters: at full fine-tuning's rate they barely move
    # in a run of a few hundred rounds. About 10x is the usual LoRA rule (also for RL).
    adapter_learning_rate: float = 0.0
    # the task families a node trains on when no --task is given: where this model gets a learning signal
    # (a family it never or always solves gives GRPO nothing); empty: the tiny built-ins
    tasks: tuple[str, ...] = ()
    # rounds between held-out evaluations when --eval-every is not given (0: off): on where an evaluation
    # costs a few rounds (the tiny built-ins), off for a real LM, whose evaluation takes minutes on a CPU
    eval_every: int = 0

    def lr(self, adapter: str) -> float:
        """The learning rate for training every weight (``adapter="none"``) or an adapter."""
        return self.learning_rate if adapter == "none" or not self.adapter_learning_rate else self.adapter_learning_rate


TINY_EVAL_EVERY = 200
"""Rounds between a tiny model's held-out evaluations by default. In a 4-node local swarm on a 2-core CPU one
evaluation of max and min (128 questions, greedy and 8 samples each) took the time of 5-10 of the node's rounds
(medians 0.7 s for tiny-s, 3.4 s for tiny-l, against rounds of 0.13 and 0.42 s); it grows with the questions,
2.5x for the five built-in families' 326. Every 200 rounds that is 2-13% of the run, for a held-out trend on
the dashboard."""

TINY_DEFAULTS = ModelDefaults(max_new_tokens=1, learning_rate=1e-3, micro_batch_size=64, eval_every=TINY_EVAL_EVERY)
"""Built-in tiny models: one-token answers, a large learning rate (also the component dataclasses' defaults).

Every built-in family's answer is one character, and each character is one token in both built-in tokenizers
(``tiny-bpe``'s merges only add longer tokens), so one token is room for any answer for ``tiny-bpe`` too: a
merged token such as ``94`` is a wrong answer that GRPO learns away, as a wrong digit is."""

REAL_LM_DEFAULTS = ModelDefaults(
    max_new_tokens=64, learning_rate=1e-6, micro_batch_size=8, adapter_learning_rate=1e-5, tasks=RG_TASK_NAMES
)
"""A pretrained LM folder: room for a short answer, a small learning rate, small micro-batches, every
reasoning-gym family (its signal per family is unknown: measure it with bench/bench_signal.py)."""

PACKAGED_DEFAULTS: dict[str, ModelDefaults] = {
    # 135M parameters on a CPU: short completions keep a round near a minute; 2e-6 moves the
    # weights measurably within a few rounds without wrecking the instruct model.
    # Tasks: the reasoning-gym families where it succeeds at all with the node's prompt, at their default
    # (easiest measured) levels: bench/bench_signal.py, 0.17, 0.08 and 0.06 success per completion, 25-56%
    # of groups informative; every other family 0-0.03.
    "smollm2-135m": ModelDefaults(
        max_new_tokens=32,
        learning_rate=2e-6,
        micro_batch_size=8,
        adapter_learning_rate=2e-5,
        tasks=("rg:basic_arithmetic", "rg:products", "rg:chain_sum"),
    ),
}


def recommended_defaults(name_or_path: str) -> ModelDefaults:
    """Recommended ``max_new_tokens``, learning rates, ``micro_batch_size`` and tasks for a model.

    The CLI applies them only to flags the user did not pass.

    >>> recommended_defaults("tiny-s").max_new_tokens, recommended_defaults("smollm2-135m").max_new_tokens
    (1, 32)
    """
    if name_or_path in BUILTIN_MODELS:
        return TINY_DEFAULTS
    return PACKAGED_DEFAULTS.get(name_or_path, REAL_LM_DEFAULTS)
